"""`run.py evaluate`: translate a test set from a checkpoint and score it, honestly; or, with
`--hypotheses`, score translations made elsewhere with the very same metrics.

Two BLEU numbers, clearly labelled: sacreBLEU on the raw detokenized references (with its
signature, comparable across papers that report sacreBLEU), and the paper-comparable
tokenized, compound-split BLEU of tensor2tensor's get_ende_bleu.sh (what Vaswani et
al. report). For data that is tokenized already (`evaluate.bleu="tokenized"`, e.g.
Multi30k's lc.norm.tok files) the paper-comparable BLEU is multi-bleu.perl on the text as
it is, what results on such data report. Beside them sacreBLEU's chrF and chrF++, each
with its signature. Hypotheses and the JSON report are written to WORKDIR/eval/.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh

from transformer_mt.data import sources as data_sources
from transformer_mt.data import text_files
from transformer_mt.decoding.loading import load_translator
from transformer_mt.evaluation import corpus_scores as evaluation
from transformer_mt.runtime import errors
from transformer_mt.workdir import checkpointing


def bleu_language(config, target_code: str | None = None) -> str:
  """The target language BLEU tokenizes for: data.target_lang, else the language part of a
  multilingual model's target code (de_DE -> de; NLLB's deu_Latn -> deu)."""
  code = target_code or config.data.target_code or ""
  return config.data.target_lang or code.split("_")[0] or "en"


def evaluate(
  workdir: str | Sequence[str],
  split: str = "test",
  step: int | None = None,
  beam_size: int | None = None,
  alpha: float | None = None,
  source_file: str | None = None,
  reference_file: str | None = None,
  limit: int | None = None,
  mesh: Mesh | None = None,
  source_lang: str | None = None,
  target_lang: str | None = None,
  bleu: str | None = None,
  decode_overrides: Sequence[str] = (),
) -> dict[str, Any]:
  """Translates the experiment's `split` (or the given files) and writes the BLEU and chrF
  report (the keys of `evaluation.bleu_report`, then the run's settings and speed).

  Args:
    workdir: a training workdir or an averaged checkpoint directory; several make an
      ensemble (`loading.load_translator`), evaluated on the first one's split and
      written to the first one's eval/ directory, the report listing every member.
    source_file, reference_file: evaluate on these line-aligned files instead of `split`.
    limit: only the first `limit` sentences (for quick checks; the report says so).
    mesh: the devices to decode on (default: every device on the data axis).
    source_lang, target_lang: language codes of a multilingual import (default: its config's).
    bleu: "sacrebleu" or "tokenized" (default: the checkpoint's `evaluate.bleu`).
    decode_overrides: "decode.KEY=VALUE" settings on top of the checkpoint's decode section
      (`loading.load_translator`); named in the report and its file name.

  Returns:
    The report as written to WORKDIR/eval/SPLIT-stepN-beamB-alphaA[-firstL].json (the
    translations beside it, .txt), with "report_path" added.

  Raises:
    ValueError: only one of the two files, an imported model without files, a split the
      data lacks, or a missing, unreadable or misaligned file (text_files.DataError).
    FileNotFoundError: a workdir without checkpoints.
  """
  workdirs = [workdir] if isinstance(workdir, str) else list(workdir)
  config, _, step = checkpointing.read_config(workdirs[0], step)
  if source_file or reference_file:
    if not (source_file and reference_file):
      raise errors.BadValue(
        "Pass both --source and --reference, or neither (to use the config's split)."
      )
    pairs = text_files.read_parallel(source_file, reference_file)
    name = os.path.basename(source_file)
  else:
    if config.data.source == "none":  # an imported model (run.py import)
      raise errors.BadValue(
        f"{workdir} holds an imported model, with no data splits of its own: pass --source "
        "and --reference."
      )
    splits = data_sources.load_pairs(config.data, require_train=False)
    if split not in splits:
      raise errors.BadValue(
        f"The experiment's data has no {split!r} split (it has {sorted(splits)}); "
        "pass --split or --source/--reference."
      )
    pairs, name = splits[split], split
  pairs = list(pairs[:limit] if limit else pairs)
  translator = load_translator(
    workdirs,
    step,
    mesh,
    beam_size=beam_size,
    alpha=alpha,
    source_lang=source_lang,
    target_lang=target_lang,
    decode_overrides=decode_overrides,
  )
  start = time.perf_counter()
  hypotheses = translator.translate([source for source, _ in pairs], progress=True)
  seconds = time.perf_counter() - start
  report = evaluation.bleu_report(
    hypotheses,
    [target for _, target in pairs],
    bleu_language(config, target_lang),
    bleu or config.evaluate.bleu,
  )
  report.update(
    {
      "workdir": os.path.abspath(workdirs[0]),
      "step": step,
      "split": name,
      "num_sentences": len(pairs),
      "limited_to_first": limit,
      "beam_size": translator.beam_size,
      "alpha": translator.alpha,
      "seconds": seconds,
      "sentences_per_second": len(pairs) / seconds,
      "decode_overrides": list(decode_overrides),
    }
  )
  # The beam, the length penalty and --limit are in the name, so a second evaluation with
  # another --alpha or --limit writes beside the first instead of over it.
  stem = f"{name}-step{step}-beam{translator.beam_size}-alpha{translator.alpha:g}"
  for override in decode_overrides:  # decode.candidate_pool=fairseq -> -candidate_pool_fairseq
    stem += "-" + re.sub(r"[^A-Za-z0-9._-]", "_", override.removeprefix("decode."))
  if limit:
    stem += f"-first{limit}"
  if len(workdirs) > 1:
    report["ensemble"] = [os.path.abspath(w) for w in workdirs]
    stem += f"-ensemble{len(workdirs)}"
  out_dir = os.path.join(checkpointing.resolve_workdir(workdirs[0]), "eval")
  os.makedirs(out_dir, exist_ok=True)
  stem = os.path.join(out_dir, stem)
  text_files.write_atomically(stem + ".txt", "".join(h + "\n" for h in hypotheses))
  text_files.write_atomically(stem + ".json", json.dumps(report, indent=2) + "\n")
  report["report_path"] = stem + ".json"
  return report


def score_translations(
  hypotheses_file: str,
  reference_file: str,
  target_lang: str | None,
  source_file: str | None = None,
  bleu: str = "sacrebleu",
) -> dict[str, Any]:
  """The `evaluation.bleu_report` of a file of translations (one per line) against
  line-aligned references: scoring of any system's output, with no model. `target_lang`
  picks the Moses rules of the paper-comparable BLEU of detokenized text; `bleu="tokenized"`
  scores tokenized text as it is instead (multi-bleu.perl), and needs no language.
  `source_file`, if given, is only checked to be line-aligned too (a hypothesis file of
  another test set, or one with a line lost, would otherwise score garbage without a word).

  Raises:
    ValueError: no `target_lang` for detokenized text, or a missing, unreadable or
      misaligned file (DataError).
  """
  evaluation.check_bleu_kind(bleu)
  if not target_lang and bleu == "sacrebleu":
    raise errors.BadValue(
      "--hypotheses needs --tgt_lang (e.g. de): the paper-comparable BLEU tokenizes with that "
      "language's Moses rules."
    )
  pairs = text_files.read_parallel(hypotheses_file, reference_file)
  if source_file:
    text_files.read_parallel(source_file, reference_file)
  report = evaluation.bleu_report(
    [hypothesis for hypothesis, _ in pairs],
    [reference for _, reference in pairs],
    (target_lang or "").split("_")[0],
    bleu,
  )
  report.update(
    {
      "split": os.path.basename(hypotheses_file),
      "hypotheses": os.path.abspath(hypotheses_file),
      "reference": os.path.abspath(reference_file),
    }
  )
  return report

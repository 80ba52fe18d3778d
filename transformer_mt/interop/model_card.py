"""The model card (README.md) of an exported model, as the Hugging Face hub reads one.

YAML front matter first (the hub's model-card metadata: languages, `translation` tag, license,
metrics, and a model-index of the recorded scores), then what a reader of the hub page wants:
the experiment, its training data and steps, the architecture, the scores the workdir's own
evaluations of the exported checkpoint recorded (WORKDIR/eval/*.json, written by `run.py
evaluate`) and how to use it: a snippet that decodes as the run does, as far as the target's
own search can (tests/test_export_use.py runs the card's snippets).

The license is "unknown" unless the config names one: a model trained here is under whatever
its training data allows, which only the person exporting it knows.
"""

from __future__ import annotations

import glob
import json
import os

import ml_collections

from transformer_mt.data.tokenizer import AnyTokenizer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.workdir import checkpointing

FILENAME = "README.md"


def eval_reports(workdir: str, step: int) -> list[dict]:
  """The reports of `run.py evaluate` on checkpoint `step` of `workdir` (WORKDIR/eval/, file
  names sorted), each with its "file".

  WORKDIR/eval/ holds every evaluation of the workdir: of other checkpoints (evaluate --step)
  and of ensembles led by this one, whose scores are not this model's; the report's "step"
  and "ensemble" say which. An averaged checkpoint directory has its own eval/. Reports that
  are not JSON objects, or that name no step, are skipped.
  """
  reports = []
  directory = os.path.join(checkpointing.resolve_workdir(workdir), "eval")
  for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
    try:
      with open(path, encoding="utf-8") as f:
        report = json.load(f)
    except (OSError, ValueError):
      continue
    if not isinstance(report, dict) or "sacrebleu" not in report:
      continue
    if report.get("step") == step and not report.get("ensemble"):
      reports.append(dict(report, file=os.path.basename(path)))
  return reports


def training_data(data: ml_collections.ConfigDict) -> str:
  """One line naming where the training pairs came from."""
  if data.source == "synthetic":
    return (
      f"{data.num_train:,} pairs of the offline synthetic language pair "
      f"(transformer_mt/data/synthetic.py, seed {data.seed})"
    )
  if data.source == "tfds":
    return f"TFDS `{data.tfds_name}` ({data.source_lang}-{data.target_lang})"
  if data.source == "local":
    files = list(data.train_prefixes) or list(data.split_prefixes)
    files += list(data.extra_train_prefixes)
    names = ", ".join(f"`{os.path.basename(f)}`" for f in files) or "local text files"
    return f"local text files {names} ({data.source_lang}-{data.target_lang})"
  return f"data source {data.source!r}"


def _experiment(config: ml_collections.ConfigDict, otherwise: str) -> str:
  """The registry's experiment name (an import's config has none), or `otherwise`."""
  return config.experiment if "experiment" in config else otherwise


def _training_rows(config: ml_collections.ConfigDict, step: int) -> list[str]:
  """The table rows saying where the weights came from: a run's data and steps, or an import."""
  # run.py import (whose config alone has init.source): step 0 holds the published weights
  if "source" in config.init and config.init.source == "hf":
    return [f"| weights | imported from Hugging Face: `{config.init.name}` |"]
  return [
    f"| training data | {training_data(config.data)} |",
    f"| steps | {step:,} (of {int(config.train.num_steps):,} configured) |",
  ]


def _front_matter(config: ml_collections.ConfigDict, reports: list[dict]) -> list[str]:
  languages = sorted({config.data.source_lang, config.data.target_lang})
  lines = ["---", "language:", *(f"- {code}" for code in languages)]
  lines += ["tags:", "- translation", "- transformer_mt", "license: unknown"]
  lines += ["library_name: transformers", "pipeline_tag: translation", "metrics:", "- bleu"]
  if any("chrf" in r for r in reports):
    lines.append("- chrf")
  if reports:
    name = _experiment(config, "model")
    lines += ["model-index:", f"- name: {name}", "  results:"]
    pair = f"{config.data.source_lang}-{config.data.target_lang}"
    for report in reports:
      lines += [
        "  - task:",
        "      type: translation",
        f"      name: Translation {pair}",
        "    dataset:",
        f"      name: {report.get('split', 'test')}",
        f"      type: {report.get('split', 'test')}",
        "    metrics:",
        "    - type: bleu",
        f"      value: {report['sacrebleu']:.2f}",
        f"      name: sacreBLEU (beam {report.get('beam_size')}, step {report.get('step')})",
      ]
      if "chrf" in report:
        lines += ["    - type: chrf", f"      value: {report['chrf']:.2f}", "      name: chrF"]
  return lines + ["---"]


def model_card(
  config: ml_collections.ConfigDict,
  model_config: TransformerConfig,
  step: int,
  reports: list[dict],
  tokenizer: AnyTokenizer,
  target: str = "hf",
) -> str:
  """README.md of an export of checkpoint `step` of a run with `config`, to `target` ("hf":
  a MarianMTModel directory; "ctranslate2": a CTranslate2 model converted from one), listing
  `reports` (`eval_reports` of that checkpoint); `tokenizer` names the special pieces that
  the CTranslate2 snippet passes."""
  name = _experiment(config, "(an imported model)")
  pair = f"{config.data.source_lang}→{config.data.target_lang}"
  lines = _front_matter(config, reports)
  lines += [
    "",
    f"# {name}: {pair} Transformer",
    "",
    config.description or "",
    "",
    f"Trained with transformer_mt (JAX/Flax) and exported with `run.py export --to {target}`"
    + (
      ": a CTranslate2 model converted by CTranslate2's TransformersConverter from a "
      "MarianMTModel export"
      if target == "ctranslate2"
      else " as a MarianMTModel"
    )
    + ", which computes what the original model computes (log-probabilities equal to float32 "
    "rounding).",
    "",
    "| | |",
    "|---|---|",
    f"| experiment | `{name}` |",
    *_training_rows(config, step),
    f"| architecture | {model_config.num_encoder_layers}+{model_config.num_decoder_layers} "
    f"layers, d_model {model_config.d_model}, {model_config.num_heads} heads, FFN "
    f"{model_config.d_ff}, {model_config.activation}, post-LN, tied embeddings |",
    f"| vocabulary | {model_config.vocab_size:,} SentencePiece pieces, shared by both sides |",
    "",
    "## Evaluation",
    "",
  ]
  if reports:
    lines += [
      "Recorded by `run.py evaluate` in the workdir's eval/ folder:",
      "",
      "| split | step | beam | alpha | sentences | sacreBLEU | chrF | signature |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
      chrf = f"{r['chrf']:.2f}" if "chrf" in r else "–"
      lines.append(
        f"| {r.get('split')} | {r.get('step')} | {r.get('beam_size')} | {r.get('alpha')} | "
        f"{r.get('num_sentences')} | {r['sacrebleu']:.2f} | {chrf} | "
        f"`{r.get('sacrebleu_signature', '')}` |"
      )
  else:
    lines.append("No evaluation was recorded (`run.py evaluate` writes WORKDIR/eval/*.json).")
  lines += ["", "## Use", ""]
  if target == "ctranslate2":
    lines += _use_ctranslate2(config, model_config, tokenizer)
  else:
    lines += _use_hf(config)
  return "\n".join(lines)


def _decoding(decode: ml_collections.ConfigDict, engine: str, pool: str, unless: str) -> str:
  """What the run's own decoding was, and how close an export's `engine` comes to it: our
  translations under decode.length_penalty="power" and decode.candidate_pool=`pool`, but for
  the ones `unless` names."""
  same = (decode.length_penalty, decode.candidate_pool) == ("power", pool)
  return (
    f"The run decoded with beam {decode.beam_size} and length penalty alpha {decode.alpha} "
    f"({decode.length_penalty!r}, candidate pool {decode.candidate_pool!r}). {engine} with our "
    f'decode.length_penalty="power" (len ** alpha) and decode.candidate_pool="{pool}", but '
    f"for {unless}"
    + ("." if same else "; with this run's settings a few more translations may differ.")
  )


def _use_hf(config: ml_collections.ConfigDict) -> list[str]:
  return [
    "```python",
    "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
    "",
    'tokenizer = AutoTokenizer.from_pretrained("PATH")',
    'model = AutoModelForSeq2SeqLM.from_pretrained("PATH")',
    'batch = tokenizer(["..."], return_tensors="pt", padding=True)',
    "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
    "```",
    "",
    f"generation_config.json holds beam {config.decode.beam_size} and length_penalty "
    f"{config.decode.alpha}, with EOS never forced and PAD and the decoder start token "
    "suppressed, as ours never emits them. " + _generate_decoding(config.decode),
    "",
  ]


def _use_ctranslate2(
  config: ml_collections.ConfigDict, model_config: TransformerConfig, tokenizer: AnyTokenizer
) -> list[str]:
  """The snippet, with every setting that makes CTranslate2 decode as ours: the run's beam and
  alpha, its length limit, and the pieces ours never emits suppressed (ours masks them before
  the softmax, as suppress_sequences does)."""
  decode = config.decode
  eos = tokenizer.pieces([model_config.eos_id])[0]
  suppressed = [[piece] for piece in tokenizer.pieces(model_config.suppressed_ids)]
  return [
    "```python",
    "import ctranslate2, sentencepiece",
    "",
    'source = sentencepiece.SentencePieceProcessor(model_file="PATH/source.spm")',
    'target = sentencepiece.SentencePieceProcessor(model_file="PATH/target.spm")',
    'translator = ctranslate2.Translator("PATH", device="cpu")',
    f'pieces = [source.encode(line, out_type=str) + [{json.dumps(eos)}] for line in ["..."]]',
    "results = translator.translate_batch(",
    "  pieces,",
    f"  beam_size={int(decode.beam_size)},",
    f"  length_penalty={float(decode.alpha)},",
    f"  max_decoding_length={int(decode.max_len)},",
    f"  suppress_sequences={json.dumps(suppressed, ensure_ascii=False)},",
    ")",
    "print([target.decode(r.hypotheses[0]) for r in results])",
    "```",
    "",
    f"Sources end with EOS (`{eos}`), as the model was trained. " + _ctranslate2_decoding(decode),
    "",
  ]


def _generate_decoding(decode: ml_collections.ConfigDict) -> str:
  return _decoding(
    decode,
    "transformers' `generate` reproduces our translations token for token",
    "hf",
    f"those ours stops at the source's length + {decode.extra_len} (generate stops every one "
    f"at {decode.max_len})",
  )


def _ctranslate2_decoding(decode: ml_collections.ConfigDict) -> str:
  return _decoding(
    decode,
    "CTranslate2's search (done once beam_size hypotheses have finished) gives our translations",
    "fairseq",
    f"those that reach a length limit (max_decoding_length, {decode.max_len}: CTranslate2 "
    "cuts them there, ours ends them with EOS; ours also stops at the source's length + "
    f"{decode.extra_len})",
  )

"""A Translator from checkpoint directories alone: one model, or an ensemble of several,
with a multilingual import's languages. Only each checkpoint's `params` item is read, and no
optimizer is built; the config and tokenizer come from the checkpoint.

Here apart from translator.py, which decodes lines with the parameters it is given, because
what it takes to read a model (its config, overrides of its decode section, its language tags,
an ensemble's shared vocabulary) is a job of its own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from jax.sharding import Mesh

from transformer_mt.config import registry
from transformer_mt.data import tokenizer as tokenizers
from transformer_mt.data.tokenizer import AnyTokenizer
from transformer_mt.decoding.settings import decode_settings
from transformer_mt.decoding.translator import Translator
from transformer_mt.model import setup as run_setup
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors, sharding
from transformer_mt.workdir import checkpointing


def load_translator(
  workdir: str | Sequence[str],
  step: int | None = None,
  mesh: Mesh | None = None,
  beam_size: int | None = None,
  alpha: float | None = None,
  source_lang: str | None = None,
  target_lang: str | None = None,
  decode_overrides: Sequence[str] = (),
) -> Translator:
  """A Translator from checkpoint directories alone (config and tokenizer are inside); only
  the checkpoint's `params` item is read, and no optimizer is built.

  Args:
    workdir: a workdir, or several: an ensemble (`incremental`'s module docstring), decoded
      from the mean of the members' log-probabilities with the first workdir's decode
      settings. Their architectures may differ; their tokenizer, ids and language tags may not.
    step: each workdir's checkpoint step (default: its latest).
    mesh: what inference runs on (default: every device on the data axis), never the config's
      training mesh, so a model trained with FSDP on 8 devices translates on 1.
    beam_size, alpha: default to the experiment's `decode` section.
    source_lang, target_lang: a multilingual import's language codes (default: its `data`).
    decode_overrides: "decode.KEY=VALUE" settings on top of the checkpoint's `decode`
      section (e.g. decode.candidate_pool=fairseq: a model trained before a rule existed,
      decoded with it); beam_size and alpha, when given, win over them.

  Raises:
    ValueError: no workdir, members whose tokenizers or ids differ, refused languages, or an
      override of anything but `decode`.
    FileNotFoundError: a workdir without checkpoints.
  """
  workdirs = [workdir] if isinstance(workdir, str) else list(workdir)
  if not workdirs:
    raise errors.BadValue("No --workdir given.")
  mesh = mesh or sharding.make_mesh(sharding.inference_mesh_config())
  # Every member's config and tokenizer are read and checked before any parameters are.
  decoding = (beam_size, alpha, decode_overrides)
  prepared = [_prepare(w, step, mesh, *decoding, source_lang, target_lang) for w in workdirs]
  first = prepared[0][0]
  for (other, _), other_dir in zip(prepared[1:], workdirs[1:]):
    _check_same_vocabulary(first, workdirs[0], other, other_dir)
  params = []
  for (translator, member_step), member_dir in zip(prepared, workdirs):
    params.append(checkpointing.restore_params(member_dir, member_step, translator.params))
    logging.info("Loaded step %d from %s onto mesh %s.", member_step, member_dir, dict(mesh.shape))
  if len(prepared) == 1:
    return dataclasses.replace(first, params=params[0])
  logging.info("Ensemble of %d models: %s.", len(prepared), ", ".join(workdirs))
  return dataclasses.replace(
    first, params=tuple(params), members=tuple(t.model_config for t, _ in prepared)
  )


def _check_same_vocabulary(first: Translator, first_dir: str, other: Translator, other_dir: str):
  """An ensemble averages log-probabilities id by id: its members must read and write the
  same ids, so they must have one tokenizer (byte-identical files), the same special ids and
  the same forced first token (language tag)."""
  if tokenizers.to_files(first.tokenizer) != tokenizers.to_files(other.tokenizer):
    raise errors.BadValue(
      f"--workdir {other_dir} has a different tokenizer from --workdir {first_dir}: an ensemble's "
      "models must share one tokenizer (ensemble checkpoints trained or fine-tuned from the "
      "same tokenizer), or translate with each separately."
    )
  names = ("pad_id", "eos_id", "decoder_start_id", "vocab_size", "output_vocab_size")
  ids = [(n, getattr(first.model_config, n), getattr(other.model_config, n)) for n in names]
  ids.append(("forced first token", first.forced_first_id, other.forced_first_id))
  for name, a, b in ids:
    if a != b:
      raise errors.BadValue(
        f"--workdir {other_dir} has {name} {b}, --workdir {first_dir} has {a}: an ensemble's "
        "models must share their ids and language tags; import or train them alike."
      )


def _prepare(
  workdir: str,
  step: int | None,
  mesh: Mesh,
  beam_size: int | None,
  alpha: float | None,
  decode_overrides: Sequence[str],
  source_lang: str | None,
  target_lang: str | None,
) -> tuple[Translator, int]:
  """(one model's Translator holding its abstract parameters, the checkpoint step): all of
  `load_translator` but reading the parameters."""
  config, tokenizer, step = checkpointing.read_config(workdir, step)
  config = run_setup.runnable_here(config)
  not_decode = [o for o in decode_overrides if not o.startswith("decode.")]
  if not_decode:
    raise errors.BadValue(
      f"{not_decode[0]}: only decode.KEY=VALUE settings apply to a trained model's decoding "
      "(e.g. decode.candidate_pool=fairseq)."
    )
  registry.apply_overrides(config, decode_overrides)
  tokenizer, model_config, forced_first_id = with_languages(
    tokenizer, config, source_lang, target_lang, workdir
  )
  setup = run_setup.model_setup(config, tokenizer, mesh)
  translator = Translator(
    params=setup.abstract_params,
    model_config=model_config or setup.model_config,
    tokenizer=tokenizer,
    mesh=mesh,
    forced_first_id=forced_first_id,
    **decode_settings(config, beam_size, alpha),
  )
  return translator, step


def with_languages(
  tokenizer: AnyTokenizer,
  config,
  source_lang: str | None,
  target_lang: str | None,
  workdir: str,
) -> tuple[AnyTokenizer, TransformerConfig | None, int | None]:
  """(tokenizer, model config or None to keep the checkpoint's, forced first token or None)
  for translating `source_lang` -> `target_lang` (default: the config's data languages).

  A multilingual import (a tokenizer with `LanguageTags`) tags the source with its language and
  starts the target with its own (mBART-cc25: as the decoder's first input; mBART-50, NLLB:
  as the forced first token). Any other model has no language tags and takes no languages.

  Raises:
    ValueError: languages for a model without tags, a model with tags but no languages,
      or a code the model does not know (naming the closest ones).
  """
  tokenizers.check_language_flags(
    tokenizer,
    {"--src_lang": source_lang, "--tgt_lang": target_lang},
    f"the model in {workdir} has no language tags (only imported mBART and NLLB models do); "
    "drop the flag.",
  )
  if not tokenizers.has_language_tags(tokenizer):
    return tokenizer, None, None
  # The config comes from checkpointing.read_config, completed from the defaults ("" when a
  # multilingual import written before data.source_code existed lacks the keys: the flags
  # are then asked for).
  source = source_lang or config.data.source_code or None
  target = target_lang or config.data.target_code or None
  tokenizers.require_codes(
    tokenizer,
    {"--src_lang": source, "--tgt_lang": target},
    lambda missing, examples: (
      f"{workdir} holds a multilingual {tokenizer.kind} model imported without a source and "
      f"target language: pass {missing} (codes such as {examples}), or import it with them."
    ),
  )
  tokenizer = tokenizer.with_languages(source, target)
  decoder_start_id, forced_first_id = tokenizer.target_ids()
  model_config = run_setup.model_config_for(config, tokenizer)
  if decoder_start_id is not None:
    model_config = model_config.replace(decoder_start_id=decoder_start_id)
  return tokenizer, model_config, forced_first_id

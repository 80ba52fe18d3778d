"""`run.py import`: a Hugging Face checkpoint as a workdir that translates like any trained one.

`import_pretrained("hf:DIR_OR_NAME", workdir)` reads a `save_pretrained` directory (or
downloads a hub repository by name), converts its weights with `hf_convert`, reads its
tokenizer files, and writes checkpoint step 0 of `workdir`: params, config and tokenizer
items, no optimizer state (like an averaged checkpoint). `translate`, `evaluate` and
`attention` then use it with nothing else.

The config's `model` section holds every `TransformerConfig` field of the import, vocabulary
sizes included, so `run_setup.model_setup` rebuilds exactly the converted model; `init` says
where the weights came from. Importable: Marian (OPUS-MT), FSMT (fairseq's WMT19 models;
fsmt_tokenizer.py reads its tokenizer), mBART (cc25 and 50) and NLLB-200 (model_type m2m_100
with NllbTokenizer; multilingual_tokenizers.py reads the last two, and their language codes are
saved as data.source_code / data.target_code).

Nothing is written until everything is converted, and the checkpoint is written into a
temporary directory beside the workdir and renamed into place only when complete, so a
failure leaves no workdir that looks valid.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence

import ml_collections

from transformer_mt.config import defaults, registry
from transformer_mt.data import fsmt_tokenizer, text_files
from transformer_mt.data import multilingual_tokenizers as hf_tokenizers
from transformer_mt.data.tokenizer import (
  SOURCE_SPM,
  TARGET_SPM,
  VOCAB_FILENAME,
  VocabTokenizer,
  check_language_flags,
  has_language_tags,
)
from transformer_mt.interop import hf_convert
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors
from transformer_mt.workdir import checkpointing

# What an import reads: Marian's tokenizer, or mBART's / NLLB's.
ImportedTokenizer = (
  VocabTokenizer | fsmt_tokenizer.FsmtTokenizer | hf_tokenizers.LanguageTagTokenizer
)

PREFIX = "hf:"
# Model types whose tokenizer we can read (their weights: hf_convert.SUPPORTED_MODEL_TYPES).
IMPORTABLE_MODEL_TYPES = ("marian", "fsmt", "mbart", "m2m_100")
# What a hub download fetches: the config, the weights (safetensors, else PyTorch .bin; either
# whole or sharded) and the tokenizer (Marian's files; FSMT's vocabularies and merges; mBART's
# and NLLB's tokenizer.json).
_HUB_FILES = [
  "config.json",
  "generation_config.json",
  "model.safetensors",
  "model-*.safetensors",
  "model.safetensors.index.json",
  "pytorch_model.bin",
  "pytorch_model-*.bin",
  "pytorch_model.bin.index.json",
  *fsmt_tokenizer.HF_FILES,
  SOURCE_SPM,
  TARGET_SPM,
  VOCAB_FILENAME,
  "tokenizer_config.json",
  "tokenizer.json",
  "special_tokens_map.json",
  "sentencepiece.bpe.model",
]
# A hub repository id: "name" or "owner/name".
_HUB_NAME = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
# Config keys an import accepts as `key=value` overrides: how to decode and what to evaluate on.
# The model section is the checkpoint's own and cannot change.
OVERRIDABLE_SECTIONS = ("decode", "data")


def resolve_source(source: str) -> tuple[str, str, bool]:
  """(local directory, name, downloaded) of `hf:DIR_OR_NAME`: a local directory when one
  exists, else a hub repository downloaded with huggingface_hub (needs the internet).

  Raises:
    ValueError: no `hf:` prefix, or a download that failed.
    FileNotFoundError: a path that is no directory and no hub name.
  """
  if not source.startswith(PREFIX) or not source[len(PREFIX) :]:
    raise errors.BadValue(
      f"--from {source!r}: expected hf:DIR (a save_pretrained directory) or hf:OWNER/NAME "
      "(a Hugging Face hub repository)."
    )
  name = os.path.expanduser(source[len(PREFIX) :])
  if os.path.isdir(name):
    return name, os.path.basename(os.path.normpath(name)), False
  if os.path.exists(name):
    raise errors.MissingFile(f"--from {source}: {name} is a file; pass its directory.")
  if os.path.isabs(name) or not _HUB_NAME.match(name):
    raise errors.MissingFile(f"--from {source}: no such directory {name}.")
  return _download(name), name, True


def _download(name: str) -> str:
  """The local snapshot of hub repository `name` (cached by huggingface_hub)."""
  try:
    from huggingface_hub import list_repo_files, snapshot_download

    patterns = hub_patterns(list_repo_files(name))
    return snapshot_download(repo_id=name, allow_patterns=patterns)
  except Exception as e:  # noqa: BLE001 - whatever stops the download, the user gets one line
    raise errors.BadValue(
      f"No local directory {name!r}, and downloading it from the Hugging Face hub failed "
      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Pass a directory "
      "written by save_pretrained, or check the name and the internet connection."
    ) from e


def hub_patterns(repo_files: Sequence[str]) -> list[str]:
  """The files to download from a hub repository holding `repo_files`: the PyTorch .bin
  weights only when there are no safetensors (many repositories hold both)."""
  if any(name.endswith(".safetensors") for name in repo_files):
    return [p for p in _HUB_FILES if not p.startswith("pytorch_model")]
  return list(_HUB_FILES)


def _read_json(path: str) -> dict:
  return text_files.read_json(path)


def read_hf_config(directory: str) -> dict:
  """config.json of `directory`, checked to be a model type we can import."""
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise errors.MissingFile(f"No config.json in {directory}: not a save_pretrained directory.")
  hf_config = _read_json(path)
  model_type = hf_config.get("model_type")
  if model_type not in IMPORTABLE_MODEL_TYPES:
    weights_only = (
      " (its weights convert, but its tokenizer is not supported yet)"
      if model_type in hf_convert.SUPPORTED_MODEL_TYPES
      else ""
    )
    raise errors.BadValue(
      f"Cannot import Hugging Face model_type {model_type!r}{weights_only}; "
      f"importable: {list(IMPORTABLE_MODEL_TYPES)}."
    )
  return hf_config


def _token_text(value) -> str | None:
  """A special token from tokenizer_config.json: a string, or an AddedToken dict."""
  return value.get("content") if isinstance(value, dict) else value


def read_marian_tokenizer(directory: str) -> tuple[VocabTokenizer, dict]:
  """(tokenizer, tokenizer_config.json) of a Marian `save_pretrained` directory."""
  missing = [
    n
    for n in (SOURCE_SPM, TARGET_SPM, VOCAB_FILENAME)
    if not os.path.exists(os.path.join(directory, n))
  ]
  if missing:
    raise errors.MissingFile(
      f"{directory} lacks the Marian tokenizer files {missing} (save the tokenizer into the "
      "same directory with tokenizer.save_pretrained)."
    )
  config_path = os.path.join(directory, "tokenizer_config.json")
  tokenizer_config = _read_json(config_path) if os.path.exists(config_path) else {}
  if tokenizer_config.get("separate_vocabs"):
    raise errors.BadValue(
      f"{directory}: Marian tokenizers with separate source and target vocabularies are not "
      "supported yet."
    )
  special = {
    kind: _token_text(tokenizer_config[f"{kind}_token"])
    for kind in ("eos", "unk", "pad")
    if _token_text(tokenizer_config.get(f"{kind}_token"))
  }
  files = {}
  for name in (SOURCE_SPM, TARGET_SPM, VOCAB_FILENAME):
    with open(os.path.join(directory, name), "rb") as f:
      files[name] = f.read()
  tokenizer = VocabTokenizer(
    files[SOURCE_SPM], files[TARGET_SPM], json.loads(files[VOCAB_FILENAME]), special
  )
  return tokenizer, tokenizer_config


def read_tokenizer(directory: str, model_type: str) -> tuple[ImportedTokenizer, dict]:
  """(tokenizer, tokenizer_config.json) of a `save_pretrained` directory of `model_type`."""
  if model_type == "marian":
    return read_marian_tokenizer(directory)
  if model_type == "fsmt":
    tokenizer, tokenizer_config = fsmt_tokenizer.read_fsmt_tokenizer(directory)
    # FSMT names its languages in `langs`; the saved config's data section reads these.
    languages = dict(source_lang=tokenizer.source_lang, target_lang=tokenizer.target_lang)
    return tokenizer, {**tokenizer_config, **languages}
  config_path = os.path.join(directory, "tokenizer_config.json")
  tokenizer_config = _read_json(config_path) if os.path.exists(config_path) else {}
  return hf_tokenizers.read_tokenizer(directory, model_type), tokenizer_config


def _check_tokenizer_fits(tokenizer: ImportedTokenizer, model_config: TransformerConfig) -> None:
  """The tokenizer's special ids and vocabulary must be the model's."""
  problems = [
    f"{name} id {ours} (tokenizer) != {theirs} (config.json)"
    for name, ours, theirs in (
      ("pad", tokenizer.pad_id, model_config.pad_id),
      ("eos", tokenizer.eos_id, model_config.eos_id),
    )
    if ours != theirs
  ]
  if tokenizer.vocab_size > model_config.vocab_size:
    problems.append(
      f"the vocabulary has {tokenizer.vocab_size} ids, the model {model_config.vocab_size}"
    )
  target_size = getattr(tokenizer, "target_vocab_size", tokenizer.vocab_size)
  if target_size > model_config.output_vocab_size:
    problems.append(
      f"the target vocabulary has {target_size} ids, the model {model_config.output_vocab_size}"
    )
  if problems:
    raise errors.BadValue("The tokenizer does not fit the model: " + "; ".join(problems) + ".")


def run_config(
  model_config: TransformerConfig,
  tokenizer: ImportedTokenizer,
  hf_config: dict,
  generation: dict,
  tokenizer_config: dict,
  name: str,
  from_hub: bool,
) -> ml_collections.ConfigDict:
  """The config saved with the imported checkpoint: what `translate` and `evaluate` read."""
  config = ml_collections.ConfigDict()
  config.description = f"Imported from Hugging Face: {name} ({hf_config['model_type']})"
  config.paper_bleu = None
  # Where the weights came from; a local directory is named without its path (workdirs hold
  # no absolute paths).
  config.init = ml_collections.ConfigDict(
    dict(source="hf", name=name, from_hub=from_hub, model_type=hf_config["model_type"])
  )
  # Every TransformerConfig field, vocabulary sizes included (see run_setup.model_config_for).
  fields = model_config.to_dict()
  for variant in model_config.USE_FIELDS:
    fields.pop(variant)
  config.model = ml_collections.ConfigDict(fields)
  config.tokenizer = ml_collections.ConfigDict(
    dict(type=f"hf_{hf_config['model_type']}", vocab_size=tokenizer.vocab_size)
  )
  # No data of its own: evaluate with --source/--reference, or set data.* when importing.
  # source_lang/target_lang name the languages (file suffixes, BLEU's tokenization);
  # source_code/target_code are a multilingual model's language tags, unset ("") unless
  # given at import: its tokenizer_config.json holds the class's default, not a choice.
  config.data = ml_collections.ConfigDict(
    dict(
      source="none",
      source_lang=str(tokenizer_config.get("source_lang") or "en"),
      target_lang=str(tokenizer_config.get("target_lang") or "en"),
      source_code="",
      target_code="",
      root="",
      test_prefixes=[],
    )
  )
  # Decoded as transformers' generate(num_beams, length_penalty, early_stopping="never")
  # does: its candidate pool and len ** length_penalty scoring (beam_search's "hf", "power").
  # Its default early_stopping=False stops on a heuristic bound, and forced_eos_token_id
  # forces EOS at max_length; neither is reproduced.
  length_penalty = generation.get("length_penalty")
  # The other decode keys (how beam search runs, not what it returns) keep their defaults, so
  # that `run.py import ... decode.KEY=VALUE` takes any of them.
  config.decode = ml_collections.ConfigDict(
    dict(
      defaults.base_config().decode.to_dict(),
      beam_size=int(generation.get("num_beams") or 1),
      alpha=1.0 if length_penalty is None else float(length_penalty),
      length_penalty="power",
      candidate_pool="hf",
      extra_len=50,
      max_len=int(min(model_config.max_len, generation.get("max_length") or 512)),
      batch_size=64,
    )
  )
  return config


def _apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  for override in overrides:
    section = override.partition("=")[0].split(".")[0]
    if section not in OVERRIDABLE_SECTIONS:
      raise errors.BadValue(
        f"Override {override!r}: an import takes only {list(OVERRIDABLE_SECTIONS)} keys; "
        "the model is the checkpoint's own."
      )
  registry.apply_overrides(config, overrides)


def _refuse_existing_checkpoints(workdir: str) -> None:
  directory = checkpointing.checkpoint_dir(workdir)
  if os.path.isdir(directory) and os.listdir(directory):
    raise errors.AlreadyExists(
      f"{workdir} already holds checkpoints ({directory}); import into a new --workdir."
    )


def _set_languages(
  config: ml_collections.ConfigDict,
  tokenizer: ImportedTokenizer,
  source_code: str | None,
  target_code: str | None,
) -> None:
  """Saves the language codes given as flags (data.source_code / data.target_code) and
  checks them, and any given by data.* overrides or a registry row, against the model's."""
  if source_code:
    config.data.source_code = source_code
  if target_code:
    config.data.target_code = target_code
  check_language_flags(
    tokenizer,
    {"--src_lang": source_code, "--tgt_lang": target_code},
    "this model has no language tags (only mBART and NLLB models do); set "
    "data.source_lang/data.target_lang instead to name the languages.",
  )
  if not has_language_tags(tokenizer):
    return
  # Always there: run_config writes both keys, and a data section given to the import is an
  # experiment's (config/defaults.py sets them).
  for flag, code in (
    ("--src_lang", config.data.source_code),
    ("--tgt_lang", config.data.target_code),
  ):
    if code:
      tokenizer.language_id(code, flag)


def import_pretrained(
  source: str,
  workdir: str,
  overrides: Sequence[str] = (),
  source_lang: str | None = None,
  target_lang: str | None = None,
  *,
  data: ml_collections.ConfigDict | None = None,
) -> str:
  """Converts `hf:DIR_OR_NAME` into checkpoint step 0 of `workdir`; returns its directory.

  Args:
    source: `hf:` then a save_pretrained directory or a hub repository name.
    workdir: a new directory, or one without checkpoints.
    overrides: `decode.*` / `data.*` key=value settings for the saved config.
    data: a whole data section for the saved config (a registry row's: what `evaluate`
      reads as the test set), applied before `overrides`.
    source_lang, target_lang: language codes of an mBART or NLLB model (en_XX, eng_Latn),
      saved as data.source_code / data.target_code; translate can override them.

  Raises:
    ValueError, FileNotFoundError, FileExistsError: a bad source, an unsupported model,
      missing files or a workdir with checkpoints; nothing is written then.
  """
  workdir = checkpointing.absolute(workdir)
  if "://" in workdir:
    raise errors.BadValue(f"--workdir {workdir}: an import is written to a local directory.")
  _refuse_existing_checkpoints(workdir)
  directory, name, from_hub = resolve_source(source)
  hf_config = read_hf_config(directory)
  tokenizer, tokenizer_config = read_tokenizer(directory, hf_config["model_type"])
  if has_language_tags(tokenizer) and hf_config.get("decoder_start_token_id") is None:
    # mBART-cc25's config names no decoder start: it is the target language code, set at
    # translate time (loading.with_languages); EOS stands in until then.
    hf_config = {**hf_config, "decoder_start_token_id": hf_config.get("eos_token_id")}
  model_config = hf_convert.config_from_hf(hf_config)
  _check_tokenizer_fits(tokenizer, model_config)
  # Newer saves keep num_beams and max_length in generation_config.json, older ones in config.json.
  generation_path = os.path.join(directory, "generation_config.json")
  generation = {
    **hf_config,
    **(_read_json(generation_path) if os.path.exists(generation_path) else {}),
  }
  config = run_config(
    model_config,
    tokenizer,
    hf_config,
    generation,
    tokenizer_config,
    name,
    from_hub=from_hub,
  )
  if data is not None:
    config.data = data.copy_and_resolve_references()
  _apply_overrides(config, overrides)
  _set_languages(config, tokenizer, source_lang, target_lang)
  params = hf_convert.params_from_hf(hf_convert.read_state_dict(directory), hf_config)
  return _write_atomically(workdir, params, config, tokenizer)


def _write_atomically(workdir: str, params, config, tokenizer: ImportedTokenizer) -> str:
  """Saves into a temporary workdir beside `workdir`, then renames its checkpoints/ into place."""
  parent = os.path.dirname(workdir)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(workdir)}.import-", dir=parent)
  try:
    checkpointing.save_inference(staging, 0, params, config, tokenizer)
    os.makedirs(workdir, exist_ok=True)
    final = checkpointing.checkpoint_dir(workdir)
    if os.path.isdir(final):  # empty (checked above): rename needs it gone
      os.rmdir(final)
    os.rename(checkpointing.checkpoint_dir(staging), final)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return os.path.join(checkpointing.checkpoint_dir(workdir), "0")

"""`run.py import`: a Hugging Face checkpoint as a workdir that translates like any trained one.

`import_pretrained("hf:DIR_OR_NAME", workdir)` reads a `save_pretrained` directory (or
downloads a hub repository by name), converts its weights with `hf_convert`, reads its
tokenizer files, and writes checkpoint step 0 of `workdir`: params, config and tokenizer
items, no optimizer state (like an averaged checkpoint). `translate`, `evaluate` and
`attention` then use it with nothing else.

The config's `model` section holds every `TransformerConfig` field of the import, vocabulary
sizes included, so `run_setup.model_setup` rebuilds exactly the converted model; `init` says
where the weights came from. Only Marian (OPUS-MT) is importable so far: the weights of FSMT,
mBART and M2M100 convert, but their tokenizers are not read yet.

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

from transformer_mt import checkpointing, hf_convert, registry
from transformer_mt.config import TransformerConfig
from transformer_mt.tokenizer import (
  SOURCE_SPM,
  TARGET_SPM,
  VOCAB_FILENAME,
  VocabTokenizer,
)

PREFIX = "hf:"
# Model types whose tokenizer we can read (their weights: hf_convert.SUPPORTED_MODEL_TYPES).
IMPORTABLE_MODEL_TYPES = ("marian",)
# What a hub download fetches: the config, the weights (either format) and Marian's tokenizer.
_HUB_FILES = [
  "config.json",
  "generation_config.json",
  "model.safetensors",
  "model-*.safetensors",
  "model.safetensors.index.json",
  "pytorch_model.bin",
  SOURCE_SPM,
  TARGET_SPM,
  VOCAB_FILENAME,
  "tokenizer_config.json",
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
    raise ValueError(
      f"--from {source!r}: expected hf:DIR (a save_pretrained directory) or hf:OWNER/NAME "
      "(a Hugging Face hub repository)."
    )
  name = os.path.expanduser(source[len(PREFIX) :])
  if os.path.isdir(name):
    return name, os.path.basename(os.path.normpath(name)), False
  if os.path.exists(name):
    raise FileNotFoundError(f"--from {source}: {name} is a file; pass its directory.")
  if os.path.isabs(name) or not _HUB_NAME.match(name):
    raise FileNotFoundError(f"--from {source}: no such directory {name}.")
  return _download(name), name, True


def _download(name: str) -> str:
  """The local snapshot of hub repository `name` (cached by huggingface_hub)."""
  try:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id=name, allow_patterns=_HUB_FILES)
  except Exception as e:  # noqa: BLE001 - whatever stops the download, the user gets one line
    raise ValueError(
      f"No local directory {name!r}, and downloading it from the Hugging Face hub failed "
      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Pass a directory "
      "written by save_pretrained, or check the name and the internet connection."
    ) from e


def _read_json(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def read_hf_config(directory: str) -> dict:
  """config.json of `directory`, checked to be a model type we can import."""
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No config.json in {directory}: not a save_pretrained directory.")
  hf_config = _read_json(path)
  model_type = hf_config.get("model_type")
  if model_type not in IMPORTABLE_MODEL_TYPES:
    weights_only = (
      " (its weights convert, but its tokenizer is not supported yet)"
      if model_type in hf_convert.SUPPORTED_MODEL_TYPES
      else ""
    )
    raise ValueError(
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
    raise FileNotFoundError(
      f"{directory} lacks the Marian tokenizer files {missing} (save the tokenizer into the "
      "same directory with tokenizer.save_pretrained)."
    )
  config_path = os.path.join(directory, "tokenizer_config.json")
  tokenizer_config = _read_json(config_path) if os.path.exists(config_path) else {}
  if tokenizer_config.get("separate_vocabs"):
    raise ValueError(
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


def _check_tokenizer_fits(tokenizer: VocabTokenizer, model_config: TransformerConfig) -> None:
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
  if problems:
    raise ValueError("The tokenizer does not fit the model: " + "; ".join(problems) + ".")


def run_config(
  model_config: TransformerConfig,
  tokenizer: VocabTokenizer,
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
  for variant in ("deterministic", "decode"):
    fields.pop(variant)
  config.model = ml_collections.ConfigDict(fields)
  config.tokenizer = ml_collections.ConfigDict(
    dict(type=f"hf_{hf_config['model_type']}", vocab_size=tokenizer.vocab_size)
  )
  # No data of its own: evaluate with --source/--reference, or set data.* when importing.
  config.data = ml_collections.ConfigDict(
    dict(
      source="none",
      source_lang=str(tokenizer_config.get("source_lang") or "en"),
      target_lang=str(tokenizer_config.get("target_lang") or "en"),
      root="",
      test_prefixes=[],
    )
  )
  # Decoded as transformers' generate(num_beams, length_penalty, early_stopping="never")
  # does: its candidate pool and len ** length_penalty scoring (beam_search's "hf", "power").
  # Its default early_stopping=False stops on a heuristic bound, and forced_eos_token_id
  # forces EOS at max_length; neither is reproduced.
  length_penalty = generation.get("length_penalty")
  config.decode = ml_collections.ConfigDict(
    dict(
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
      raise ValueError(
        f"Override {override!r}: an import takes only {list(OVERRIDABLE_SECTIONS)} keys; "
        "the model is the checkpoint's own."
      )
  registry.apply_overrides(config, overrides)


def _refuse_existing_checkpoints(workdir: str) -> None:
  directory = checkpointing.checkpoint_dir(workdir)
  if os.path.isdir(directory) and os.listdir(directory):
    raise FileExistsError(
      f"{workdir} already holds checkpoints ({directory}); import into a new --workdir."
    )


def import_pretrained(source: str, workdir: str, overrides: Sequence[str] = ()) -> str:
  """Converts `hf:DIR_OR_NAME` into checkpoint step 0 of `workdir`; returns its directory.

  Args:
    source: `hf:` then a save_pretrained directory or a hub repository name.
    workdir: a new directory, or one without checkpoints.
    overrides: `decode.*` / `data.*` key=value settings for the saved config.

  Raises:
    ValueError, FileNotFoundError, FileExistsError: a bad source, an unsupported model,
      missing files or a workdir with checkpoints; nothing is written then.
  """
  workdir = checkpointing.absolute(workdir)
  if "://" in workdir:
    raise ValueError(f"--workdir {workdir}: an import is written to a local directory.")
  _refuse_existing_checkpoints(workdir)
  directory, name, from_hub = resolve_source(source)
  hf_config = read_hf_config(directory)
  tokenizer, tokenizer_config = read_marian_tokenizer(directory)
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
  _apply_overrides(config, overrides)
  params = hf_convert.params_from_hf(hf_convert.read_state_dict(directory), hf_config)
  return _write_atomically(workdir, params, config, tokenizer)


def _write_atomically(workdir: str, params, config, tokenizer: VocabTokenizer) -> str:
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

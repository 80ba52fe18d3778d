"""`init.from=DIR`: training that starts from the parameters of an imported model.

DIR is a workdir written by `run.py import` (params, config and tokenizer; no optimizer
state). The run takes from it:
  - the parameters, as the state of step 0; the optimizer starts afresh (Adam moments zero,
    the experiment's schedule from its first step);
  - the tokenizer, instead of training a SentencePiece model;
  - the model section (architecture, vocabulary sizes, special ids), with the experiment's
    dropout rates (`DROPOUT_KEYS`): the import's describe how it was pretrained, the
    experiment's how to fine-tune.
Everything else (data, schedule, batch size, decoding) is the experiment's.

The run's checkpoints save the merged config and the imported tokenizer, so they are
self-contained like any other. Resuming reads the parameters from the run's own checkpoints,
and still reads DIR's tokenizer and model section: DIR must stay where it is, and
`init.from` must name the same directory as when the run started.

`init.from=hf:NAME_OR_DIR` (the registry rows of published models) imports the Hugging Face
checkpoint first, into WORKDIR/pretrained, once: a resumed run finds it there.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import ml_collections
from etils import epath

from transformer_mt.data.tokenizer import AnyTokenizer, has_language_tags, require_codes
from transformer_mt.runtime import errors
from transformer_mt.workdir import checkpointing

# Model settings the experiment keeps when its model section is the import's.
DROPOUT_KEYS = ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate")


@dataclasses.dataclass(frozen=True)
class Import:
  """What a run fine-tunes from: an imported workdir's checkpoint."""

  directory: str
  step: int
  config: ml_collections.ConfigDict
  tokenizer: AnyTokenizer


def source(config: ml_collections.ConfigDict) -> str:
  """The `init.from` directory of `config`, or "" (training from scratch; a config saved
  before the key existed reads back with that default)."""
  return config.init["from"] or ""


# Where `init.from=hf:...` is imported, inside the run's workdir.
PRETRAINED_DIRNAME = "pretrained"


def import_into_workdir(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The import directory of `init.from`: itself for a directory; for `hf:NAME_OR_DIR`,
  WORKDIR/pretrained, imported there (with the experiment's data section, so the import
  evaluates on the experiment's test set) unless an earlier run already did."""
  from transformer_mt.interop import hf_import

  wanted = source(config)
  if not wanted.startswith(hf_import.PREFIX):
    return wanted
  directory = os.path.join(checkpointing.absolute(workdir), PRETRAINED_DIRNAME)
  if not os.path.isdir(checkpointing.checkpoint_dir(directory)):
    logging.info("Importing %s into %s.", wanted, directory)
    hf_import.import_pretrained(wanted, directory, data=config.data)
  return directory


def read_import(directory: str) -> Import:
  """The checkpoint of a `run.py import` workdir, checked to be one.

  Raises:
    FileNotFoundError: no such directory, or no checkpoint in it.
    ValueError: a workdir not written by `run.py import` (e.g. a training run's).
  """
  if not os.path.isdir(directory):
    raise errors.MissingFile(f"init.from={directory}: no such directory.")
  config, tokenizer, step = checkpointing.read_config(directory)
  step_dir = epath.Path(checkpointing.checkpoint_dir(directory)) / str(step)
  imported = "source" in config.init and "vocab_size" in config.model
  if (step_dir / "train_state").exists() or not imported:
    raise errors.BadValue(
      f"init.from={directory} is not a workdir written by `run.py import` (its checkpoint "
      f"of step {step} is a training run's); to continue a run, train into its own --workdir."
    )
  return Import(directory=directory, step=step, config=config, tokenizer=tokenizer)


def merged_config(config: ml_collections.ConfigDict, imported: Import) -> ml_collections.ConfigDict:
  """A copy of the experiment `config` with the import's model and tokenizer sections (the
  experiment's dropout rates kept): what the run builds its model from and saves."""
  merged = config.copy_and_resolve_references()
  model = imported.config.model.copy_and_resolve_references()
  for key in DROPOUT_KEYS:
    model[key] = config.model[key]
  merged.model = model
  merged.tokenizer = imported.config.tokenizer.copy_and_resolve_references()
  if merged.data.max_len > model.max_len:
    raise errors.BadValue(
      f"data.max_len={merged.data.max_len} exceeds the imported model's max_len={model.max_len} "
      "(its learned positions); lower data.max_len."
    )
  return merged


def with_languages(
  imported: Import, config: ml_collections.ConfigDict
) -> tuple[Import, int | None]:
  """(the import with its tokenizer set to data.source_code -> data.target_code, the forced
  first target token or None) for a multilingual import (mBART, NLLB); others unchanged.

  mBART-cc25's decoder starts from the target code: `config.model.decoder_start_id` (the
  merged config) is set to it, so training feeds what decoding will. mBART-50 and NLLB
  start from </s> and are trained to emit the code first (`encode_targets`).

  Raises:
    ValueError: a multilingual import without both codes, or a code it does not know.
  """
  tokenizer = imported.tokenizer
  if not has_language_tags(tokenizer):
    return imported, None
  # The merged config of an experiment: config/defaults.py sets both keys.
  source, target = config.data.source_code, config.data.target_code
  require_codes(
    tokenizer,
    {"data.source_code": source, "data.target_code": target},
    lambda _, examples: (
      f"init.from={imported.directory} is a multilingual {tokenizer.kind} model: set "
      f"data.source_code and data.target_code to its language codes (e.g. {examples})."
    ),
  )
  tokenizer = tokenizer.with_languages(source, target)
  decoder_start_id, forced_first_id = tokenizer.target_ids()
  if decoder_start_id is not None:
    config.model.decoder_start_id = decoder_start_id
  return dataclasses.replace(imported, tokenizer=tokenizer), forced_first_id


def check_resume_source(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Raises ValueError when `workdir` holds checkpoints of a run with another `init.from`.

  Compares with the newest checkpoint whose config reads back (a damaged one is skipped
  here; the restore reports it).
  """
  if not os.path.isdir(checkpointing.checkpoint_dir(workdir)):
    return
  wanted = source(config)
  for step in reversed(checkpointing.all_steps(workdir)):
    try:
      saved, _, _ = checkpointing.read_config(workdir, step)
    except Exception as e:  # noqa: BLE001 - a damaged checkpoint is named by the restore
      logging.debug("Config of step %d unreadable: %s", step, e)
      continue
    started_from = source(saved)
    if started_from != wanted:
      raise errors.BadValue(
        f"{workdir} holds checkpoints of a run with init.from={started_from or '(none)'}, "
        f"and this one has init.from={wanted or '(none)'}; resume with the same init.from, "
        "or train into a new --workdir."
      )
    return


def initial_params(imported: Import, abstract_params: Any) -> Any:
  """The import's parameters in the run's shardings: the state of step 0."""
  checkpointing.check_compatible(imported.directory, imported.step, abstract_params)
  return checkpointing.restore_params(imported.directory, imported.step, abstract_params)

"""Self-contained Orbax checkpoints: parameters, train state, data iterator, config, tokenizer.

Layout of `WORKDIR/checkpoints/<step>/`:
  params/      the parameter tree (Orbax StandardSave: sharded arrays written by every
               process, restored straight into the target sharding)
  train_state/ the rest of what resuming needs: optimizer state, step and dropout RNG
  data_iter/   the Grain iterator state, one JSON file per process
  config/      the experiment config as JSON
  tokenizer/   the SentencePiece model file, loadable by SentencePiece itself (an imported
               Marian model: its source.spm, target.spm and vocab.json instead; other
               imported tokenizers: their own files and tokenizer_kind.json naming the kind)

Parameters and optimizer state are separate items so that inference (translate, evaluate,
average, attention) restores `params` alone: the Adam moments are twice its size. Averaged
and best-BLEU checkpoints hold only params, config and tokenizer.

Saving is asynchronous (training continues while arrays are written); Orbax writes each step
into a temporary directory and renames it only when complete, so a crash never leaves a
half-written checkpoint that looks finished.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from transformer_mt.config import defaults
from transformer_mt.data.tokenizer import AnyTokenizer
from transformer_mt.runtime import errors
from transformer_mt.workdir import orbax_loops, replica_writes, retention
from transformer_mt.workdir.tokenizer_item import TokenizerRestore, TokenizerSave, tokenizer_files


def absolute(path: str) -> str:
  """`path` made absolute against the current directory (Orbax refuses relative paths);
  URLs such as gs://bucket/dir are returned as they are."""
  return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def checkpoint_dir(workdir: str) -> str:
  """WORKDIR/checkpoints, absolute: the directory the CheckpointManager owns."""
  return str(epath.Path(absolute(workdir)) / "checkpoints")


# Files each checkpoint item cannot be read without (globs, relative to the item's directory);
# the tokenizer's depend on its kind (`tokenizer_files`).
REQUIRED_FILES = {
  "params": ("_METADATA", "manifest.ocdbt"),
  "train_state": ("_METADATA", "manifest.ocdbt"),
  "data_iter": ("process_*-of-*.json",),
  "config": ("metadata",),
}
# tensorstore status codes of a read that found a file missing, short or unreadable.
_DAMAGE_CODES = ("DATA_LOSS", "NOT_FOUND", "OUT_OF_RANGE")
# A missing data file of an OCDBT array store reads back as no bytes at all, which tensorstore
# reports as FAILED_PRECONDITION, a compressed stream truncated at byte 0.
_TRUNCATED_STREAM = re.compile(r"FAILED_PRECONDITION: .*: Truncated [\w-]+ stream")


def find_damage(workdir: str, step: int, items: Sequence[str], error: BaseException) -> str | None:
  """Why a checkpoint whose restore raised `error` is damaged, or None if its files look whole.

  Damage is what a crash, a full disk or a lost file leaves: an item directory or one of
  its required files missing or empty, unparseable JSON metadata, or a read that tensorstore
  reports as missing or short data. Anything else (a config or optimizer that differs from
  the run that wrote it, a path or library problem) is not damage: the caller stops and
  names it, and never skips a good checkpoint.
  """
  step_dir = epath.Path(checkpoint_dir(workdir)) / str(step)
  for item in items:
    item_dir = step_dir / item
    if not item_dir.is_dir():
      return f"{item_dir} is missing"
    required = tokenizer_files(item_dir) if item == "tokenizer" else REQUIRED_FILES.get(item, ())
    for pattern in required:
      found = list(item_dir.glob(pattern))
      if not found:
        return f"{item_dir / pattern} is missing"
      empty = [f for f in found if f.stat().length == 0]
      if empty:
        return f"{empty[0]} is empty"
  for item in ("params", "train_state"):
    if item not in items:
      continue
    try:
      json.loads((step_dir / item / "_METADATA").read_text())
    except (OSError, ValueError) as e:
      return f"{step_dir / item / '_METADATA'} is unreadable ({type(e).__name__})"
  for cause in errors.cause_chain(error):
    message = str(cause)
    # A missing file is damage only when it is one of this checkpoint's: a file missing
    # elsewhere (a transient error, another path) must not move a good step aside.
    lost = isinstance(cause, FileNotFoundError) and _names_a_file_in(cause, step_dir)
    if lost or isinstance(cause, json.JSONDecodeError):
      return f"{type(cause).__name__}: {message.splitlines()[0][:200]}"
    if message.startswith(_DAMAGE_CODES) or _TRUNCATED_STREAM.match(message):
      file = re.search(r'local file "([^"]+)"', message)
      return message.split(":", 1)[0] + (f" reading {file.group(1)}" if file else "")
  return None


def _names_a_file_in(error: FileNotFoundError, step_dir: epath.Path) -> bool:
  """Whether `error` is about a path inside `step_dir` (its filename, or else its message)."""
  step = os.path.realpath(os.fspath(step_dir))
  named = [error.filename, error.filename2] if error.filename else []
  if named:
    return any(
      name is not None and os.path.realpath(os.fspath(name)).startswith(step + os.sep)
      for name in named
    )
  return step + os.sep in str(error) or os.fspath(step_dir) + os.sep in str(error)


def restore_failure(workdir: str, step: int, error: BaseException) -> str:
  """One line for a restore that failed although the checkpoint's files are whole."""
  first_line = (str(error).strip().splitlines() or [""])[0][:300]
  text = str(error)
  if "tree structures do not match" in text or "node type mismatch" in text:
    hint = (
      "The optimizer or model settings differ from those of the run that wrote it (e.g. "
      "train.grad_clip_norm); resume with the config it was trained with (saved in its "
      "config/ item), or train into a new --workdir."
    )
  else:
    hint = "Rerun with --debug for the traceback."
  return (
    f"Cannot restore the checkpoint of step {step} in {workdir} ({type(error).__name__}: "
    f"{first_line}). Its files are whole, so it was not skipped and nothing was changed. {hint}"
  )


def make_manager(
  workdir: str, keep: int | None = None, save_every: int = 1, read_only: bool = False
) -> ocp.CheckpointManager:
  """A manager saving every `save_every` steps (plus forced saves) and keeping the last `keep`
  regular ones (None: all of them) and the newest (retention.KeepRegular). `read_only` ones
  (translation, inspection) create and delete nothing."""
  if read_only:
    options = ocp.CheckpointManagerOptions(
      read_only=True, create=False, enable_async_checkpointing=False
    )
  else:
    replica_writes.use_orbax_default_on_tpu_only()
    # Only the fixed interval: Orbax's default policy would also save the very first step.
    options = ocp.CheckpointManagerOptions(
      create=True,
      enable_async_checkpointing=True,
      save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(save_every),
      # Reads the marks of older checkpoints through the manager, once it exists.
      preservation_policy=retention.KeepRegular(
        keep, save_every, lambda step: retention.is_resume_point(manager, step)
      ),
    )
  manager = ocp.CheckpointManager(
    checkpoint_dir(workdir),
    options=options,
    item_names=("params", "train_state", "data_iter", "config", "tokenizer"),
  )
  return manager


def make_best_manager(workdir: str) -> ocp.CheckpointManager:
  """WORKDIR/best/checkpoints: only the checkpoint with the highest validation BLEU survives."""
  replica_writes.use_orbax_default_on_tpu_only()
  options = ocp.CheckpointManagerOptions(
    max_to_keep=1,
    best_fn=lambda metrics: metrics["bleu"],
    best_mode="max",
    keep_checkpoints_without_metrics=False,
    create=True,
    enable_async_checkpointing=True,
  )
  return ocp.CheckpointManager(
    checkpoint_dir(str(epath.Path(workdir) / "best")),
    options=options,
    item_names=("params", "config", "tokenizer"),
  )


def _model_items(params: Any, config: ml_collections.ConfigDict, tokenizer: AnyTokenizer) -> dict:
  """What every checkpoint holds to be self-contained: parameters, config and tokenizer."""
  return {
    "params": ocp.args.StandardSave(params),
    "config": ocp.args.JsonSave(json.loads(config.to_json())),
    "tokenizer": TokenizerSave(tokenizer),
  }


def _resume_state(state: Any) -> dict:
  """The `train_state` item: everything of a TrainState but its params."""
  return {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}


def save_best(
  manager: ocp.CheckpointManager,
  step: int,
  params: Any,
  config: ml_collections.ConfigDict,
  tokenizer: AnyTokenizer,
  bleu: float,
) -> None:
  """Offers parameters scored by validation BLEU; Orbax keeps them only if they are the best.
  A step already kept is left as it is: a resumed run may train it again (after a damaged
  checkpoint or a kill between the two saves), and Orbax refuses a second save of a step."""
  if step in manager.all_steps():
    logging.info("The best-BLEU checkpoint is already that of step %d; kept as it is.", step)
    return
  manager.save(
    step,
    force=True,
    metrics={"bleu": float(bleu)},
    args=ocp.args.Composite(**_model_items(params, config, tokenizer)),
  )


def save(
  manager: ocp.CheckpointManager,
  step: int,
  state: Any,
  data_iterator,
  config: ml_collections.ConfigDict,
  tokenizer: AnyTokenizer,
  force: bool = False,
  resume_point_only: bool = False,
) -> bool:
  """Starts an asynchronous save of everything needed to resume or translate.

  Args:
    state: a TrainState; its params and the rest of it become separate items.
    data_iterator: the Grain iterator, saved at the first batch not yet trained on.
    force: save although `step` is not a multiple of the manager's `save_every`.
    resume_point_only: mark it as saved off the checkpoint grid (retention.RESUME_POINT_ONLY):
      never averaged, deleted once a newer checkpoint is on disk.

  Returns:
    Whether a save was started (False: not a save step, and not forced).
  """
  return manager.save(
    step,
    force=force,
    custom_metadata={retention.RESUME_POINT_ONLY: True} if resume_point_only else None,
    args=ocp.args.Composite(
      train_state=ocp.args.StandardSave(_resume_state(state)),
      data_iter=grain.checkpoint.CheckpointSave(data_iterator),
      **_model_items(state.params, config, tokenizer),
    ),
  )


def shape_mismatches(workdir: str, step: int, abstract_params: Any) -> list[str]:
  """Parameters whose saved shape differs from the current model's ("name: saved vs now")."""
  path = epath.Path(checkpoint_dir(resolve_workdir(workdir))) / str(step) / "params"
  with orbax_loops.remaining_tasks_awaited():
    saved = ocp.StandardCheckpointer().metadata(path)
  saved = getattr(saved, "item_metadata", saved)
  saved_shapes = {
    jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(saved)
  }
  if not saved_shapes:
    # Orbax returns an empty tree when the array store is unreadable (e.g. truncated files):
    # that is damage for the restore to report, not a model with no parameters in common.
    raise OSError(f"No parameter metadata could be read from {path}.")
  wanted = {
    jax.tree_util.keystr(k): tuple(v.shape)
    for k, v in jax.tree_util.tree_leaves_with_path(abstract_params)
  }
  problems = [
    f"{name}: checkpoint {saved_shapes[name]} vs model {shape}"
    for name, shape in wanted.items()
    if name in saved_shapes and saved_shapes[name] != shape
  ]
  problems += [f"{name}: only in the model" for name in wanted if name not in saved_shapes]
  problems += [f"{name}: only in the checkpoint" for name in saved_shapes if name not in wanted]
  return sorted(problems)


class ModelMismatch(errors.BadValue):
  """The model config's parameter shapes differ from a checkpoint's."""


def check_compatible(workdir: str, step: int, abstract_params: Any) -> None:
  """Raises a ValueError listing the mismatched parameters if the model does not fit."""
  problems = shape_mismatches(workdir, step, abstract_params)
  if problems:
    shown = "; ".join(problems[:10]) + (
      f"; ... ({len(problems)} in all)" if len(problems) > 10 else ""
    )
    raise ModelMismatch(
      f"The model config does not match the checkpoint of step {step} in {workdir}: "
      f"{shown}. Use the config the checkpoint was trained with, or a new workdir."
    )


class OldCheckpointFormat(errors.BadValue):
  """A checkpoint written before parameters and optimizer state were separate items."""


def check_format(workdir: str, step: int) -> None:
  """Raises OldCheckpointFormat for a checkpoint with a `state` item and no `params` item."""
  step_dir = epath.Path(checkpoint_dir(resolve_workdir(workdir))) / str(step)
  if (step_dir / "state").is_dir() and not (step_dir / "params").exists():
    raise OldCheckpointFormat(
      f"The checkpoint of step {step} in {workdir} was written by an older version of "
      "transformer_mt (one `state` item; this version reads separate `params` and "
      "`train_state` items). Retrain into a new --workdir, or use the older version."
    )


def restore_training(
  manager: ocp.CheckpointManager, step: int, abstract_state: Any, data_iterator=None
) -> tuple[Any, Any]:
  """Restores the train state into the shardings of `abstract_state` and the iterator in place.

  Args:
    abstract_state: a TrainState of jax.ShapeDtypeStruct with `.sharding` set (built from
      the current config, so restoring never depends on how the checkpoint was sharded).
    data_iterator: None for a finished run, whose iterator is not needed.

  Returns:
    The TrainState (params and the `train_state` item joined) and the iterator.
  """
  items = {
    "params": ocp.args.StandardRestore(abstract_state.params),
    "train_state": ocp.args.StandardRestore(_resume_state(abstract_state)),
  }
  if data_iterator is not None:
    items["data_iter"] = grain.checkpoint.CheckpointRestore(data_iterator)
  with orbax_loops.remaining_tasks_awaited():
    restored = manager.restore(step, args=ocp.args.Composite(**items))
  state = abstract_state.replace(params=restored["params"], **restored["train_state"])
  return state, restored.get("data_iter")


def read_config(
  workdir: str, step: int | None = None
) -> tuple[ml_collections.ConfigDict, AnyTokenizer, int]:
  """Config, tokenizer and step of a checkpoint (default: the latest), without any arrays.

  The config is completed from `config/defaults.py` (`defaults.complete`): a checkpoint saved
  before a key was declared, or an import's partial config, reads back with every key.

  Args:
    workdir: a workdir, its checkpoints/ directory, or an averaged checkpoint's directory.
    step: the checkpoint to read; None for the latest.

  Returns:
    (config, tokenizer, step): the step actually read.

  Raises:
    FileNotFoundError: no such directory, or no checkpoint in it.
    ValueError: no checkpoint of `step`, one of an older format, or a damaged one.
  """
  manager = make_manager(resolve_workdir(workdir), read_only=True)
  steps = manager.all_steps()
  if not steps:
    raise errors.MissingFile(
      f"No checkpoint found under {checkpoint_dir(resolve_workdir(workdir))}. "
      "Train first, or pass the workdir of a finished run."
    )
  step = max(steps) if step is None else step
  if step not in steps:
    raise errors.BadValue(
      f"No checkpoint of step {step} in {workdir}; available steps: {sorted(steps)}"
    )
  check_format(workdir, step)
  restored = _restore_for_reading(
    manager,
    resolve_workdir(workdir),
    step,
    "config and tokenizer",
    config=ocp.args.JsonRestore(),
    tokenizer=TokenizerRestore(),
  )
  config = defaults.complete(ml_collections.ConfigDict(restored["config"]))
  return config, restored["tokenizer"], step


def restore_params(workdir: str, step: int, abstract_params: Any) -> Any:
  """Only the parameters of a checkpoint (translation, averaging); the optimizer state is
  never read.

  Args:
    abstract_params: a tree of jax.ShapeDtypeStruct with `.sharding` set (`model_setup`'s
      abstract_params): the arrays are restored into those shardings.

  Raises:
    ValueError: a checkpoint of an older format, or a damaged one (one line naming the step).
  """
  check_format(workdir, step)
  workdir = resolve_workdir(workdir)
  manager = make_manager(workdir, read_only=True)
  params = ocp.args.StandardRestore(abstract_params)
  return _restore_for_reading(manager, workdir, step, "parameters", params=params)["params"]


def _restore_for_reading(manager, workdir: str, step: int, what: str, **items) -> Any:
  """`manager.restore` of `items` for a reader: damage is one line naming the step."""
  try:
    with orbax_loops.remaining_tasks_awaited():
      return manager.restore(step, args=ocp.args.Composite(**items))
  except Exception as e:  # noqa: BLE001 - damage is the user's file problem, anything else a bug
    damage = find_damage(workdir, step, tuple(items), e)
    if damage is None:
      raise
    raise errors.BadValue(
      f"The {what} of checkpoint {step} in {workdir} are damaged ({damage}). Use another "
      "step (--step) or another checkpoint."
    ) from e


def resolve_workdir(path: str) -> str:
  """Accepts either a workdir or its `checkpoints/` subdirectory."""
  p = epath.Path(path)
  if not p.exists():
    raise errors.MissingFile(f"{path} does not exist.")
  return str(p.parent) if p.name == "checkpoints" else str(p)


def save_inference(
  workdir: str, step: int, params: Any, config: ml_collections.ConfigDict, tokenizer: AnyTokenizer
) -> str:
  """Writes a checkpoint of parameters, config and tokenizer (e.g. averaged parameters): it
  translates like any other, and cannot be resumed. Waits until it is on disk.

  Returns:
    The checkpoint's directory, WORKDIR/checkpoints/STEP.
  """
  manager = make_manager(workdir, keep=None)
  manager.save(step, force=True, args=ocp.args.Composite(**_model_items(params, config, tokenizer)))
  manager.wait_until_finished()
  manager.close()
  return str(epath.Path(checkpoint_dir(workdir)) / str(step))


def saved_process_count(workdir: str, step: int) -> int | None:
  """How many processes wrote the data-iterator state of a checkpoint (None if unknown)."""
  files = (epath.Path(checkpoint_dir(workdir)) / str(step) / "data_iter").glob(
    "process_*-of-*.json"
  )
  counts = {int(f.name.rsplit("-of-", 1)[1].removesuffix(".json")) for f in files}
  return counts.pop() if len(counts) == 1 else None


def all_steps(workdir: str) -> list[int]:
  """The steps of the workdir's checkpoints, ascending ([] when there are none)."""
  return sorted(make_manager(resolve_workdir(workdir), read_only=True).all_steps())


def regular_steps(workdir: str) -> list[int]:
  """The steps of the workdir's regular checkpoints (on the checkpoint grid), ascending: the
  ones a final model averages (retention.regular_steps)."""
  return retention.regular_steps(make_manager(resolve_workdir(workdir), read_only=True))


def wait(manager: ocp.CheckpointManager) -> None:
  manager.wait_until_finished()
  logging.info("Checkpoints on disk: %s", manager.all_steps())

"""Resuming a run: the newest checkpoint of the workdir that reads back.

A checkpoint with missing, empty or truncated files is skipped with a warning, and the one
before it is tried; anything else that stops a restore is reported, never skipped. Once a
checkpoint reads back, the damaged ones after it are moved to WORKDIR/checkpoints_damaged/:
kept for a post-mortem, and out of Orbax's step list, which would otherwise still call the
damaged step the latest and refuse to save that step again (StepAlreadyExistsError when the
run ends or is preempted exactly there).
"""

from __future__ import annotations

import logging

import jax
from etils import epath

from transformer_mt.data import corpus_fingerprint
from transformer_mt.runtime import distributed, errors
from transformer_mt.workdir import checkpointing

# Beside WORKDIR/checkpoints, never inside it: Orbax lists every step-named directory there.
DAMAGED_DIR = "checkpoints_damaged"


def restore_latest_readable(manager, workdir, abstract_state, make_batches, num_steps):
  """(step, state, batches, counts) from the newest checkpoint that reads back, or None.

  Only a checkpoint with missing, empty or truncated files (`checkpointing.find_damage`) is
  skipped with a warning, and the one before it is tried; Orbax never lists a save still
  in progress (it is written to a temporary directory and renamed when complete). Any
  other failure stops with one line naming it, since skipping would silently discard good
  work: a checkpoint of the older one-item layout, a model that does not fit the checkpoint
  (the mismatched names), an optimizer that differs, or resuming with another number of
  processes (each reads its own data shard, so the batch order depends on it), except for
  a finished run, whose data iterator is not needed.

  The damaged checkpoints skipped before a readable one are set aside (`set_aside_damaged`)
  and `manager` reloads its step list; with none readable nothing is moved.
  """
  steps = sorted(manager.all_steps(), reverse=True)
  damaged = {}
  for step in steps:
    finished = step >= num_steps
    items = ("params", "train_state") + (() if finished else ("data_iter",))
    checkpointing.check_format(workdir, step)
    try:
      checkpointing.check_compatible(workdir, step, abstract_state.params)
    except checkpointing.ModelMismatch:
      raise
    except Exception as e:  # noqa: BLE001 - the restore below tells damage from other errors
      logging.debug("Metadata of step %d unreadable: %s", step, e)
    written_by = checkpointing.saved_process_count(workdir, step)
    if written_by not in (None, jax.process_count()) and not finished:
      raise errors.BadValue(
        f"The checkpoint of step {step} in {workdir} was written by {written_by} "
        f"processes, and this run has {jax.process_count()}. Resume with "
        f"{written_by} processes: the data order depends on the process count."
      )
    batches, counts = make_batches()
    try:
      if finished:
        state, _ = checkpointing.restore_training(manager, step, abstract_state)
      else:
        state, batches = checkpointing.restore_training(manager, step, abstract_state, batches)
    except Exception as e:  # noqa: BLE001 - sorted into damage and real errors just below
      changed = next(
        (c for c in errors.cause_chain(e) if isinstance(c, corpus_fingerprint.CorpusChanged)),
        None,
      )
      if changed is not None:  # the checkpoint is whole; the data are not what it was on
        raise errors.BadValue(f"Cannot resume from step {step} in {workdir}: {changed}") from e
      damage = checkpointing.find_damage(workdir, step, items, e)
      if damage is None:
        raise errors.BadValue(checkpointing.restore_failure(workdir, step, e)) from e
      logging.warning(
        "Checkpoint %d in %s is damaged (%s); falling back to the previous one.",
        step,
        workdir,
        damage,
      )
      damaged[step] = damage
      continue
    logging.info("Resumed from the checkpoint of step %d in %s.", step, workdir)
    if damaged:
      set_aside_damaged(workdir, damaged)
      manager.reload()
    return step, state, batches, counts
  if steps:
    raise errors.BadValue(
      f"Every checkpoint in {checkpointing.checkpoint_dir(workdir)} is damaged (steps "
      f"{sorted(damaged)}; see the warnings above) and nothing was changed. Train into a new "
      "--workdir to start afresh."
    )
  return None


def set_aside_damaged(workdir: str, damaged: dict[int, str]) -> None:
  """Moves the damaged steps (step -> damage) to WORKDIR/checkpoints_damaged/STEP, or STEP-2,
  STEP-3... for later damaged copies of the same step, with a warning for each.

  Process 0 moves them (the workdir is shared); every process waits for it at a barrier, so
  none reads the step list before the moves.
  """
  if distributed.is_primary():
    aside = epath.Path(checkpointing.absolute(workdir)) / DAMAGED_DIR
    aside.mkdir(parents=True, exist_ok=True)
    for step, damage in sorted(damaged.items()):
      destination, copy = aside / str(step), 1
      while destination.exists():
        copy += 1
        destination = aside / f"{step}-{copy}"
      (epath.Path(checkpointing.checkpoint_dir(workdir)) / str(step)).rename(destination)
      logging.warning(
        "Moved the damaged checkpoint of step %d (%s) to %s; training can save that step "
        "again. Delete it once it is no longer needed.",
        step,
        damage,
        destination,
      )
  distributed.barrier("damaged checkpoints set aside")

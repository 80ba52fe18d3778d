"""Checkpoint averaging: the paper's final models average the last 5 (Base) or 20 (Big)
checkpoints. The result is a self-contained checkpoint directory that `translate`
and `evaluate` take like any workdir.
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp

from transformer_mt.model import setup as run_setup
from transformer_mt.runtime import errors, sharding
from transformer_mt.workdir import checkpointing


def average_last(workdir: str, last_n: int, output_dir: str | None = None) -> tuple[str, list[int]]:
  """Writes the mean parameters of the last `last_n` regular checkpoints of `workdir`.

  Regular: on the checkpoint grid. A resume point (a save forced off it: a signal's stop, the
  last step of a run whose num_steps is off the grid) is never averaged (workdir/retention.py).
  The running mean m_k = m_{k-1} + (x_k - m_{k-1}) / k is accumulated in float32, so
  averaging identical checkpoints returns them bit for bit. Only the `params` items are
  read and written: an averaged model is for translation, not for resuming, so it has
  no optimizer state. It is saved under the newest averaged step.

  Args:
    output_dir: where the average goes (default WORKDIR/averaged_last{N}); it must not hold
      checkpoints yet.

  Returns:
    The output directory and the averaged steps, ascending.

  Raises:
    errors.BadValue: last_n < 1, or fewer than `last_n` regular checkpoints in `workdir`.
    errors.AlreadyExists: `output_dir` already holds checkpoints.
  """
  steps = checkpointing.regular_steps(workdir)
  if last_n < 1 or len(steps) < last_n:
    skipped = sorted(set(checkpointing.all_steps(workdir)) - set(steps))
    also = f" and resume point(s) {skipped}, never averaged" if skipped else ""
    raise errors.BadValue(
      f"{workdir} holds {len(steps)} checkpoint(s) on the train.checkpoint_every grid {steps}"
      f"{also}; cannot average the last {last_n}. Train with train.keep_checkpoints >= "
      f"{max(last_n, 1)} to keep enough."
    )
  chosen = steps[-last_n:]
  output_dir = output_dir or os.path.join(
    checkpointing.resolve_workdir(workdir), f"averaged_last{last_n}"
  )
  if os.path.exists(checkpointing.checkpoint_dir(output_dir)):
    raise errors.AlreadyExists(
      f"{output_dir} already holds checkpoints; remove it or pass another --output directory."
    )
  config, tokenizer, _ = checkpointing.read_config(workdir, chosen[-1])
  # The devices this command runs on, not the training mesh (which may need more of them).
  mesh = sharding.make_mesh(sharding.inference_mesh_config())
  # The saved config stays the checkpoint's, kernel included.
  target = run_setup.model_setup(run_setup.runnable_here(config), tokenizer, mesh).abstract_params
  mean = mean_params(workdir, chosen, target)
  checkpointing.save_inference(output_dir, chosen[-1], mean, config, tokenizer)
  return output_dir, chosen


def final_model(workdir: str, last_n: int) -> tuple[str, list[int]]:
  """The final model of a run that averages its last `last_n` checkpoints (`train` and
  `reproduce` with evaluate.average_last = N > 1): WORKDIR/averaged_lastN_toSTEP, written
  here or, when an earlier call averaged the same steps, reused. N is fewer only when the run
  ended (stopped early) before it wrote `last_n` regular checkpoints; with none at all the
  final model is the workdir's latest checkpoint itself.

  Returns:
    (the directory `translate`, `evaluate` and `score` take as --workdir, the steps it holds).
  """
  steps = checkpointing.regular_steps(workdir)[-last_n:]
  if not steps:
    logging.warning(
      "%s holds no checkpoint on the train.checkpoint_every grid to average: the final model "
      "is its latest checkpoint.",
      workdir,
    )
    return workdir, checkpointing.all_steps(workdir)[-1:]
  output = os.path.join(
    checkpointing.resolve_workdir(workdir), f"averaged_last{len(steps)}_to{steps[-1]}"
  )
  if os.path.exists(checkpointing.checkpoint_dir(output)):
    return output, steps
  return average_last(workdir, len(steps), output)


def mean_params(workdir: str, steps: list[int], target) -> object:
  """The mean of the `params` of checkpoints `steps` of `workdir`, restored into `target`
  (abstract params with their shardings) and returned in its dtypes and shardings."""
  mean = None
  for count, step in enumerate(steps, start=1):
    params = checkpointing.restore_params(workdir, step, target)
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    mean = (
      params if mean is None else jax.tree.map(lambda m, x, k=count: m + (x - m) / k, mean, params)
    )
    logging.info("Averaged checkpoint %d (%d of %d).", step, count, len(steps))
  return jax.tree.map(lambda m, x: m.astype(x.dtype), mean, target)

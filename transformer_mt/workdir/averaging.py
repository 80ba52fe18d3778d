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
  """Writes the mean parameters of the last `last_n` checkpoints of `workdir`.

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
    ValueError: last_n < 1, or fewer than `last_n` checkpoints in `workdir`.
    FileExistsError: `output_dir` already holds checkpoints.
  """
  steps = checkpointing.all_steps(workdir)
  if last_n < 1 or len(steps) < last_n:
    raise errors.BadValue(
      f"{workdir} holds {len(steps)} checkpoint(s) {steps}; cannot average the last "
      f"{last_n}. Train with train.keep_checkpoints >= {max(last_n, 1)} to keep enough."
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
  target = run_setup.model_setup(config, tokenizer, mesh).abstract_params
  mean = mean_params(workdir, chosen, target)
  checkpointing.save_inference(output_dir, chosen[-1], mean, config, tokenizer)
  return output_dir, chosen


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

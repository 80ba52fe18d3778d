"""A run's host-dependent settings, resolved once and recorded: `train.prng_impl` (the dropout
PRNG, training/dropout_rng.py) and `data.num_workers` (input worker processes,
data/worker_count.py).

Either may be "auto": what suits the host the run starts on. It is resolved once, when the run
starts, and the run's config, which every checkpoint saves, holds the resolved value, so a
checkpoint says which PRNG made its key and how many workers made its batch stream. A resume
reads the config of the workdir's newest readable checkpoint:
  - "auto" takes the recorded value: the run goes on as it began, whatever host it moved to
    (another worker count would change the batch order, another PRNG the key's shape and the
    masks);
  - an explicit `train.prng_impl` that differs from the recorded one stops with one error
    line, before anything is written. (An explicit `data.num_workers` that differs is refused
    when the data iterator is restored, batch_stream.py, as before "auto" existed.)
A checkpoint written before `train.prng_impl` existed reads back as "threefry2x32"
(`defaults.complete`), the only PRNG there was.
"""

from __future__ import annotations

import copy
import logging
import os

import ml_collections

from transformer_mt.data import worker_count
from transformer_mt.runtime import errors
from transformer_mt.training import dropout_rng
from transformer_mt.workdir import checkpointing


def check(config: ml_collections.ConfigDict) -> None:
  """Raises BadValue for a `train.prng_impl` or `data.num_workers` that names no choice."""
  dropout_rng.check(config.train.prng_impl)
  worker_count.check(config.data.num_workers)


def recorded_config(workdir: str) -> ml_collections.ConfigDict | None:
  """The config of the newest checkpoint in `workdir` whose config reads back, or None (no
  checkpoints; a damaged one is skipped here, and named by the restore)."""
  if not os.path.isdir(checkpointing.checkpoint_dir(workdir)):
    return None
  for step in reversed(checkpointing.all_steps(workdir)):
    try:
      return checkpointing.read_config(workdir, step)[0]
    except Exception as e:  # noqa: BLE001 - a damaged checkpoint is named by the restore
      logging.debug("Config of step %d unreadable: %s", step, e)
  return None


def resolved(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """A copy of `config` with `train.prng_impl` and `data.num_workers` resolved for a run in
  `workdir` (module docstring); `config` itself is left as it is.

  Raises:
    errors.BadValue: a value that names no choice, or a `train.prng_impl` other than the one
      the workdir's checkpoints were trained with.
  """
  check(config)
  recorded = recorded_config(workdir)
  prng_impl, num_workers = config.train.prng_impl, config.data.num_workers
  if recorded is not None:
    saved_impl = recorded.train.prng_impl
    if prng_impl == dropout_rng.AUTO:
      prng_impl = saved_impl
    elif saved_impl != dropout_rng.AUTO and prng_impl != saved_impl:
      raise errors.BadValue(
        f"{workdir} holds checkpoints trained with train.prng_impl={saved_impl}, and this run "
        f"has train.prng_impl={prng_impl}: the dropout key of one is no key of the other. "
        f"Resume with train.prng_impl={saved_impl} (or 'auto'), or train into a new --workdir."
      )
    if num_workers == worker_count.AUTO:
      num_workers = recorded.data.num_workers
  run_config = copy.deepcopy(config)
  with run_config.unlocked():
    run_config.train.prng_impl = dropout_rng.resolve(prng_impl)
    _set(run_config.data, "num_workers", worker_count.resolve(num_workers))
  return run_config


def _set(section: ml_collections.ConfigDict, key: str, value) -> None:
  """section[key] = value, also where the field was typed by an "auto" string (a config
  copied with `copy_and_resolve_references` drops defaults.py's any-type field)."""
  try:
    section[key] = value
  except TypeError:
    del section[key]
    section[key] = value

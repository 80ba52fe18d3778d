"""Which replica writes a replicated array: Orbax's replica-parallel saving only on TPUs.

Orbax saves an array that several devices hold whole (data-parallel parameters, Adam moments)
"replica-parallel" by default: each replica writes one slice along the first axis, so the
writing is spread over the devices. Taking those slices runs a `jax.lax.slice_in_dim` on every
device's copy, and that is one compiled program per array shape and per device: the first save
of the tiny demo model on 8 simulated CPU devices compiles 64 of them, ~2.3 s of a ~10 s run
(measured on 2 Intel Xeon cores, orbax-checkpoint 0.12.8). Orbax already turns the option off
on GPUs (`_get_default_use_replica_parallel`, when JAX_PLATFORMS names one); on the CPU it buys
nothing either, since every replica's copy is already in host memory. So every platform but
the TPU saves each array from its first replica, as Orbax does without the option; the files
are the same either way (tests/test_checkpoint_layout.py restores them on another layout).

`use_orbax_default_on_tpu_only()` re-registers Orbax's jax.Array handler once per process,
with the options of its default registration (`type_handler_registry._DEFAULT_TYPE_HANDLERS`
in 0.12.8: an array metadata store) and `use_replica_parallel` set. It runs when a checkpoint
manager is made, after `jax.distributed` has been initialized, since it asks for the backend.
"""

from __future__ import annotations

import functools
import logging

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint._src.metadata import array_metadata_store


@functools.cache
def use_orbax_default_on_tpu_only() -> bool:
  """Registers the jax.Array handler for this platform; returns whether it writes
  replica-parallel (True only on a TPU backend)."""
  replica_parallel = jax.default_backend() == "tpu"
  if replica_parallel:
    return True
  handler = ocp.type_handlers.ArrayHandler(
    use_replica_parallel=False, array_metadata_store=array_metadata_store.Store()
  )
  # Orbax logs a warning for every override of a registered type; this one is intended.
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
  finally:
    absl_logger.setLevel(level)
  return False

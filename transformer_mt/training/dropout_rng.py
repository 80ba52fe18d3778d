"""Which PRNG draws dropout's random bits (`train.prng_impl`), and the dropout keys of a step.

A Base step draws ~400M Bernoulli values for its dropout masks. JAX's default PRNG,
"threefry2x32", computes them with a counter-based hash (tens of integer ops per 32 bits);
"rbg" and "unsafe_rbg" take them from XLA's RngBitGenerator (Philox on CPU and GPU, the
hardware generator on TPU), which is what MaxText uses on accelerators:
  - "rbg": bits from RngBitGenerator; `split` and `fold_in` (the per-step and per-micro-batch
    keys below, and Flax's per-layer keys) are threefry's;
  - "unsafe_rbg": RngBitGenerator for the key derivations too (their quality is untested,
    JAX's docs say; hence the name).
  - "auto": "unsafe_rbg" on GPU and TPU, "threefry2x32" on CPU. Proposed as the accelerator
    default once a device run has measured it; until then the default is "threefry2x32".

What each one computes. Parameters never depend on it: they come from the threefry key of
`train.seed` whatever the choice, so with dropout off every choice gives the same losses and
gradients (tests/test_dropout_rng.py). The dropout key of a run is drawn from the seed's
threefry dropout key (`initial_key_data`: threefry's own key data, as before this option
existed, or 4 words drawn from it for the RngBitGenerator state), so a seed gives the same run
every time and a checkpoint resumes bit-exactly with any choice. Other choices give other
masks, at the same rate (tested: the kept fraction of each is 1 - rate within 5 standard
errors, and masks of different steps and micro-batches are independent).

Sharding. RngBitGenerator's bits do not depend on how the array is split over devices: XLA's
SPMD partitioner replicates the op (each device generates the bits of the whole global array
and keeps its slice; JAX's jax.random docs, "identical across shardings" for rbg and
unsafe_rbg), so 8 devices train exactly as 1 does (tested on 8 CPU devices). The price is that
on k data-parallel devices each one generates k times the bits of its own shard; TPUs offer
`--xla_tpu_spmd_rng_bit_generator_unsafe=1` to partition it (bits then depend on the
sharding), GPUs nothing. threefry is partitioned (`jax_threefry_partitionable`, the default
since JAX 0.5). So on one GPU rbg draws what threefry does at a fraction of the cost; on many
data-parallel GPUs the measurement decides.

The key's data is uint32 [2] for threefry and [4] for the others, and the same words mean
different masks under each: a checkpoint records its run's choice (the saved config's
`train.prng_impl`, "auto" resolved; training/auto_settings.py) and a resume with another
choice is refused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer_mt.runtime import errors

THREEFRY = "threefry2x32"
PRNG_IMPLS = (THREEFRY, "rbg", "unsafe_rbg")
AUTO = "auto"
# Where "auto" takes XLA's generator; anywhere else (CPU) it stays threefry.
RBG_PLATFORMS = ("gpu", "tpu")
AUTO_ON_ACCELERATORS = "unsafe_rbg"


def check(name: str) -> None:
  """Raises BadValue unless `name` is one of PRNG_IMPLS or "auto"."""
  if name not in PRNG_IMPLS + (AUTO,):
    raise errors.BadValue(
      f"train.prng_impl={name!r}: expected one of {', '.join(PRNG_IMPLS + (AUTO,))}."
    )


def resolve(name: str, platform: str | None = None) -> str:
  """The implementation `name` stands for on `platform` (default: JAX's default backend):
  "auto" is "unsafe_rbg" on GPU/TPU and "threefry2x32" elsewhere; the others are themselves."""
  check(name)
  if name != AUTO:
    return name
  platform = platform or jax.default_backend()
  return AUTO_ON_ACCELERATORS if platform in RBG_PLATFORMS else THREEFRY


def key_data_shape(impl: str) -> tuple[int, ...]:
  """The shape of a key's uint32 data under `impl`: (2,) for threefry, (4,) for rbg's."""
  return jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape


def initial_key_data(threefry_key: jax.Array, impl: str) -> jax.Array:
  """uint32 key data of a run's dropout RNG under `impl`, from the seed's threefry dropout key
  (a typed key): threefry's own data (what runs stored before the choice existed), or the
  words of `impl`'s key drawn from it. Works inside jit."""
  if impl == THREEFRY:
    return jax.random.key_data(threefry_key)
  return jax.random.bits(threefry_key, key_data_shape(impl), jnp.uint32)


def step_key(key_data: jax.Array, step: jax.Array, impl: str) -> jax.Array:
  """The typed dropout key of `step` (int32 []): fold_in of the step into the run's key."""
  return jax.random.fold_in(jax.random.wrap_key_data(key_data, impl=impl), step)

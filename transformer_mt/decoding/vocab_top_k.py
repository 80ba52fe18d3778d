"""The k largest entries of long rows, as `jax.lax.top_k` returns them, found through blocks.

Beam search ranks each beam's logits over the whole vocabulary at every step (k = the beam
size or twice it, rows of 10k-250k pieces). XLA's CPU TopK is a partial sort of every row: on
2 cores, [32, 4, 9,712] float32 took ~4 ms a step, 4% of the Base shape's step and ~12% of the
Multi30k tiny model's. Here the row is cut into blocks of BLOCK entries; one reduction gives
each block's largest entry; the k best blocks by it hold the k best entries (each of those
blocks' largest entry is itself among the k best, or ties with them); a top-k over those k
blocks' entries then picks the entries, with their order and ties.

Exact, not approximate: the same values and indices as `jax.lax.top_k`, ties to the lower
index and NaN above everything included, since both stages use `jax.lax.top_k`'s own order (a
block holding a NaN gets NaN as its maximum, which that order puts first) and the candidate
blocks are taken in index order (tests/test_vocab_top_k.py, against `jax.lax.top_k` on rows
full of ties, infinities and NaN).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Entries a block: one reduction over all the row, then a top-k over n / BLOCK block maxima and
# one over k * BLOCK candidates.
BLOCK = 16
# Rows shorter than this go to jax.lax.top_k whole.
BLOCKED_FROM = 1024


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """(values [..., k], int32 indices [..., k]) of the k largest entries of x [..., n] along its
  last axis, largest first: what `jax.lax.top_k(x, k)` returns (module docstring)."""
  n = x.shape[-1]
  if n < BLOCKED_FROM or k * BLOCK * 4 > n:
    return jax.lax.top_k(x, k)
  blocks = -(-n // BLOCK)
  # -inf after the end: below every entry but NaN, and after every -inf entry (higher indices).
  widths = [(0, 0)] * (x.ndim - 1) + [(0, blocks * BLOCK - n)]
  padded = jnp.pad(x, widths, constant_values=-jnp.inf).reshape(x.shape[:-1] + (blocks, BLOCK))
  # [..., blocks]; NaN where a block holds one (XLA's CPU max reduction may skip NaN).
  block_max = jnp.where(jnp.isnan(padded).any(axis=-1), jnp.nan, jnp.max(padded, axis=-1))
  _, best_blocks = jax.lax.top_k(block_max, k)  # [..., k]
  best_blocks = jnp.sort(best_blocks, axis=-1)  # index order, so ties resolve as in x
  candidates = jnp.take_along_axis(padded, best_blocks[..., None], axis=-2)  # [..., k, BLOCK]
  values, where = jax.lax.top_k(candidates.reshape(x.shape[:-1] + (k * BLOCK,)), k)
  block = jnp.take_along_axis(best_blocks, where // BLOCK, axis=-1)
  return values, (block * BLOCK + where % BLOCK).astype(jnp.int32)

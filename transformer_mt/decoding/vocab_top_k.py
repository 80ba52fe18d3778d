"""The k largest entries of long rows, as `jax.lax.top_k` returns them, found through blocks.

Beam search ranks each beam's logits over the whole vocabulary at every step (k = the beam
size or twice it, rows of 10k-250k pieces). XLA's CPU TopK is a partial sort of every row: on
2 cores, [32, 4, 9,712] float32 took ~4 ms a step, 4% of the Base shape's step and ~12% of the
Multi30k tiny model's. Here the row is cut into blocks of BLOCK entries; one reduction gives
each block's largest entry; the k best blocks by it hold the k best entries (each of those
blocks' largest entry is itself among the k best, or ties with them); a top-k over those k
blocks' entries then picks the entries, with their order and ties.

Exact, not approximate: the same values and indices as `jax.lax.top_k`, ties to the lower
index included. Both stages rank by the order `jax.lax.top_k` sorts floats in, the IEEE total
order of XLA's TopK comparator: each float's bits read as a signed integer, all but the sign
bit flipped where it is set. So NaN with the sign bit clear (0x7fc00000) ranks above +inf, and
NaN with it set (0xffc00000, what x86 gives for inf - inf) below -inf; -0.0 below +0.0. Each
block's largest entry is found by that integer key (a float maximum may skip NaN or take either
zero), and the candidate blocks are taken in index order (tests/test_vocab_top_k.py, against
`jax.lax.top_k` on rows full of ties, infinities, signed zeros and NaN of either sign).
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
  keys = _total_order_keys(x)  # [..., n] integers, ordered as lax.top_k orders x
  # The lowest key after the end: below every entry, and after any entry of that key (higher
  # indices), so never picked while k <= n.
  widths = [(0, 0)] * (x.ndim - 1) + [(0, blocks * BLOCK - n)]
  lowest = jnp.iinfo(keys.dtype).min
  padded = jnp.pad(keys, widths, constant_values=lowest).reshape(x.shape[:-1] + (blocks, BLOCK))
  # Each block's largest entry by its key, back as the float itself: lax.top_k ranks those
  # floats as their keys rank, and its float path is the fast one (XLA's CPU TopK kernel; on
  # integers it sorts the whole row, ~20x slower at [32, 4, 9712]).
  block_max = _from_keys(jnp.max(padded, axis=-1), x.dtype)  # [..., blocks]
  _, best_blocks = jax.lax.top_k(block_max, k)  # [..., k]
  best_blocks = jnp.sort(best_blocks, axis=-1)  # index order, so ties resolve as in x
  candidates = jnp.take_along_axis(padded, best_blocks[..., None], axis=-2)  # [..., k, BLOCK]
  candidates = _from_keys(candidates.reshape(x.shape[:-1] + (k * BLOCK,)), x.dtype)
  values, where = jax.lax.top_k(candidates, k)
  block = jnp.take_along_axis(best_blocks, where // BLOCK, axis=-1)
  return values, (block * BLOCK + where % BLOCK).astype(jnp.int32)


def _total_order_keys(x: jax.Array) -> jax.Array:
  """Signed integers of x's width whose order is the IEEE total order of the floats x (XLA's
  TopK comparator, as its HLO spells it): the bits of x, the lower ones flipped where the sign
  bit is set."""
  bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"int{8 * x.dtype.itemsize}"))
  return jnp.where(bits < 0, bits ^ jnp.iinfo(bits.dtype).max, bits)


def _from_keys(keys: jax.Array, dtype) -> jax.Array:
  """The floats of `dtype` whose `_total_order_keys` are `keys` (the same flip undoes it)."""
  bits = jnp.where(keys < 0, keys ^ jnp.iinfo(keys.dtype).max, keys)
  return jax.lax.bitcast_convert_type(bits, dtype)

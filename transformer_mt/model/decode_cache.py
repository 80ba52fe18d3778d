"""The decoder's KV cache while decoding step by step: its layouts, each step's write, and
attention against it.

Self-attention appends one key/value per step to a cache of fixed length (so the decode loop
has static shapes), in one of two layouts:
* one row per hypothesis, [rows, heads, max_len, head_dim]: greedy decoding, sampling, and beam
  search that reorders the rows when beams change parents (decoding/beam_search.py);
* kept in place (`ANCESTRY`): one block per sentence for all its beams, where nothing is ever
  reordered and each beam attends to its ancestors' entries through a mask (beam search's
  CPU path from 8 sentences a batch; `_append_in_place`).
`decode_attention` attends from the step's queries to either, and to the cross-attention keys/
values (one row per sentence, projected once when the cache is created), folding a sentence's
beams into one product. Here apart from attention.py, which computes attention for training
and teacher forcing and calls these for its decode steps.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# The decode-cache leaf that marks a beam search cache kept in place: int32 [batch * beam,
# max_len], the slot of each row's ancestor at each position (`_append_in_place`);
# decoding/incremental.py's `beams_cache` creates it.
ANCESTRY = "ancestry"


def _combined(mask: jax.Array | None, step_mask: jax.Array) -> jax.Array:
  """The caller's mask (None: attend everywhere) and the step's, both True = attend."""
  return step_mask if mask is None else jnp.logical_and(mask, step_mask)


def append_self_attention(module, key, value, mask, cache_length):
  """Writes this step's key/value at `cache_index` into the cache of `module` (a
  MultiHeadAttention's self-attention); returns the whole cache and its mask.

  The cache is head-major, [batch, heads, cache_length, head_dim] (`decode_attention`), and
  so are the keys/values returned.
  """
  is_initialized = module.has_variable("cache", "cached_key")
  batch, _, heads, depth = key.shape
  if not is_initialized and cache_length is None:
    raise ValueError("cache_length is required to create the decoder self-attention cache.")
  key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)  # [batch, heads, q, head_dim]
  shape = (batch, heads, cache_length or 0, depth)
  cached_key = module.variable("cache", "cached_key", jnp.zeros, shape, key.dtype)
  cached_value = module.variable("cache", "cached_value", jnp.zeros, shape, value.dtype)
  cache_index = module.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
  if not is_initialized:
    # Cache creation: nothing is written; the step that follows starts at index 0.
    return key, value, mask
  if key.shape[2] != 1:
    raise ValueError(f"Incremental decoding takes one token per step, got {key.shape[2]}.")
  index = cache_index.value
  if module.has_variable("cache", ANCESTRY):
    return _append_in_place(module, key, value, mask, cached_key, cached_value, cache_index)
  cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, 0, index, 0))
  cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, 0, index, 0))
  cache_index.value = index + 1
  total = cached_key.value.shape[2]
  # The new token sees every cached position up to and including itself.
  step_mask = (jnp.arange(total) <= index)[None, None, None, :]  # [1, 1, 1, cache_len]
  return cached_key.value, cached_value.value, _combined(mask, step_mask)


def _append_in_place(module, key, value, mask, cached_key, cached_value, cache_index):
  """The step of a beam search whose cache is never reordered (`ANCESTRY`).

  The self-attention cache then holds one block per sentence, values [batch, heads,
  cache_length * beam, head_dim] and keys transposed, [batch, heads, head_dim, cache_length *
  beam] (`decode_attention`'s keys_transposed), position-major: entry t * beam + j holds what
  the hypothesis in beam slot j wrote at step t, and stays so (one in-place write of the
  beam's entries per step). The
  `ANCESTRY` leaf, int32 [batch * beam, cache_length], says for each row which slot held its
  hypothesis' prefix at each position (-1 beyond the step); beam search reorders that small
  leaf instead of the keys/values. Each row attends to its sentence's cache_length x beam
  entries through a mask that keeps only its ancestors' (`decode_attention` folds a
  sentence's beams into one product): the same keys, values and weights as a reordered
  cache, summed over more, masked, terms. Returns the keys/values and the mask
  [rows, 1, 1, cache_length * beam].
  """
  batch, heads, entries, depth = cached_value.value.shape
  rows = key.shape[0]
  beam = rows // batch
  index = cache_index.value

  def per_sentence(x):  # [rows, heads, 1, head_dim] -> [batch, heads, beam, head_dim]
    return jnp.swapaxes(x.reshape(batch, beam, heads, depth), 1, 2)

  entry = index * beam  # the first of this step's beam entries
  cached_key.value = jax.lax.dynamic_update_slice(
    cached_key.value, jnp.swapaxes(per_sentence(key), 2, 3), (0, 0, 0, entry)
  )
  cached_value.value = jax.lax.dynamic_update_slice(
    cached_value.value, per_sentence(value), (0, 0, entry, 0)
  )
  cache_index.value = index + 1
  ancestry = module.variable("cache", ANCESTRY)
  slots = (jnp.arange(rows, dtype=jnp.int32) % beam)[:, None]  # [rows, 1]
  ancestry.value = jax.lax.dynamic_update_slice(ancestry.value, slots, (0, index))
  # Row r sees entry t * beam + j iff slot j held r's prefix at step t: [rows, length, beam].
  sees = ancestry.value[:, :, None] == jnp.arange(beam, dtype=jnp.int32)[None, None, :]
  step_mask = sees.reshape(rows, 1, 1, entries)
  return cached_key.value, cached_value.value, _combined(mask, step_mask)


def rows_first(x: jax.Array, rows: int) -> jax.Array:
  """A head-major cache array [batch, heads, k, head_dim] as [rows, k, heads, head_dim], its
  rows repeated to one per beam if it holds one per sentence."""
  return jnp.repeat(jnp.swapaxes(x, 1, 2), rows // x.shape[0], axis=0)


def decode_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  mask: jax.Array | None,
  keys_transposed: bool = False,
) -> jax.Array:
  """softmax(q K^T / sqrt(d_k)) V against a decode cache: head-major keys/values, beams folded.

  The cache is kept head-major, [batch, heads, len, head_dim]: both products then have
  their batch dimensions (batch, heads) leading, as XLA's dot wants them. Kept
  [batch, len, heads, head_dim], as `jax.nn.dot_product_attention` takes it, XLA
  transposed the whole cache at every step (on CPU ~7x the time of the attention itself at
  128 rows x 64 cached positions).

  Beams folded into the query axis: when the keys/values have fewer rows than `query` (the
  cross-attention keys/values, one row per source sentence instead of a copy per beam),
  query row r attends to key row r // beam, beam = query rows / key rows: rows
  b * beam ... b * beam + beam - 1 are the beams of sentence b (beam_search's layout), and
  the beam_size queries of a sentence go through one product with its keys.

  Logits are float32 (scaled after the product) and softmax runs in float32, masked
  positions get a large negative number: as in `jax.nn.dot_product_attention`.

  `keys_transposed`: the keys come as [batch, heads, head_dim, kv_len] (the cross-attention
  keys, and a beam search cache kept in place, `_append_in_place`): the product of the
  beam x q queries with a sentence's keys is then a plain matrix product; taken [kv_len,
  head_dim], XLA's CPU kernels repacked the whole cache at every step (on 2 cores, 7.3
  against 3.9 ms a layer for the Base shape at 32 sentences).

  Args:
    query: [rows, q, heads, head_dim].
    key, value: [batch, heads, kv_len, head_dim], rows a multiple of batch.
    mask: boolean, broadcastable to [rows, heads, q, kv_len]; True = attend.
    keys_transposed: key is [batch, heads, head_dim, kv_len].

  Returns:
    [rows, q, heads, head_dim].
  """
  rows, q_len, heads, depth = query.shape
  batch, _, kv_len, _ = value.shape
  beam = rows // batch

  def fold(x):  # [rows, h, q, ...] -> [batch, h, beam * q, ...]
    x = jnp.swapaxes(x.reshape((batch, beam) + x.shape[1:]), 1, 2)  # [batch, h, beam, q, ...]
    return x.reshape((batch, x.shape[1], beam * q_len) + x.shape[4:])

  query = fold(jnp.swapaxes(query, 1, 2))  # [batch, heads, beam * q, head_dim]
  if keys_transposed:
    logits = jnp.einsum("bhqd,bhdk->bhqk", query, key, preferred_element_type=jnp.float32)
  else:
    logits = jnp.einsum(
      "bhqd,bhkd->bhqk", query, key, preferred_element_type=jnp.float32
    )  # [batch, heads, beam * q, kv_len]
  logits = logits * jnp.float32(1.0 / math.sqrt(depth))
  if mask is not None:
    mask = jnp.broadcast_to(mask, (rows, mask.shape[1], q_len, kv_len))
    logits = jnp.where(fold(mask), logits, -0.7 * jnp.finfo(jnp.float32).max)
  probs = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
  context = jnp.einsum("bhqk,bhkd->bhqd", probs, value)  # [batch, heads, beam * q, head_dim]
  context = context.reshape(batch, heads, beam, q_len, depth)
  return jnp.transpose(context, (0, 2, 3, 1, 4)).reshape(rows, q_len, heads, depth)

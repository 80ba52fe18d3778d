"""Transcriptions of cuDNN's packed ("ragged") layout for tests/test_fused_kernels.py, since
no CPU runs cuDNN: the layout JAX's API takes, written out in NumPy (`numpy_layout`); the
attention it documents, pairing sentence slot m of a row's queries with slot m of its keys
(`emulated_cudnn`, outputs and gradients); and what the kernel gets after JAX compacts the
slots across the batch (`compacted_cudnn`, forward only). Each takes the keyword arguments
of `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`, so a test puts it in
place of `fused_kernels._cudnn_dot_product_attention`."""

import functools

import jax
import jax.numpy as jnp
import numpy as np


def numpy_layout(segments, num_segments):
  """cuDNN's packed layout by hand: per row, slot m - 1 holds sentence m's token count and
  first token, -1 where the row has no sentence m; offsets get one more -1 column."""
  rows = segments.shape[0]
  seqlens = np.full((rows, num_segments), -1, np.int32)
  offsets = np.full((rows, num_segments + 1), -1, np.int32)
  for row in range(rows):
    for m in range(1, num_segments + 1):
      where = [t for t, s in enumerate(segments[row]) if s == m]
      if where:
        seqlens[row, m - 1], offsets[row, m - 1] = len(where), where[0]
  return seqlens, offsets


def slots_of(seqlens, offsets, length):
  """int [batch, length]: the layout slot each token belongs to (-1: none), and the token's
  position within its slot: what the layout says, read without segment ids."""
  positions = jnp.arange(length)
  start = offsets[:, :-1, None]  # [batch, M, 1]
  inside = (
    (seqlens[:, :, None] > 0) & (positions >= start) & (positions < start + seqlens[:, :, None])
  )
  slot = jnp.where(inside.any(1), jnp.argmax(inside, axis=1), -1)  # [batch, length]
  local = positions - jnp.take_along_axis(offsets, jnp.maximum(slot, 0), axis=1)
  return slot, local


def _attend(query, key, value, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, causal):
  """Slot m of the queries attends to slot m of the keys (causal within it); zeros for
  queries outside every slot. Also returns which queries and keys lie in a slot."""
  q_slot, q_local = slots_of(q_seqlen, q_offsets, query.shape[1])
  k_slot, k_local = slots_of(kv_seqlen, kv_offsets, key.shape[1])
  allowed = (q_slot[:, :, None] == k_slot[:, None, :]) & (q_slot[:, :, None] >= 0)
  if causal:
    allowed &= q_local[:, :, None] >= k_local[:, None, :]
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key) * scale
  probs = jax.nn.softmax(jnp.where(allowed[:, None], logits, -1e30), axis=-1)
  probs = jnp.where((q_slot >= 0)[:, None, :, None], probs, 0)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, value), q_slot >= 0, k_slot >= 0


def _rows(x, keep, fill):
  return jnp.where(keep[:, :, None, None], x, fill)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _emulated(query, key, value, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, causal):
  context, q_in, _ = _attend(
    query, key, value, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, causal
  )
  return _rows(context, q_in, jnp.nan)  # undefined outside every sentence


def _emulated_forward(query, key, value, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, causal):
  layout = (q_seqlen, kv_seqlen, q_offsets, kv_offsets)
  return _emulated(query, key, value, *layout, scale, causal), (query, key, value, layout)


def _emulated_backward(scale, causal, residuals, cotangent):
  query, key, value, layout = residuals
  _, q_in, k_in = _attend(query, key, value, *layout, scale, causal)
  grads = jax.vjp(lambda q, k, v: _attend(q, k, v, *layout, scale, causal)[0], query, key, value)[
    1
  ](_rows(cotangent, q_in, 0))
  # cuDNN writes no gradient for tokens outside every sentence: garbage there.
  garbage = [_rows(g, keep, jnp.nan) for g, keep in zip(grads, (q_in, k_in, k_in))]
  return (*garbage, None, None, None, None)


_emulated.defvjp(_emulated_forward, _emulated_backward)


def emulated_cudnn(
  query, key, value, *, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, mask_type, qkv_layout
):
  """What `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention` documents for the
  packed layout (BTNH): sentence slot m of a row attends to key slot m, causal within it
  for PADDING_CAUSAL; output and gradients undefined (NaN here) outside every slot."""
  assert qkv_layout == "BTNH" and mask_type in ("PADDING", "PADDING_CAUSAL")
  return _emulated(
    query,
    key,
    value,
    q_seqlen,
    kv_seqlen,
    q_offsets,
    kv_offsets,
    scale,
    mask_type == "PADDING_CAUSAL",
  )


def compacted_cudnn(
  query, key, value, *, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, mask_type, qkv_layout
):
  """What cuDNN computes from what JAX hands it, forward only: JAX's own
  `_fix_seqlen_offsets` compacts the [batch, M] layout across the batch into one list of
  sentences (dropping the -1 slots), and cuDNN's ragged layout pairs the i-th query sentence
  of that list with the i-th key sentence, wherever in the batch each lies. NaN outside every
  sentence. `emulated_cudnn` pairs slot m with slot m of the same row instead: the two agree
  only where every row has its query and key sentences in the same slots."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn

  assert qkv_layout == "BTNH" and mask_type in ("PADDING", "PADDING_CAUSAL")
  (batch, q_len, heads, depth), k_len = query.shape, key.shape[1]
  q_seqlen, kv_seqlen, q_offsets, kv_offsets = cudnn._fix_seqlen_offsets(
    q_seqlen, kv_seqlen, q_offsets, kv_offsets, query, key
  )

  def sentence_of(seqlens, offsets, tokens):
    """Per token of the flattened batch: its sentence in the compacted list (-1: none) and
    its position in that sentence. Offsets count elements: token * heads * depth."""
    seqlens, starts = seqlens.reshape(-1), offsets.reshape(-1)[: seqlens.size] // (heads * depth)
    position = jnp.arange(tokens)[:, None]  # [tokens, 1]
    inside = (position >= starts) & (position < starts + seqlens)  # [tokens, sentences]
    sentence = jnp.where(inside.any(1), jnp.argmax(inside, axis=1), -1)
    return sentence, position[:, 0] - starts[jnp.maximum(sentence, 0)]

  q_sentence, q_local = sentence_of(q_seqlen, q_offsets, batch * q_len)
  k_sentence, k_local = sentence_of(kv_seqlen, kv_offsets, batch * k_len)
  allowed = (q_sentence[:, None] == k_sentence[None, :]) & (q_sentence[:, None] >= 0)
  if mask_type == "PADDING_CAUSAL":
    allowed &= q_local[:, None] >= k_local[None, :]
  flat_q = query.reshape(batch * q_len, heads, depth)
  flat_k, flat_v = (x.reshape(batch * k_len, heads, depth) for x in (key, value))
  logits = jnp.einsum("qhd,khd->hqk", flat_q, flat_k) * scale
  probs = jax.nn.softmax(jnp.where(allowed[None], logits, -1e30), axis=-1)
  context = jnp.einsum("hqk,khd->qhd", probs, flat_v)
  context = jnp.where((q_sentence >= 0)[:, None, None], context, jnp.nan)
  return context.reshape(query.shape)

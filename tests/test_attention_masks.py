"""Masks by their parts (`AttentionMask.flags`: is_causal, sequence lengths, the segment mask
of packed rows) give the dense-mask outputs, checked on CPU with implementation="xla"; the
cuDNN path that uses them in training needs a GPU and is not run here."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_mt.model import attention
from transformer_mt.model.attention import AttentionMask, fused_attention
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig


def _qkv(seed, batch=3, q_len=7, k_len=9, heads=2, depth=4):
  rng = np.random.default_rng(seed)  # NumPy's: jax.random compiles a program per shape
  shapes = [
    (batch, q_len, heads, depth),
    (batch, k_len, heads, depth),
    (batch, k_len, heads, depth),
  ]
  return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


def _valid(lengths, length):
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]  # Trailing padding.


def _packed_segments(lengths_per_row, length):
  """[rows, length] segment ids 1, 2, ... of consecutive sentences, 0 at trailing padding."""
  ids = np.zeros((len(lengths_per_row), length), np.int32)
  for row, lengths in enumerate(lengths_per_row):
    start = 0
    for segment, n in enumerate(lengths, start=1):
      ids[row, start : start + n] = segment
      start += n
  return jnp.asarray(ids)


@functools.partial(jax.jit, static_argnames="use_flags")
def _xla_attention(q, k, v, mask, use_flags):
  return fused_attention(q, k, v, mask, "xla", use_flags=use_flags)


def _both(q, k, v, mask):
  """Jitted (eagerly, each op would compile alone): the dense mask's outputs and the flags'."""
  dense = _xla_attention(q, k, v, mask, use_flags=False)
  flags = _xla_attention(q, k, v, mask, use_flags=True)
  return np.asarray(dense), np.asarray(flags)


def test_flags_match_dense_masks_for_causal_self_attention_with_padding():
  q, k, v = _qkv(0, q_len=8, k_len=8)
  valid = _valid([8, 5, 1], 8)
  dense, flags = _both(q, k, v, AttentionMask(valid, valid, causal=True))
  np.testing.assert_allclose(flags[valid], dense[valid], atol=1e-5)
  # Padded queries: zeros from flags (nothing reads them; the dense path averages values).
  assert np.all(flags[~np.asarray(valid)] == 0)


def test_flags_match_dense_masks_for_padded_cross_attention():
  q, k, v = _qkv(1)
  query_valid, key_valid = _valid([7, 3, 6], 7), _valid([9, 9, 2], 9)
  dense, flags = _both(q, k, v, AttentionMask(query_valid, key_valid))
  np.testing.assert_allclose(flags[query_valid], dense[query_valid], atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_flags_match_dense_masks_for_packed_rows(causal):
  q, k, v = _qkv(2, q_len=10, k_len=10)
  segments = _packed_segments([[3, 4, 2], [10], [2, 2]], 10)
  valid = segments > 0
  mask = AttentionMask(valid, valid, segments, segments, causal=causal)
  dense, flags = _both(q, k, v, mask)
  np.testing.assert_allclose(flags[valid], dense[valid], atol=1e-5)
  # Independent check of the dense mask: a sentence's outputs alone equal its own attention.
  first = jax.jit(jax.nn.dot_product_attention, static_argnames="is_causal")(
    q[:1, :3], k[:1, :3], v[:1, :3], is_causal=causal
  )
  np.testing.assert_allclose(flags[:1, :3], np.asarray(first), atol=1e-5)


def test_model_loss_and_logits_are_the_same_with_flags(monkeypatch):
  """The whole model (encoder, causal decoder, cross-attention) on packed rows with padding:
  the flags path everywhere gives the dense path's logits at real target positions."""
  config = TransformerConfig(
    vocab_size=40, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2,
    num_decoder_layers=2, deterministic=True, attention_implementation="xla",
  )  # fmt: skip
  rng = np.random.default_rng(0)
  src_seg = _packed_segments([[4, 3], [6], [2, 2, 2]], 8)
  tgt_seg = _packed_segments([[3, 5], [4], [3, 1, 2]], 8)

  def positions(seg):
    seg = np.asarray(seg)
    pos = np.zeros_like(seg)
    for r in range(seg.shape[0]):
      for c in range(1, seg.shape[1]):
        pos[r, c] = pos[r, c - 1] + 1 if seg[r, c] == seg[r, c - 1] else 0
    return jnp.asarray(np.where(seg > 0, pos, 0))

  inputs = jnp.where(src_seg > 0, rng.integers(4, 40, src_seg.shape), 0).astype(jnp.int32)
  targets_in = jnp.where(tgt_seg > 0, rng.integers(4, 40, tgt_seg.shape), 0).astype(jnp.int32)
  args = (inputs, targets_in, positions(src_seg), positions(tgt_seg), src_seg, tgt_seg)
  model = Transformer(config)
  params = jax.jit(model.init)(jax.random.key(0), *args)
  dense = np.asarray(jax.jit(model.apply)(params, *args))
  monkeypatch.setattr(
    attention, "fused_attention", functools.partial(fused_attention, use_flags=True)
  )
  flags = np.asarray(jax.jit(model.apply)(params, *args))  # traced anew: the patch applies
  valid = np.asarray(tgt_seg > 0)
  np.testing.assert_allclose(flags[valid], dense[valid], atol=1e-5)
  assert not np.allclose(flags[~valid], dense[~valid])  # The patch did take effect.

"""Incremental (KV-cached) decoding agrees with the uncached full forward pass."""

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_model_config

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import incremental as decode
from transformer_mt.model.transformer import Transformer

CONFIG = tiny_model_config()


def init_params(config, seed=0):
  return jax.tree.map(jnp.asarray, helpers.init_params(config, seed, unbox=False))


def source_batch():
  inputs = np.array(
    [
      [5, 9, 12, 7, EOS_ID, PAD_ID],
      [11, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
      [6, 6, 8, 20, 33, EOS_ID],
    ],
    np.int32,
  )
  return jnp.asarray(inputs)


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_cached_greedy_equals_argmax_of_full_forward(layer_norm_position):
  config = CONFIG.replace(layer_norm_position=layer_norm_position)
  params = jax.tree.map(
    lambda x: x.value if hasattr(x, "value") else x,
    init_params(config),
    is_leaf=lambda x: hasattr(x, "value"),
  )
  inputs = source_batch()
  max_len = 8
  outputs = np.asarray(decode.greedy_decode(params, inputs, config, max_len))
  assert outputs.shape == (3, max_len)
  # Teacher-force the decoded sequence through the uncached model.
  targets_in = np.concatenate([np.full((3, 1), BOS_ID, np.int32), outputs[:, :-1]], axis=1)
  logits = Transformer(config).apply({"params": params}, inputs, jnp.asarray(targets_in))
  for row in range(3):
    for t in range(max_len):
      if t > 0 and outputs[row, t - 1] in (EOS_ID, PAD_ID):
        assert outputs[row, t] == PAD_ID  # nothing is generated after EOS
        continue
      assert outputs[row, t] == int(jnp.argmax(decode.never_generated(logits[row, t]))), (row, t)
      assert outputs[row, t] not in (PAD_ID, BOS_ID)


def test_cached_step_logits_equal_full_forward():
  """Each incremental step reproduces the full forward's logits at that position (1e-5)."""
  params = jax.tree.map(
    lambda x: x.value if hasattr(x, "value") else x,
    init_params(CONFIG),
    is_leaf=lambda x: hasattr(x, "value"),
  )
  inputs = source_batch()
  targets_in = jnp.array(
    [[BOS_ID, 14, 15, 16, 17], [BOS_ID, 21, 22, 23, 24], [BOS_ID, 30, 31, 32, 33]], jnp.int32
  )
  full = Transformer(CONFIG).apply({"params": params}, inputs, targets_in)
  cache = decode.init_cache(params, inputs, CONFIG, max_len=5)
  for t in range(5):
    logits, cache = decode.decode_step(
      params, cache, inputs != PAD_ID, targets_in[:, t], jnp.array(t), CONFIG
    )
    np.testing.assert_allclose(logits, full[:, t], atol=1e-5, rtol=1e-5)


def test_empty_source_rows_produce_nothing():
  params = jax.tree.map(
    lambda x: x.value if hasattr(x, "value") else x,
    init_params(CONFIG),
    is_leaf=lambda x: hasattr(x, "value"),
  )
  inputs = jnp.array([[5, 6, EOS_ID], [PAD_ID, PAD_ID, PAD_ID]], jnp.int32)
  outputs = np.asarray(decode.greedy_decode(params, inputs, CONFIG, 6))
  assert (outputs[1] == PAD_ID).all()


def test_split_and_merge_cache():
  params = jax.tree.map(
    lambda x: x.value if hasattr(x, "value") else x,
    init_params(CONFIG),
    is_leaf=lambda x: hasattr(x, "value"),
  )
  cache = decode.init_cache(params, source_batch(), CONFIG, max_len=5)
  self_cache, cross_cache = decode.split_cache(cache)
  cross_names = {path[-1].key for path, _ in jax.tree_util.tree_leaves_with_path(cross_cache)}
  self_names = {path[-1].key for path, _ in jax.tree_util.tree_leaves_with_path(self_cache)}
  assert cross_names == {"cross_key", "cross_value"}
  assert self_names == {"cached_key", "cached_value", "cache_index"}
  merged = decode.merge_cache(self_cache, cross_cache)
  assert jax.tree.structure(merged) == jax.tree.structure(cache)
  jax.tree.map(np.testing.assert_array_equal, merged, cache)


@pytest.mark.parametrize("index", [0, 1, 15, 16, 17, 19, 20])
def test_gather_written_rows_equals_gathering_everything(index):
  """Chunks of 16 positions over a length-20 cache: the last chunk overlaps the first, which
  must not be reordered twice. Positions from `index` on are zeros, as in a real cache."""
  batch, length = 6, 20
  shape = (batch, 2, length, 3)  # [batch, heads, cache length, head_dim]
  rng = np.random.default_rng(index)
  written = np.arange(length)[None, None, :, None] < index
  cache = {
    "layer": {
      "cached_key": np.where(written, rng.normal(size=shape), 0).astype(np.float32),
      "cached_value": np.where(written, rng.normal(size=shape), 0).astype(np.float32),
      "cache_index": np.array(index, np.int32),
    }
  }
  rows = np.array([1, 2, 0, 0, 5, 3], np.int32)  # applied twice it gives a different order
  out = jax.jit(decode.gather_written_rows)(cache, jnp.asarray(rows))
  for name in ("cached_key", "cached_value"):
    np.testing.assert_array_equal(out["layer"][name], cache["layer"][name][rows])
  assert out["layer"]["cache_index"] == index


def long_and_short_sources():
  """Sources of 2 to 20 tokens and an empty row, [5, 20]: with a small extra length, each
  row's own limit (source length + extra) binds long before the batch's max_len."""
  lengths = [20, 2, 0, 9, 5]
  inputs = np.full((len(lengths), max(lengths)), PAD_ID, np.int32)
  rng = np.random.default_rng(0)
  for row, length in enumerate(lengths):
    if length:
      inputs[row, : length - 1] = rng.integers(3, CONFIG.vocab_size, length - 1)
      inputs[row, length - 1] = EOS_ID
  return jnp.asarray(inputs), np.array(lengths)


def test_greedy_stops_each_row_at_its_limit_as_beam_one_does():
  """One length rule: greedy with per-sentence max_lengths equals beam 1 ("beam" pool) with
  the same limits, and no row outgrows its own. The random model rarely emits EOS, so the
  limits (not EOS) end most rows: the test checks they do."""
  from transformer_mt.decoding import beam_decode

  params = jax.tree.map(
    lambda x: x.value if hasattr(x, "value") else x,
    init_params(CONFIG),
    is_leaf=lambda x: hasattr(x, "value"),
  )
  inputs, lengths = long_and_short_sources()
  extra_len, max_len = 3, 20 + 3
  max_lengths = jnp.asarray(np.minimum(lengths + extra_len, max_len), jnp.int32)
  greedy = np.asarray(
    decode.greedy_decode(params, inputs, CONFIG, max_len, max_lengths=max_lengths)
  )
  beam = beam_decode.beam_decode(
    params, inputs, CONFIG, 1, max_len, max_lengths=max_lengths, candidate_pool="beam"
  )
  np.testing.assert_array_equal(greedy, np.asarray(beam.sequences))
  generated = (greedy != PAD_ID).sum(axis=1)
  assert (generated <= np.where(lengths > 0, lengths + extra_len, 0)).all()
  stopped_by_limit = (generated == lengths + extra_len) & ~(greedy == EOS_ID).any(axis=1)
  assert stopped_by_limit[[1, 3, 4]].all(), greedy  # limits below max_len, not EOS, ended them
  assert generated[2] == 0  # the empty row


def test_translator_greedy_follows_the_length_rule():
  """Translator (beam 1 = greedy) passes its per-sentence limits: source length + extra_len."""
  from transformer_mt.decoding import translator as translate
  from transformer_mt.runtime import sharding

  params = jax.tree.map(
    lambda x: x.value if hasattr(x, "value") else x,
    init_params(CONFIG),
    is_leaf=lambda x: hasattr(x, "value"),
  )
  mesh = sharding.make_mesh(sharding.inference_mesh_config(), devices=jax.devices()[:1])
  translator = translate.Translator(
    params=params, model_config=CONFIG, tokenizer=None, mesh=mesh, batch_size=4, extra_len=3
  )
  inputs, _ = long_and_short_sources()
  sources = [[int(t) for t in row if t != PAD_ID] for row in np.asarray(inputs)]
  sources = [s for s in sources if s]
  generated = (np.stack(translator._decode_batch(sources)) != PAD_ID).sum(axis=1)
  limits = np.array([len(s) for s in sources]) + translator.extra_len
  assert (generated <= limits).all()
  assert (generated == limits).sum() >= 3  # the limits, not EOS, ended most rows


@pytest.mark.parametrize("beam, q_len", [(1, 1), (3, 1), (2, 3)])
def test_decode_attention_equals_dot_product_attention(beam, q_len):
  """The decode cache's attention (head-major keys/values, one row per sentence shared by
  `beam` query rows) equals jax.nn.dot_product_attention on keys/values copied to every
  row in its layout, padding mask included."""
  from transformer_mt.model.decode_cache import decode_attention

  batch, heads, kv_len, depth = 2, 4, 5, 8
  rng = np.random.default_rng(beam)
  query = rng.normal(size=(batch * beam, q_len, heads, depth)).astype(np.float32)
  key, value = (rng.normal(size=(batch, heads, kv_len, depth)).astype(np.float32) for _ in "kv")
  valid = np.arange(kv_len)[None, :] < np.array([[kv_len], [2]])  # [batch, kv_len]
  mask = np.repeat(valid, beam, axis=0)[:, None, None, :]  # [rows, 1, 1, kv_len]
  out = decode_attention(jnp.asarray(query), jnp.asarray(key), jnp.asarray(value), mask)
  copied = [np.repeat(np.swapaxes(x, 1, 2), beam, axis=0) for x in (key, value)]
  expected = jax.nn.dot_product_attention(query, *copied, mask=mask)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)

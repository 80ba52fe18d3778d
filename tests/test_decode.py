"""Incremental (KV-cached) decoding agrees with the uncached full forward pass."""

import functools

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


@functools.cache
def init_params(config, seed=0):
  """helpers.init_params, jitted: one program instead of an eager op per initializer."""
  return jax.jit(helpers.init_params, static_argnums=(0, 1))(config, seed)


# The encoder and the cache's projections as one program (eagerly, each op compiles alone).
init_cache = jax.jit(decode.init_cache, static_argnums=(2, 3))


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


# The greedy decodes below: the sources above, each row limited to its length + EXTRA_LEN.
EXTRA_LEN = 3
MAX_LEN = 20 + EXTRA_LEN


def row_limits(lengths):
  """Each row's own limit: source length + EXTRA_LEN, 0 for an empty source."""
  return np.where(lengths > 0, np.minimum(lengths + EXTRA_LEN, MAX_LEN), 0)


@functools.cache
def limited_greedy(config):
  """greedy_decode of `long_and_short_sources` under their row limits, int32 [5, MAX_LEN]."""
  inputs, lengths = long_and_short_sources()
  max_lengths = jnp.asarray(np.minimum(lengths + EXTRA_LEN, MAX_LEN), jnp.int32)
  return np.asarray(
    decode.greedy_decode(init_params(config), inputs, config, MAX_LEN, max_lengths=max_lengths)
  )


@functools.cache
def full_forward(config):
  """The uncached Transformer's logits, jitted: (params, inputs, targets_in) -> logits."""
  return jax.jit(
    lambda params, inputs, targets_in: Transformer(config).apply(
      {"params": params}, inputs, targets_in
    )
  )


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_cached_greedy_equals_argmax_of_full_forward(layer_norm_position):
  """Each greedy token is the argmax of the uncached model fed the tokens before it; nothing
  comes after EOS or past a row's limit, and an empty source row produces nothing."""
  config = CONFIG.replace(layer_norm_position=layer_norm_position)
  inputs, lengths = long_and_short_sources()
  limits = row_limits(lengths)
  outputs = limited_greedy(config)
  assert outputs.shape == (5, MAX_LEN)
  # Teacher-force the decoded sequence through the uncached model.
  targets_in = np.concatenate([np.full((5, 1), BOS_ID, np.int32), outputs[:, :-1]], axis=1)
  logits = full_forward(config)(init_params(config), inputs, jnp.asarray(targets_in))
  logits = np.asarray(decode.never_generated(logits))  # [5, MAX_LEN, vocab]
  checked = 0
  for row in range(5):
    for t in range(MAX_LEN):
      if t >= limits[row] or (t > 0 and outputs[row, t - 1] in (EOS_ID, PAD_ID)):
        assert outputs[row, t] == PAD_ID, (row, t)  # nothing after EOS or past the limit
        continue
      assert outputs[row, t] == int(np.argmax(logits[row, t])), (row, t)
      assert outputs[row, t] not in (PAD_ID, BOS_ID)
      checked += 1
  assert checked > 20 and (outputs[2] == PAD_ID).all()  # the empty row: nothing


def test_cached_step_logits_equal_full_forward():
  """Each incremental step reproduces the full forward's logits at that position (1e-5)."""
  params = init_params(CONFIG)
  inputs = source_batch()
  targets_in = jnp.array(
    [[BOS_ID, 14, 15, 16, 17], [BOS_ID, 21, 22, 23, 24], [BOS_ID, 30, 31, 32, 33]], jnp.int32
  )
  full = full_forward(CONFIG)(params, inputs, targets_in)
  cache = init_cache(params, inputs, CONFIG, 5)
  step = jax.jit(decode.decode_step, static_argnames="config")
  for t in range(5):
    logits, cache = step(
      params, cache, inputs != PAD_ID, targets_in[:, t], jnp.array(t), config=CONFIG
    )
    np.testing.assert_allclose(logits, full[:, t], atol=1e-5, rtol=1e-5)


def test_split_and_merge_cache():
  params = init_params(CONFIG)
  cache = init_cache(params, source_batch(), CONFIG, 5)
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


def test_greedy_stops_each_row_at_its_limit_as_beam_one_does():
  """One length rule: greedy with per-sentence max_lengths equals beam 1 ("beam" pool, the
  default) with the same limits, whatever the penalty ("gnmt" or "power": one finished
  hypothesis), and no row outgrows its own. The random model rarely emits EOS, so the limits
  (not EOS) end most rows: the test checks they do. An empty source row gets the empty
  hypothesis, score 0."""
  from transformer_mt.decoding import beam_decode

  inputs, lengths = long_and_short_sources()
  max_lengths = jnp.asarray(np.minimum(lengths + EXTRA_LEN, MAX_LEN), jnp.int32)
  greedy = limited_greedy(CONFIG)
  for alpha, length_penalty in ((0.6, "gnmt"), (1.0, "power")):
    beam = beam_decode.beam_decode(
      init_params(CONFIG),
      inputs,
      CONFIG,
      1,
      MAX_LEN,
      alpha=alpha,
      max_lengths=max_lengths,
      length_penalty=length_penalty,
      candidate_pool="beam",
    )
    np.testing.assert_array_equal(np.asarray(beam.sequences), greedy, err_msg=length_penalty)
    np.testing.assert_array_equal(np.asarray(beam.all_sequences[:, 0]), greedy)
    assert float(beam.scores[2]) == 0.0
  generated = (greedy != PAD_ID).sum(axis=1)
  assert (generated <= row_limits(lengths)).all()
  stopped_by_limit = (generated == lengths + EXTRA_LEN) & ~(greedy == EOS_ID).any(axis=1)
  assert stopped_by_limit[[1, 3, 4]].all(), greedy  # limits below max_len, not EOS, ended them
  assert generated[2] == 0  # the empty row


def test_translator_greedy_follows_the_length_rule():
  """Translator (beam 1 = greedy) passes its per-sentence limits: source length + extra_len."""
  from transformer_mt.decoding import translator as translate
  from transformer_mt.runtime import sharding

  params = init_params(CONFIG)
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
  out = jax.jit(decode_attention)(query, key, value, mask)
  copied = [np.repeat(np.swapaxes(x, 1, 2), beam, axis=0) for x in (key, value)]
  expected = jax.jit(jax.nn.dot_product_attention)(query, *copied, mask=mask)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)

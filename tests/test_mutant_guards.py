"""Behaviours no other test pinned down, each checked against an independent reference (a
NumPy transcription or plain arithmetic). They exist because a deliberate one-line bug in
tests/mutants.py survived without them: multi-head attention scaled by sqrt(d_model), the
embedding scale, the residual, Adam's hyperparameters, averaging more than two checkpoints,
a dropped last evaluation batch, and the 1/N normalisation of the train step's gradient.
"""

from __future__ import annotations

import math

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from transformer_mt.config import defaults as _defaults
from transformer_mt.data import input_pipeline
from transformer_mt.data.tokenizer import PAD_ID, train_tokenizer
from transformer_mt.decoding.translator import Translator
from transformer_mt.model.attention import AttentionMask, MultiHeadAttention
from transformer_mt.model.transformer import Embedder, EncoderLayer, Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import sharding
from transformer_mt.training import optimizer, train_step
from transformer_mt.training import setup as run_setup
from transformer_mt.workdir import averaging, checkpointing


@pytest.fixture(autouse=True)
def _full_precision_matmuls():
  """Exact float32 matmuls (no TF32/bf16 passes on accelerators) so tight tolerances hold."""
  with jax.default_matmul_precision("highest"):
    yield


# Two heads of width 4 in d_model 8: 1/sqrt(head_dim) and 1/sqrt(d_model) differ.
CONFIG = TransformerConfig(
  vocab_size=13, d_model=8, num_heads=2, d_ff=16, dropout_rate=0.0, deterministic=True
)


def randomized(params, seed: int):
  """`params` (unboxed) with every leaf replaced by normal noise: biases and LayerNorm
  scales too, so a term that init leaves at 0 or 1 still shows in the output."""
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(
    tree, [jnp.asarray(rng.normal(size=x.shape) * 0.5, jnp.float32) for x in leaves]
  )


def np_softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=-1, keepdims=True)


def np_attention(p, queries, keys, mask, num_heads):
  """Multi-head attention of one sentence: [q, d], [k, d], bool [q, k] -> [q, d].

  head_h = softmax(Q_h K_h^T / sqrt(d_k)) V_h with d_k the per-head width; the heads are
  concatenated and projected by W^O. The key projection has no bias (the model's choice).
  """
  w = lambda x: np.asarray(x, np.float64)  # noqa: E731
  d = queries.shape[-1]
  q = queries @ w(p["query"]["kernel"]).reshape(d, -1) + w(p["query"]["bias"]).reshape(-1)
  k = keys @ w(p["key"]["kernel"]).reshape(d, -1)
  v = keys @ w(p["value"]["kernel"]).reshape(d, -1) + w(p["value"]["bias"]).reshape(-1)
  d_k = q.shape[-1] // num_heads
  heads = []
  for h in range(num_heads):
    part = slice(h * d_k, (h + 1) * d_k)
    logits = q[:, part] @ k[:, part].T / math.sqrt(d_k)
    logits = np.where(mask, logits, -1e30)
    heads.append(np_softmax(logits) @ v[:, part])
  return np.concatenate(heads, -1) @ w(p["out"]["kernel"]).reshape(-1, d) + w(p["out"]["bias"])


@pytest.mark.parametrize("causal", [False, True], ids=["padded_cross", "causal_self"])
def test_multi_head_attention_matches_numpy(causal):
  """Both attention paths (fused `dot_product_attention`, and the explicit one that sows the
  weights for plots) equal a NumPy transcription with 1/sqrt(head_dim) scaling (1e-5)."""
  rng = np.random.default_rng(0)
  queries = rng.normal(size=(2, 5, CONFIG.d_model)).astype(np.float32)
  keys = queries if causal else rng.normal(size=(2, 6, CONFIG.d_model)).astype(np.float32)
  query_valid = np.arange(5)[None] < np.array([[5], [3]])
  key_valid = query_valid if causal else np.arange(6)[None] < np.array([[4], [6]])
  mask = AttentionMask(jnp.asarray(query_valid), jnp.asarray(key_valid), causal=causal)
  module = MultiHeadAttention(CONFIG)
  params = nn.unbox(module.init(jax.random.key(0), queries, keys, mask)["params"])
  params = randomized(params, seed=1)

  fused = module.apply({"params": params}, queries, keys, mask)
  explicit, _ = module.apply({"params": params}, queries, keys, mask, mutable=["intermediates"])
  for row in range(2):
    allowed = query_valid[row][:, None] & key_valid[row][None, :]
    if causal:
      allowed &= np.tril(np.ones((5, 5), bool))
    expected = np_attention(params, queries[row], keys[row], allowed, CONFIG.num_heads)
    valid = query_valid[row]  # outputs at padded queries are never read
    np.testing.assert_allclose(np.asarray(fused[row])[valid], expected[valid], atol=1e-5)
    np.testing.assert_allclose(np.asarray(explicit[row])[valid], expected[valid], atol=1e-5)


def np_sinusoids(length: int, d: int) -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
  pe = np.zeros((length, d))
  for pos in range(length):
    for i in range(0, d, 2):
      pe[pos, i] = np.sin(pos / 10000 ** (i / d))
      pe[pos, i + 1] = np.cos(pos / 10000 ** (i / d))
  return pe


def test_embedder_scales_tokens_and_adds_sinusoids():
  """Embedding = E[token] * sqrt(d_model) + PE(position) (section 3.4 of the paper)."""
  tokens = jnp.array([[1, 5, 7, 12, 3]], jnp.int32)
  positions = jnp.arange(5, dtype=jnp.int32)[None]
  module = Embedder(CONFIG, vocab_size=CONFIG.vocab_size)
  params = nn.unbox(module.init(jax.random.key(0), tokens, positions)["params"])
  table = np.asarray(params["embedding"]["embedding"], np.float64)
  expected = table[np.asarray(tokens[0])] * math.sqrt(CONFIG.d_model) + np_sinusoids(5, 8)
  got = module.apply({"params": params}, tokens, positions)
  np.testing.assert_allclose(np.asarray(got[0]), expected, atol=1e-5)


def np_layer_norm(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  variance = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(variance + eps) * np.asarray(p["scale"]) + np.asarray(p["bias"])


def np_feed_forward(x, p):
  hidden = np.maximum(x @ np.asarray(p["wi"]["kernel"]) + np.asarray(p["wi"]["bias"]), 0.0)
  return hidden @ np.asarray(p["wo"]["kernel"]) + np.asarray(p["wo"]["bias"])


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_encoder_layer_matches_numpy(layer_norm_position):
  """post: h = LN(x + Attn(x)), out = LN(h + FFN(h)); pre: h = x + Attn(LN(x)),
  out = h + FFN(LN(h)): the residuals and LayerNorms in NumPy (1e-5)."""
  cfg = CONFIG.replace(layer_norm_position=layer_norm_position)
  rng = np.random.default_rng(2)
  x = rng.normal(size=(1, 5, cfg.d_model)).astype(np.float32)
  valid = jnp.ones((1, 5), bool)
  mask = AttentionMask(valid, valid)
  module = EncoderLayer(cfg)
  params = randomized(nn.unbox(module.init(jax.random.key(0), x, mask)["params"]), seed=3)
  got = np.asarray(module.apply({"params": params}, x, mask)[0])

  eps, everything = cfg.layer_norm_epsilon, np.ones((5, 5), bool)
  attention_norm, ffn_norm = params["attention_block"]["norm"], params["ffn_block"]["norm"]
  h = x[0].astype(np.float64)
  attend = lambda z: np_attention(params["self_attention"], z, z, everything, cfg.num_heads)  # noqa: E731
  if layer_norm_position == "post":
    h = np_layer_norm(h + attend(h), attention_norm, eps)
    expected = np_layer_norm(h + np_feed_forward(h, params["ffn"]), ffn_norm, eps)
  else:
    h = h + attend(np_layer_norm(h, attention_norm, eps))
    expected = h + np_feed_forward(np_layer_norm(h, ffn_norm, eps), params["ffn"])
  np.testing.assert_allclose(got, expected, atol=1e-5)


def test_optimizer_matches_numpy_adam_with_paper_schedule():
  """make_optimizer = Adam(0.9, 0.98, 1e-9) with bias correction, at the paper's learning rate
  d^-0.5 min(t^-0.5, t w^-1.5) for update t = 1, 2, ...: five updates against NumPy."""
  train_config = _defaults.base_config().train
  assert (train_config.adam_b1, train_config.adam_b2, train_config.adam_eps) == (0.9, 0.98, 1e-9)
  train_config.update(warmup_steps=3, grad_clip_norm=0.0)
  d_model, warmup = 16, 3
  tx, _ = optimizer.make_optimizer(train_config, d_model)
  rng = np.random.default_rng(4)
  gradients = rng.normal(size=(5, 6)) * np.array([[1.0], [0.1], [3.0], [0.5], [2.0]])
  params = {"w": jnp.zeros(6, jnp.float32)}
  state = tx.init(params)

  expected, m, v = np.zeros(6), np.zeros(6), np.zeros(6)
  b1, b2, eps = 0.9, 0.98, 1e-9
  for t, g in enumerate(gradients, start=1):
    updates, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
    params = optax.apply_updates(params, updates)
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g**2
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    lr = d_model**-0.5 * min(t**-0.5, t * warmup**-1.5)
    expected = expected - lr * m_hat / (np.sqrt(v_hat) + eps)
    np.testing.assert_allclose(np.asarray(params["w"]), expected, rtol=1e-5, atol=1e-7)


def test_three_distinct_checkpoints_average_to_their_mean(tmp_path):
  """average_last(3) of three different checkpoints = their arithmetic mean (float64 NumPy)."""
  config = _defaults.base_config()
  config.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
  tokenizer = train_tokenizer([("a b c d", "e f g h")] * 50, vocab_size=14)
  setup = run_setup.training_setup(config, tokenizer, sharding.make_mesh(config.mesh))
  states = [
    train_step.create_sharded_state(seed, setup.model, setup.tx, setup.mesh) for seed in (1, 2, 3)
  ]
  manager = checkpointing.make_manager(str(tmp_path / "run"), keep=10)
  iterator = iter(grain.MapDataset.range(3).to_iter_dataset())
  for step, state in zip((10, 20, 30), states):
    checkpointing.save(manager, step, state, iterator, config, tokenizer, force=True)
  checkpointing.wait(manager)

  output, steps = averaging.average_last(str(tmp_path / "run"), 3)
  assert steps == [10, 20, 30]
  averaged = jax.device_get(checkpointing.restore_params(output, 30, setup.abstract_params))
  expected = jax.tree.map(
    lambda *xs: np.mean([np.asarray(x, np.float64) for x in xs], axis=0),
    *[jax.device_get(s.params) for s in states],
  )
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), averaged, expected
  )


def test_evaluation_batches_keep_a_partial_last_batch():
  """11 pairs in batches of 4 rows: 4 + 4 + 3; every pair's target ids appear exactly once."""
  pairs = [(f"{'a ' * n}x", f"{'b ' * n}y") for n in range(1, 12)]
  tokenizer = train_tokenizer(pairs * 3, vocab_size=12, model_type="bpe")
  batches = list(input_pipeline.evaluation_batches(pairs, tokenizer, batch_rows=4))
  rows = [
    tuple(int(t) for t in row if t != PAD_ID)
    for batch in batches
    for row in batch["targets"][0]
    if (row != PAD_ID).any()
  ]
  expected = [tuple(ids) for ids in tokenizer.encode([target for _, target in pairs])]
  assert sorted(rows) == sorted(expected)
  assert [int((b["targets"][0] != PAD_ID).any(axis=1).sum()) for b in batches] == [4, 4, 3]


def test_translation_batches_keep_a_partial_last_batch():
  """7 lines (one empty) in batches of 4: 4 + 2, every non-empty line exactly once, and the
  batched translations equal each line translated alone."""
  lines = ["a b c", "", "b", "c a b a", "a", "c c b", "b a"]
  tokenizer = train_tokenizer([(line or "a", "x") for line in lines] * 5, vocab_size=12)
  config = TransformerConfig(
    vocab_size=tokenizer.vocab_size, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
    num_decoder_layers=1, deterministic=True,
  )  # fmt: skip
  dummy = jnp.ones((1, 2), jnp.int32)
  params = nn.unbox(Transformer(config).init(jax.random.key(0), dummy, dummy)["params"])
  mesh = sharding.make_mesh(sharding.inference_mesh_config(), devices=jax.devices()[:1])
  translator = Translator(
    params=params, model_config=config, tokenizer=tokenizer, mesh=mesh, batch_size=4,
    extra_len=3, max_target_len=8,
  )  # fmt: skip
  batches = translator.source_batches(lines)
  assert [len(batch) for batch in batches] == [4, 2]
  assert sorted(index for batch in batches for index, _ in batch) == [0, 2, 3, 4, 5, 6]
  alone = [translator.translate([line])[0] for line in lines]
  assert translator.translate(lines) == alone


TINY = TransformerConfig(
  vocab_size=32, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
  dropout_rate=0.0,
)  # fmt: skip


def ragged_batch(seed: int, accum: int, micro: int, length: int, vocab: int):
  """[accum, micro, length] source/target ids with trailing padding of random lengths, so the
  micro-batches hold different numbers of target tokens."""
  rng = np.random.default_rng(seed)
  shape = (accum, micro, length)
  inputs = rng.integers(4, vocab, size=shape).astype(np.int32)
  targets = rng.integers(4, vocab, size=shape).astype(np.int32)
  inputs[np.arange(length) >= rng.integers(2, length + 1, size=(accum, micro, 1))] = PAD_ID
  targets[np.arange(length) >= rng.integers(1, length + 1, size=(accum, micro, 1))] = PAD_ID
  targets_in = np.concatenate([np.full(shape[:2] + (1,), 2, np.int32), targets[..., :-1]], -1)
  targets_in[targets == PAD_ID] = PAD_ID
  return {"inputs": inputs, "targets_in": targets_in, "targets": targets}


@pytest.mark.parametrize("devices", [1, 8], ids=["one_device", "data_parallel_8"])
def test_sgd_step_moves_params_by_the_mean_token_gradient(devices, cpu_devices):
  """With SGD at learning rate 1, one train step over 2 micro-batches moves the parameters by
  exactly minus the gradient of the label-smoothed loss averaged over every non-pad target
  token of the whole batch (written out here: one-hot, log-softmax, one division by N)."""
  eps = 0.1
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": devices, "fsdp": 1, "tensor": 1}), cpu_devices[:devices]
  )
  model = Transformer(TINY)
  tx = optax.sgd(lambda count: 1.0)  # a schedule, as make_optimizer builds: the step logs it
  state = train_step.create_sharded_state(0, model, tx, mesh)
  before = jax.device_get(state.params)
  batch = ragged_batch(5, accum=2, micro=8, length=9, vocab=TINY.vocab_size)
  token_counts = (batch["targets"] != PAD_ID).sum(axis=(1, 2))
  assert token_counts[0] != token_counts[1]  # a per-micro-batch 1/N would show
  step = train_step.jit_train_step(
    model, tx, lambda count: 1.0, eps, mesh, train_step.state_shardings(model, tx, mesh)
  )
  state, metrics = step(state, sharding.global_batch_from_local(batch, mesh, batch_dim=1))
  after = jax.device_get(state.params)

  whole = {k: jnp.asarray(v.reshape(-1, v.shape[-1])) for k, v in batch.items()}  # [16, len]
  reference_model = Transformer(TINY.replace(deterministic=True))

  def mean_token_loss(params):
    logits = reference_model.apply({"params": params}, whole["inputs"], whole["targets_in"])
    q = (1 - eps) * jax.nn.one_hot(whole["targets"], TINY.vocab_size) + eps / TINY.vocab_size
    token_loss = -jnp.sum(q * jax.nn.log_softmax(logits), axis=-1)  # [16, len]
    weights = (whole["targets"] != PAD_ID).astype(jnp.float32)
    return jnp.sum(token_loss * weights) / jnp.sum(weights)

  loss, gradient = jax.value_and_grad(mean_token_loss)(before)
  moved = jax.tree.map(lambda b, a: np.asarray(b, np.float64) - np.asarray(a), before, after)
  difference = optax.global_norm(jax.tree.map(lambda m, g: m - np.asarray(g), moved, gradient))
  assert float(difference) <= 1e-4 * float(optax.global_norm(gradient))
  np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-5)

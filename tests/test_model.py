"""Tests of the Transformer model: shapes, masks, packing, the seed_minimal equations,
parameter counts and config validation.

Everything runs in float32 on small models; each test takes well under a second
once JAX has compiled its kernels.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_model_config

from transformer_mt.decoding import incremental as decode
from transformer_mt.model.transformer import Transformer, count_parameters
from transformer_mt.model.transformer_config import TransformerConfig


@pytest.fixture(autouse=True)
def _full_precision_matmuls():
  """Exact float32 matmuls (no TF32/bf16 passes on accelerators) so tight tolerances hold."""
  with jax.default_matmul_precision("highest"):
    yield


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

VOCAB = 13


def small_config(**overrides) -> TransformerConfig:
  """A tiny but complete Transformer (residuals, LayerNorm, biases, 2 heads), each layer kind
  once (1+1 layers: compilations, and op-by-op dispatches, are what these tests cost)."""
  values = dict(
    vocab_size=VOCAB,
    d_model=16,
    num_heads=2,
    d_ff=32,
    dropout_rate=0.0,
    max_len=32,
    num_encoder_layers=1,
    num_decoder_layers=1,
  )
  return tiny_model_config(**{**values, **overrides})


def seed_minimal_config(**overrides) -> TransformerConfig:
  """The settings of experiments/seed_minimal.py, at d_model=8 (built here: no
  experiments.demo)."""
  values = dict(
    vocab_size=11,
    target_vocab_size=13,
    d_model=8,
    num_heads=1,
    head_dim=8,
    d_ff=8,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout_rate=0.0,
    use_residual=False,
    use_layer_norm=False,
    use_bias=False,
    attention_output_projection=False,
    scale_embeddings=False,
    share_embeddings=False,
    position_encoding="sinusoidal",
    deterministic=True,
  )
  values.update(overrides)
  return TransformerConfig(**values)


def init_model(config: TransformerConfig, src_len: int = 5, tgt_len: int = 4, seed: int = 0):
  """Returns (model.apply, variables) of a freshly initialized model."""
  model = Transformer(config)
  src = jnp.ones((1, src_len), jnp.int32)
  tgt = jnp.ones((1, tgt_len), jnp.int32)
  variables = model.init(jax.random.key(seed), src, tgt)
  return model.apply, variables


def random_tokens(rng: np.random.Generator, shape, vocab: int = VOCAB) -> jnp.ndarray:
  """Token ids in [1, vocab): never the pad id 0."""
  return jnp.asarray(rng.integers(1, vocab, size=shape), jnp.int32)


# ---------------------------------------------------------------------------------------------
# 1. Shapes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("share_embeddings", [True, False], ids=["shared", "untied"])
@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
@pytest.mark.parametrize("position_encoding", ["sinusoidal", "learned"])
def test_output_shapes(share_embeddings, layer_norm_position, position_encoding):
  """Logits are [batch, tgt_len, target_vocab]; encode gives [batch, src_len, d_model]."""
  target_vocab = None if share_embeddings else 17
  cfg = small_config(
    share_embeddings=share_embeddings,
    target_vocab_size=target_vocab,
    layer_norm_position=layer_norm_position,
    position_encoding=position_encoding,
  )
  apply, variables = init_model(cfg)
  rng = np.random.default_rng(0)
  src, tgt = random_tokens(rng, (2, 5)), random_tokens(rng, (2, 4))

  logits = apply(variables, src, tgt)
  encoded = apply(variables, src, method=Transformer.encode)

  assert logits.shape == (2, 4, cfg.output_vocab_size)
  assert logits.dtype == jnp.float32
  assert encoded.shape == (2, 5, cfg.d_model)
  assert np.all(np.isfinite(logits))
  params = variables["params"]
  assert ("target_embedder" in params) == (not share_embeddings)
  assert ("output_projection" in params) == (not share_embeddings)
  assert ("encoder_norm" in params) == (layer_norm_position == "pre")


# ---------------------------------------------------------------------------------------------
# 2-4. Masks and packing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_causal_mask_hides_future_targets(layer_norm_position):
  """Changing target token k changes no logits at positions < k (but does change position k)."""
  cfg = small_config(layer_norm_position=layer_norm_position)
  apply, variables = init_model(cfg)
  rng = np.random.default_rng(1)
  src, tgt = random_tokens(rng, (2, 5)), np.asarray(random_tokens(rng, (2, 4)))
  base = apply(variables, src, jnp.asarray(tgt))
  for k in range(1, tgt.shape[1]):
    changed = tgt.copy()
    changed[:, k] = changed[:, k] % (VOCAB - 1) + 1  # a different non-pad token
    logits = apply(variables, src, jnp.asarray(changed))
    np.testing.assert_allclose(logits[:, :k], base[:, :k], atol=1e-6, rtol=0)
    assert np.max(np.abs(logits[:, k] - base[:, k])) > 1e-4, "the change did not reach position k"


@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_padding_is_ignored(layer_norm_position):
  """Appending pad tokens (id 0) to source and target leaves the real positions' logits alone."""
  cfg = small_config(layer_norm_position=layer_norm_position)
  apply, variables = init_model(cfg)
  rng = np.random.default_rng(2)
  src, tgt = random_tokens(rng, (2, 5)), random_tokens(rng, (2, 4))
  padded_src = jnp.pad(src, ((0, 0), (0, 3)))
  padded_tgt = jnp.pad(tgt, ((0, 0), (0, 2)))

  base = apply(variables, src, tgt)
  np.testing.assert_allclose(apply(variables, padded_src, tgt), base, atol=1e-5, rtol=0)
  np.testing.assert_allclose(apply(variables, src, padded_tgt)[:, :4], base, atol=1e-5, rtol=0)
  np.testing.assert_allclose(
    apply(variables, padded_src, padded_tgt)[:, :4], base, atol=1e-5, rtol=0
  )
  encoded = apply(variables, src, method=Transformer.encode)
  padded_encoded = apply(variables, padded_src, method=Transformer.encode)
  np.testing.assert_allclose(padded_encoded[:, :5], encoded, atol=1e-5, rtol=0)


@pytest.mark.parametrize("position_encoding", ["sinusoidal", "learned"])
@pytest.mark.parametrize("layer_norm_position", ["post", "pre"])
def test_packed_sentences_match_unpacked(position_encoding, layer_norm_position):
  """Two sentences packed in one row (segment ids, per-segment positions) give their own logits."""
  cfg = small_config(position_encoding=position_encoding, layer_norm_position=layer_norm_position)
  apply, variables = init_model(cfg)
  rng = np.random.default_rng(3)
  src_a, tgt_a = random_tokens(rng, (1, 3)), random_tokens(rng, (1, 4))
  src_b, tgt_b = random_tokens(rng, (1, 4)), random_tokens(rng, (1, 2))

  # Row layout: sentence a, sentence b, then padding (segment 0, id 0).
  src = jnp.concatenate([src_a, src_b, jnp.zeros((1, 2), jnp.int32)], axis=1)
  src_seg = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0, 0]], jnp.int32)
  src_pos = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0, 0]], jnp.int32)
  tgt = jnp.concatenate([tgt_a, tgt_b, jnp.zeros((1, 1), jnp.int32)], axis=1)
  tgt_seg = jnp.array([[1, 1, 1, 1, 2, 2, 0]], jnp.int32)
  tgt_pos = jnp.array([[0, 1, 2, 3, 0, 1, 0]], jnp.int32)

  packed = apply(
    variables,
    src,
    tgt,
    inputs_positions=src_pos,
    targets_positions=tgt_pos,
    inputs_segmentation=src_seg,
    targets_segmentation=tgt_seg,
  )
  alone_a = apply(variables, src_a, tgt_a)
  alone_b = apply(variables, src_b, tgt_b)
  np.testing.assert_allclose(packed[:, 0:4], alone_a, atol=1e-5, rtol=0)
  np.testing.assert_allclose(packed[:, 4:6], alone_b, atol=1e-5, rtol=0)

  encoded = apply(variables, src, src_pos, src_seg, method=Transformer.encode)
  np.testing.assert_allclose(
    encoded[:, 0:3], apply(variables, src_a, method=Transformer.encode), atol=1e-5, rtol=0
  )
  np.testing.assert_allclose(
    encoded[:, 3:7], apply(variables, src_b, method=Transformer.encode), atol=1e-5, rtol=0
  )


# ---------------------------------------------------------------------------------------------
# 5. seed_minimal against a NumPy transcription of the worked example's equations
# ---------------------------------------------------------------------------------------------


def _np_sinusoidal(length: int, d: int) -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
  pe = np.zeros((length, d))
  for pos in range(length):
    for i in range(0, d, 2):
      angle = pos / 10000 ** (i / d)
      pe[pos, i] = np.sin(angle)
      if i + 1 < d:
        pe[pos, i + 1] = np.cos(angle)
  return pe


def _np_softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(axis=-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=-1, keepdims=True)


def _relu(z: np.ndarray) -> np.ndarray:
  return np.maximum(z, 0.0)


def _np_seed_minimal(p: dict, src_ids: np.ndarray, tgt_in_ids: np.ndarray, d: int) -> np.ndarray:
  """Logits H_D W_O of one sentence pair, straight from the worked example's equations."""
  w = lambda x: np.asarray(x, np.float64)  # noqa: E731
  sq = lambda k: w(k).reshape(d, d)  # [d, 1 head, d] attention kernels as d x d  # noqa: E731
  enc, dec = p["encoder_layers_0"], p["decoder_layers_0"]
  W_E = w(p["source_embedder"]["embedding"]["embedding"])
  W_EY = w(p["target_embedder"]["embedding"]["embedding"])
  W_O = w(p["output_projection"]["kernel"])

  # Encoder: H~ = X W_E + P; A = softmax(Q K^T / sqrt(d)) V; H_E = ReLU(A W1) W2.
  X = np.eye(W_E.shape[0])[src_ids]
  H = X @ W_E + _np_sinusoidal(len(src_ids), d)
  Q, K, V = (H @ sq(enc["self_attention"][n]["kernel"]) for n in ("query", "key", "value"))
  A = _np_softmax(Q @ K.T / np.sqrt(d)) @ V
  H_E = _relu(A @ w(enc["ffn"]["wi"]["kernel"])) @ w(enc["ffn"]["wo"]["kernel"])

  # Decoder: G = Y W_E^Y + P; A_D = softmax((Q_D K_D^T + M) / sqrt(d)) V_D, M causal.
  n = len(tgt_in_ids)
  Y = np.eye(W_EY.shape[0])[tgt_in_ids]
  G = Y @ W_EY + _np_sinusoidal(n, d)
  Q_D, K_D, V_D = (G @ sq(dec["self_attention"][k]["kernel"]) for k in ("query", "key", "value"))
  M = np.triu(np.full((n, n), -np.inf), k=1)
  A_D = _np_softmax((Q_D @ K_D.T + M) / np.sqrt(d)) @ V_D
  # Cross-attention: queries from A_D, keys and values from H_E.
  Q_C = A_D @ sq(dec["cross_attention"]["query"]["kernel"])
  K_C = H_E @ sq(dec["cross_attention"]["key"]["kernel"])
  V_C = H_E @ sq(dec["cross_attention"]["value"]["kernel"])
  A_C = _np_softmax(Q_C @ K_C.T / np.sqrt(d)) @ V_C
  H_D = _relu(A_C @ w(dec["ffn"]["wi"]["kernel"])) @ w(dec["ffn"]["wo"]["kernel"])
  return H_D @ W_O


def test_seed_minimal_matches_numpy_equations():
  """seed_minimal's logits and loss equal a NumPy transcription of the worked example (1e-5)."""
  cfg = seed_minimal_config()
  apply, variables = init_model(cfg, seed=42)
  params = nn.unbox(variables["params"])
  # Exactly the parameters the equations use: no biases, no LayerNorm, no W^O in attention.
  assert set(params) == {
    "source_embedder",
    "target_embedder",
    "output_projection",
    "encoder_layers_0",
    "decoder_layers_0",
  }
  assert set(params["encoder_layers_0"]) == {"self_attention", "ffn"}
  assert set(params["decoder_layers_0"]) == {"self_attention", "cross_attention", "ffn"}
  assert all(
    path[-1].key in ("kernel", "embedding")
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  )

  rng = np.random.default_rng(4)
  src = np.asarray(random_tokens(rng, (2, 5), cfg.vocab_size))
  tgt = np.asarray(random_tokens(rng, (2, 5), cfg.output_vocab_size))  # BOS y1 ... y4 y5
  tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # teacher forcing: predict y_{j} from y_{<j}

  logits = apply(variables, jnp.asarray(src), jnp.asarray(tgt_in))
  expected = np.stack([_np_seed_minimal(params, s, t, cfg.d_model) for s, t in zip(src, tgt_in)])
  np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)

  # Y^ = softmax(H_D W_O); loss = -(1/N) sum_j log y^_j[y_j].
  expected_probs = _np_softmax(expected)
  expected_loss = -np.mean(np.log(np.take_along_axis(expected_probs, tgt_out[..., None], -1)))
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  loss = -jnp.mean(jnp.take_along_axis(log_probs, jnp.asarray(tgt_out)[..., None], axis=-1))
  np.testing.assert_allclose(np.exp(log_probs), expected_probs, atol=1e-5, rtol=0)
  np.testing.assert_allclose(float(loss), expected_loss, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# 6-7. Parameter counts and config validation
# ---------------------------------------------------------------------------------------------


def paper_config(d_model, d_ff, num_heads) -> TransformerConfig:
  """A model of the paper's Table 3: 6+6 layers over a shared 37k vocabulary."""
  return TransformerConfig(
    vocab_size=37000,
    d_model=d_model,
    num_encoder_layers=6,
    num_decoder_layers=6,
    d_ff=d_ff,
    num_heads=num_heads,
    share_embeddings=True,
  )


def test_parameter_count_base():
  """The paper's Base model (shared 37k vocabulary) has about 65M parameters (within 5%)."""
  cfg = paper_config(d_model=512, d_ff=2048, num_heads=8)
  n = count_parameters(cfg)
  assert abs(n - 65e6) / 65e6 < 0.05, n


def test_parameter_count_big():
  """The paper's Big model (d 1024, d_ff 4096, 16 heads) has about 213M parameters (within 2%)."""
  cfg = paper_config(d_model=1024, d_ff=4096, num_heads=16)
  n = count_parameters(cfg)
  assert abs(n - 213e6) / 213e6 < 0.02, n


def test_config_rejects_indivisible_heads():
  """d_model not divisible by num_heads (and no head_dim) is a ValueError naming both fields."""
  with pytest.raises(ValueError, match=r"d_model=10.*num_heads=3"):
    TransformerConfig(d_model=10, num_heads=3)
  assert TransformerConfig(d_model=10, num_heads=3, head_dim=4).per_head_dim == 4


def test_config_rejects_unknown_layer_norm_position():
  """layer_norm_position other than 'pre'/'post' is a ValueError naming the field."""
  with pytest.raises(ValueError, match="layer_norm_position"):
    TransformerConfig(layer_norm_position="mid")


def test_config_checks_the_attention_implementation():
  with pytest.raises(ValueError, match="attention_implementation='flash'"):
    TransformerConfig(attention_implementation="flash")
  with pytest.raises(ValueError, match="'cudnn' needs dtype='bfloat16'"):
    TransformerConfig(attention_implementation="cudnn")
  TransformerConfig(attention_implementation="cudnn", dtype="bfloat16")


# ---------------------------------------------------------------------------------------------
# 8. Speed-motivated code paths give the same numbers as the plain ones
# ---------------------------------------------------------------------------------------------


def _packed_pair(rng: np.random.Generator):
  """A packed row of two sentences plus padding, as the input pipeline makes them."""
  src = jnp.concatenate([random_tokens(rng, (2, 7)), jnp.zeros((2, 2), jnp.int32)], axis=1)
  tgt = jnp.concatenate([random_tokens(rng, (2, 6)), jnp.zeros((2, 1), jnp.int32)], axis=1)
  segments = lambda lengths: jnp.asarray(  # noqa: E731
    np.repeat([1, 2, 0], lengths)[None].repeat(2, 0)
  )
  positions = lambda lengths: jnp.asarray(  # noqa: E731
    np.concatenate([np.arange(n) for n in lengths])[None].repeat(2, 0)
  )
  return dict(
    inputs=src,
    targets_in=tgt,
    inputs_segmentation=segments([3, 4, 2]),
    targets_segmentation=segments([4, 2, 1]),
    inputs_positions=positions([3, 4, 2]),
    targets_positions=positions([4, 2, 1]),
  )


def test_remat_gives_same_loss_and_gradients():
  """remat=True recomputes activations in the backward pass: same loss and gradients (1e-6),
  dropout included (each layer draws the same mask when it runs again)."""
  from transformer_mt.training import losses

  batch = _packed_pair(np.random.default_rng(5))
  targets = jnp.roll(batch["targets_in"], -1, axis=1) * (batch["targets_in"] > 0)

  def loss_and_grads(remat: bool):
    cfg = small_config(remat=remat, dropout_rate=0.1, deterministic=False)
    model = Transformer(cfg)
    params = nn.unbox(model.init(jax.random.key(0), batch["inputs"], batch["targets_in"])["params"])

    def loss_fn(p):
      logits = model.apply({"params": p}, **batch, rngs={"dropout": jax.random.key(1)})
      return losses.cross_entropy_sums(
        logits, targets, (targets > 0).astype(jnp.float32), label_smoothing=0.1
      )["loss"]

    return jax.jit(jax.value_and_grad(loss_fn))(params)

  (loss, grads), (remat_loss, remat_grads) = loss_and_grads(False), loss_and_grads(True)
  np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
  assert jax.tree.structure(remat_grads) == jax.tree.structure(grads)
  for remat_grad, grad in zip(jax.tree.leaves(remat_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(remat_grad, grad, atol=1e-6, rtol=1e-5)


def test_remat_model_decodes_with_cache():
  """remat only wraps the training path: a remat=True model's cached greedy decode is the
  remat=False one's, token for token."""

  cfg = small_config()
  _, variables = init_model(cfg)
  params = nn.unbox(variables["params"])
  inputs = random_tokens(np.random.default_rng(8), (2, 5))
  plain = decode.greedy_decode(params, inputs, cfg, 6)
  np.testing.assert_array_equal(
    decode.greedy_decode(params, inputs, cfg.replace(remat=True), 6), plain
  )


def test_fused_attention_matches_explicit_path():
  """jax.nn.dot_product_attention (taken when nobody collects the weights) gives the logits of
  the explicit softmax path that sows them for plots (1e-5), packed rows included."""
  cfg = small_config()
  apply, variables = init_model(cfg)
  batch = _packed_pair(np.random.default_rng(6))
  fused = apply(variables, **batch)
  explicit, state = apply(variables, **batch, mutable=["intermediates"])
  np.testing.assert_allclose(fused, explicit, atol=1e-5, rtol=0)
  weights = state["intermediates"]["decoder_layers_0"]["cross_attention"]["attention_weights"][0]
  assert weights.shape == (2, cfg.num_heads, 7, 9)


def test_tied_logits_gradients_match_autodiff():
  """The hand-written backward pass of x E^T equals autodiff of the plain product (1e-6)."""
  from transformer_mt.model.transformer import tied_logits

  rng = np.random.default_rng(7)
  x = jnp.asarray(rng.normal(size=(2, 3, 4)), jnp.float32)
  embedding = jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32)
  ours = jax.vjp(tied_logits, x, embedding)[1](g)
  plain = jax.vjp(lambda a, e: a @ e.T, x, embedding)[1](g)
  for got, want in zip(ours, plain):
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layers", [(3, 2), (0, 2), (2, 1)], ids=["3+2", "decoder_only", "2+1"])
def test_parameter_shapes_repeat_one_traced_layer_as_the_whole_trace_has_them(layers):
  """parameter_shapes traces one layer of each kind and repeats its shapes: the same tree,
  names, shapes and dtypes as tracing the whole model, for pre-LN (a final norm per stack),
  untied embeddings and a logits bias too."""
  from transformer_mt.model.transformer import parameter_shapes, traced_parameter_shapes

  for cfg in (
    small_config(num_encoder_layers=layers[0], num_decoder_layers=layers[1]),
    small_config(
      num_encoder_layers=layers[0],
      num_decoder_layers=layers[1],
      layer_norm_position="pre",
      share_embeddings=False,
      target_vocab_size=17,
      logits_bias=True,
    ),
  ):
    expected = traced_parameter_shapes(cfg)
    shapes = parameter_shapes(cfg)
    assert jax.tree.structure(shapes) == jax.tree.structure(expected)
    assert list(shapes) == list(expected)
    assert jax.tree.leaves(shapes) == jax.tree.leaves(expected)
    shapes.pop("source_embedder")  # the caller's copy: the next call is whole again
    assert list(parameter_shapes(cfg)) == list(expected)

"""model.fuse_qkv: the Q/K/V projections (K/V of cross-attention) as one matmul against their
kernels stacked at call time. The reference is the same model with the switch off: the same
parameters (names, shapes, initial values), and to float32 rounding the same logits,
gradients, cached decoding steps and beam search. The comparisons run on random biases, not
the zeros of initialization: zeros stacked in any order are the same zeros. (An imported
Marian model, whose q/k/v biases are real, is compared with transformers' own logits with the
switch on: tests/test_hf_reference.py.)"""

import helpers
import jax
import jax.numpy as jnp
import numpy as np
from helpers import tiny_model_config

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import beam_decode
from transformer_mt.decoding import incremental as decode
from transformer_mt.model.transformer import Transformer

CONFIG = tiny_model_config(num_encoder_layers=1, num_decoder_layers=1)  # each layer kind once
FUSED = CONFIG.replace(fuse_qkv=True)


def params_with_random_biases():
  """The initial parameters with every bias drawn at random (std 0.5): those of the query and
  value projections, whose order in the stacked bias a mutant swaps, among them."""
  params = helpers.init_params(CONFIG)
  rng = np.random.default_rng(1)

  def draw(path, x):
    if path[-1].key != "bias":
      return x
    return jnp.asarray(0.5 * rng.standard_normal(x.shape), x.dtype)

  return jax.tree_util.tree_map_with_path(draw, params)


def packed_rows():
  """Two packed rows (3 and 2 sentences, trailing padding) and one full row: the model's
  positional arguments."""
  segments = np.zeros((3, 10), np.int32)
  segments[0, :3], segments[0, 3:7], segments[0, 7:9] = 1, 2, 3
  segments[1, :5], segments[1, 5:8] = 1, 2
  segments[2, :] = 1
  positions = np.zeros_like(segments)
  for row in range(3):
    for col in range(1, 10):
      same = segments[row, col] == segments[row, col - 1]
      positions[row, col] = positions[row, col - 1] + 1 if same else 0
  positions = np.where(segments > 0, positions, 0)
  tokens = np.random.default_rng(0).integers(4, CONFIG.vocab_size, segments.shape)
  tokens = np.where(segments > 0, tokens, PAD_ID).astype(np.int32)
  targets_in = np.where(positions == 0, BOS_ID, np.roll(tokens, 1, axis=1))
  targets_in = np.where(segments > 0, targets_in, PAD_ID).astype(np.int32)
  return tuple(
    jnp.asarray(x) for x in (tokens, targets_in, positions, positions, segments, segments)
  )


def test_parameters_are_the_same_three_kernels():
  off, on = helpers.init_params(CONFIG), helpers.init_params(FUSED)
  assert jax.tree.structure(off) == jax.tree.structure(on)
  jax.tree.map(np.testing.assert_array_equal, off, on)
  names = set(on["encoder_layers_0"]["self_attention"])
  assert names == {"query", "key", "value", "out"}


def test_logits_and_gradients_equal_the_separate_projections():
  """Training: packed rows, dropout on (the same key), loss and gradients to 1e-5."""
  params = params_with_random_biases()
  args = packed_rows()
  weights = (args[5] > 0).astype(jnp.float32)

  def loss(params, config):
    logits = Transformer(config.replace(deterministic=False, dropout_rate=0.1)).apply(
      {"params": params}, *args, rngs={"dropout": jax.random.key(3)}
    )
    log_probs = jax.nn.log_softmax(logits)
    targets = jnp.roll(args[1], -1, axis=1)
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return -jnp.sum(picked * weights)

  loss_and_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  loss_off, grads_off = loss_and_grads(params, CONFIG)
  loss_on, grads_on = loss_and_grads(params, FUSED)
  np.testing.assert_allclose(loss_on, loss_off, rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads_on, grads_off
  )
  # The gradient reaches each of the three kernels (the key's through the stacked matmul).
  key_grad = grads_on["decoder_layers_0"]["cross_attention"]["key"]["kernel"]
  assert np.abs(np.asarray(key_grad)).max() > 0


def test_cached_decoding_steps_equal_the_separate_projections():
  """Decoding: the cross-attention cache's keys/values and every step's logits (1e-5)."""
  params = params_with_random_biases()
  inputs = jnp.asarray([[5, 9, 12, 7, EOS_ID, PAD_ID], [11, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
  tokens = jnp.asarray([[BOS_ID, 14, 15, 16], [BOS_ID, 21, 22, 23]], jnp.int32)
  caches = {c.fuse_qkv: decode.init_cache(params, inputs, c, max_len=4) for c in (CONFIG, FUSED)}
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), caches[True], caches[False]
  )
  for t in range(4):
    step = {}
    for config in (CONFIG, FUSED):
      step[config.fuse_qkv], caches[config.fuse_qkv] = decode.decode_step(
        params, caches[config.fuse_qkv], inputs != PAD_ID, tokens[:, t], jnp.array(t), config
      )
    np.testing.assert_allclose(step[True], step[False], rtol=1e-5, atol=1e-5)


def test_beam_search_returns_the_same_translations():
  params = params_with_random_biases()
  inputs = jnp.asarray([[5, 9, 12, 7, EOS_ID, PAD_ID], [11, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
  outputs = [
    beam_decode.beam_decode(params, inputs, config=config, beam_size=3, max_len=7)
    for config in (CONFIG, FUSED)
  ]
  np.testing.assert_array_equal(outputs[1].sequences, outputs[0].sequences)
  np.testing.assert_allclose(outputs[1].scores, outputs[0].scores, rtol=1e-5)

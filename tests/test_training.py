"""Loss, learning rate, sharded train step, gradient accumulation and checkpoints."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments import _defaults
from transformer_mt import checkpointing, losses, optimizer, sharding, train_step
from transformer_mt.config import TransformerConfig
from transformer_mt.model import Transformer

# Sharded and single-device runs sum gradients in a different order (float32 rounding).
# With the paper's Adam eps of 1e-9 the update g / (sqrt(v) + eps) of an element whose
# gradient is ~0 is the sign of that rounding noise, i.e. +-lr: one dead ReLU unit makes
# runs differ by O(lr) however correct the sharding is. The equivalence tests therefore
# use eps = 1e-4, which makes the update a smooth function of the gradient (Adam is
# elementwise, so its sharding is exercised the same way), and then require parameters
# to agree to 1e-5 absolute after 3 steps (lr at step 3 is 1.7e-2) and losses to 1e-5.
EQUIVALENCE_ADAM_EPS = 1e-4
SHARDED_ATOL = 1e-5
LOSS_RTOL = 1e-5

TINY_MODEL = TransformerConfig(
  vocab_size=64,
  d_model=32,
  num_heads=4,
  d_ff=64,
  num_encoder_layers=2,
  num_decoder_layers=2,
  dropout_rate=0.1,
  attention_dropout_rate=0.1,
  relu_dropout_rate=0.1,
)


def tiny_train_config(**changes) -> ml_collections.ConfigDict:
  config = _defaults.base_config().train
  config.update(warmup_steps=10, lr_scale=1.0, grad_clip_norm=1.0)
  config.update(changes)
  return config


def random_batch(seed: int, accum: int, micro: int, length: int, vocab: int = 64):
  """[accum, micro, length] arrays with ragged padding, as the input pipeline makes them."""
  rng = np.random.default_rng(seed)
  lengths_src = rng.integers(2, length + 1, size=(accum, micro))
  lengths_tgt = rng.integers(2, length + 1, size=(accum, micro))
  inputs = rng.integers(4, vocab, size=(accum, micro, length)).astype(np.int32)
  targets = rng.integers(4, vocab, size=(accum, micro, length)).astype(np.int32)
  positions = np.arange(length)
  inputs[positions >= lengths_src[..., None]] = 0
  targets[positions >= lengths_tgt[..., None]] = 0
  targets_in = np.concatenate([np.full((accum, micro, 1), 2, np.int32), targets[..., :-1]], -1)
  targets_in[targets == 0] = 0
  return {"inputs": inputs, "targets_in": targets_in, "targets": targets}


def run_steps(
  mesh_axes: dict, devices, num_steps=3, accum=1, micro=8, model_config=TINY_MODEL, seed=0
):
  mesh = sharding.make_mesh(ml_collections.ConfigDict(mesh_axes), devices)
  model = Transformer(model_config)
  tx, schedule = optimizer.make_optimizer(
    tiny_train_config(adam_eps=EQUIVALENCE_ADAM_EPS), model_config.d_model
  )
  state = train_step.create_sharded_state(seed, model, tx, mesh)
  step = train_step.jit_train_step(
    model, tx, schedule, 0.1, mesh, train_step.state_shardings(model, tx, mesh)
  )
  losses_seen = []
  for i in range(num_steps):
    batch = random_batch(100 + i, 1, accum * micro, 12)
    batch = {k: v.reshape(accum, micro, -1) for k, v in batch.items()}
    state, metrics = step(state, sharding.global_batch_from_local(batch, mesh, batch_dim=1))
    losses_seen.append(float(metrics["loss"]))
  return jax.device_get(state), losses_seen, state


def test_learning_rate_at_chosen_steps():
  """lrate = d^-0.5 min(step^-0.5, step warmup^-1.5); optax's count 0 is step 1."""
  schedule = optimizer.paper_learning_rate(512, 4000)
  expected = {
    1: 512**-0.5 * 4000**-1.5,
    4000: 512**-0.5 * 4000**-0.5,
    16000: 512**-0.5 * 16000**-0.5,
  }
  for step, value in expected.items():
    np.testing.assert_allclose(float(schedule(step - 1)), value, rtol=1e-6)
  assert float(schedule(3999)) == pytest.approx(
    float(jnp.max(jax.vmap(schedule)(jnp.arange(8000))))
  )


def test_label_smoothed_loss_matches_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
  targets = rng.integers(0, 7, size=(2, 5))
  weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
  eps = 0.1
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  q = np.full((2, 5, 7), eps / 7) + (1 - eps) * np.eye(7)[targets]
  expected = (-(q * log_p).sum(-1) * weights).sum() / weights.sum()
  sums = losses.cross_entropy_sums(
    jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), eps
  )
  np.testing.assert_allclose(float(sums["loss"] / sums["num_tokens"]), expected, rtol=1e-6)
  nll = (-np.take_along_axis(log_p, targets[..., None], -1)[..., 0] * weights).sum()
  np.testing.assert_allclose(float(sums["nll"]), nll, rtol=1e-6)
  assert float(sums["num_tokens"]) == 8
  assert float(sums["correct"]) == ((logits.argmax(-1) == targets) * weights).sum()

  # The closed form (no one-hot, no full log-softmax) has the gradient of the explicit one.
  def explicit(z):
    q = (1 - eps) * jax.nn.one_hot(targets, 7) + eps / 7
    return -jnp.sum(q * jax.nn.log_softmax(z) * weights[..., None])

  def closed_form(z):
    return losses.cross_entropy_sums(z, jnp.asarray(targets), jnp.asarray(weights), eps)["loss"]

  np.testing.assert_allclose(
    jax.grad(closed_form)(jnp.asarray(logits)), jax.grad(explicit)(jnp.asarray(logits)), atol=1e-6
  )


@pytest.fixture(scope="module")
def single_device_run():
  return run_steps({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])


@pytest.mark.parametrize(
  "mesh_axes",
  [
    {"data": 8, "fsdp": 1, "tensor": 1},
    {"data": 1, "fsdp": 8, "tensor": 1},
    {"data": 2, "fsdp": 2, "tensor": 2},
  ],
  ids=["data_parallel", "fsdp", "data_fsdp_tensor"],
)
def test_sharded_steps_match_single_device(single_device_run, mesh_axes):
  """3 train steps (dropout on) give the same losses and params on 8 devices as on 1."""
  if jax.device_count() < 8:
    pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (set by conftest)")
  reference_state, reference_losses, _ = single_device_run
  state, step_losses, live_state = run_steps(mesh_axes, jax.devices()[:8])
  np.testing.assert_allclose(step_losses, reference_losses, rtol=LOSS_RTOL)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=SHARDED_ATOL),
    state.params,
    reference_state.params,
  )
  if mesh_axes["fsdp"] > 1:  # parameters really are split, not replicated
    kernel = live_state.params["encoder_layers_0"]["ffn"]["wi"]["kernel"]
    assert kernel.sharding.spec[0] == "fsdp"
    assert len(kernel.addressable_shards) == 8
    assert kernel.addressable_shards[0].data.shape[0] == kernel.shape[0] // mesh_axes["fsdp"]


def test_gradient_accumulation_equals_large_batch():
  """4 micro-batches of 4 give the update of one batch of 16 (no dropout)."""
  config = TINY_MODEL.replace(dropout_rate=0.0, attention_dropout_rate=0.0, relu_dropout_rate=0.0)
  devices = jax.devices()[:1]
  one, losses_one, _ = run_steps(
    {"data": 1, "fsdp": 1, "tensor": 1},
    devices,
    num_steps=2,
    accum=1,
    micro=16,
    model_config=config,
  )
  four, losses_four, _ = run_steps(
    {"data": 1, "fsdp": 1, "tensor": 1}, devices, num_steps=2, accum=4, micro=4, model_config=config
  )
  np.testing.assert_allclose(losses_four, losses_one, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), four.params, one.params)


def test_checkpoint_restores_into_state_from_another_seed(tmp_path):
  """Save, then restore into a target initialized from a different seed: the saved values return."""
  import grain

  from transformer_mt.tokenizer import Tokenizer, train_tokenizer

  mesh = sharding.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}))
  model = Transformer(TINY_MODEL)
  tx, _ = optimizer.make_optimizer(tiny_train_config(), TINY_MODEL.d_model)
  saved = train_step.create_sharded_state(1, model, tx, mesh)
  other = train_step.create_sharded_state(2, model, tx, mesh)
  assert not np.allclose(
    saved.params["encoder_layers_0"]["ffn"]["wi"]["kernel"],
    other.params["encoder_layers_0"]["ffn"]["wi"]["kernel"],
  )
  tokenizer = train_tokenizer([("a b c d", "e f g h")] * 50, vocab_size=14)
  iterator = iter(grain.MapDataset.range(10).to_iter_dataset())
  next(iterator)
  config = _defaults.base_config()
  manager = checkpointing.make_manager(str(tmp_path), keep=2)
  checkpointing.save(manager, 5, saved, iterator, config, tokenizer, force=True)
  checkpointing.wait(manager)

  fresh_iterator = iter(grain.MapDataset.range(10).to_iter_dataset())
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), other
  )
  restored, restored_iterator = checkpointing.restore_training(
    checkpointing.make_manager(str(tmp_path)), 5, abstract, fresh_iterator
  )
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored, saved
  )
  assert next(restored_iterator) == 1  # the iterator continues after the element consumed
  read_config, read_tokenizer, step = checkpointing.read_config(str(tmp_path))
  assert step == 5 and read_config.train.warmup_steps == config.train.warmup_steps
  assert isinstance(read_tokenizer, Tokenizer)
  assert read_tokenizer.encode(["a b"]) == tokenizer.encode(["a b"])

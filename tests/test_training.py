"""Loss, learning rate, sharded train step, gradient accumulation and checkpoints."""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from helpers import (
  assert_same_params_after_real_movement,
)

from transformer_mt.config import defaults as _defaults
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors, sharding
from transformer_mt.training import losses, optimizer, train_step
from transformer_mt.training import setup as run_setup
from transformer_mt.workdir import checkpointing

# The equivalence tests (8 devices vs 1, 4 micro-batches vs 1 batch, and tests/test_multihost.py)
# train with plain SGD: its update -lr * g is linear in the gradient, so a wrong gradient scale
# (a missing 1/N, a shard counted twice) moves the parameters by as much as it scales g. Adam
# would hide it (it divides g by its own running magnitude), and so would clipping.
# Sharded and single-device runs sum gradients in a different order (float32 rounding): after
# 3 steps at lr 5.6e-3, 1.1e-2, 1.7e-2 (lr_scale 1, warm-up 10, d_model 32, 1+1 layers) the
# parameters differ by at most 1.2e-7 (data 8; 3e-8 on 2 x 2 x 2) and have moved by 5.7e-3.
# They must agree to PARAMS_ATOL and move at least MIN_MOVEMENT_OVER_ATOL times it (asserted;
# both in tests/helpers.py), so the tolerance is small against what it checks. Mutants measured
# on the 2+2-layer model these tests used before: the first data shard's rows counted twice
# put the 8-device params 7.6e-5 off; the whole gradient doubled on a sharded mesh (a double
# psum) 3.2e-4, which the Adam version of these tests passed; one tensor shard of the FFN
# gradient doubled 1.1e-5.
EQUIVALENCE_TRAIN = {"optimizer": "sgd", "lr_scale": 1.0, "grad_clip_norm": 0.0}
LOSS_RTOL = 1e-5

TINY_MODEL = TransformerConfig(
  vocab_size=64,
  d_model=32,
  num_heads=8,  # 8 divides it: the tensor-parallel test shards the heads over 8 devices
  d_ff=64,
  num_encoder_layers=1,  # each layer kind once: compilations are what these tests cost
  num_decoder_layers=1,
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


@dataclasses.dataclass
class Run:
  initial_state: train_step.TrainState  # on the host, before the first step
  initial_params: Any  # its params
  state: train_step.TrainState  # on the host, after the last step
  losses: list[float]  # each step's mean training loss
  live_state: train_step.TrainState  # the device arrays, sharded over the mesh


def run_steps(
  mesh_axes: dict,
  devices,
  num_steps=3,
  accum=1,
  micro=8,
  model_config=TINY_MODEL,
  seed=0,
  train_changes=EQUIVALENCE_TRAIN,
  initial_state=None,
) -> Run:
  """`num_steps` steps from seed `seed`'s state, or from `initial_state` (a host state of the
  same model and optimizer, put in this mesh's layout: no initialization compiled)."""
  mesh = sharding.make_mesh(ml_collections.ConfigDict(mesh_axes), devices)
  model = Transformer(model_config)
  tx, schedule = optimizer.make_optimizer(tiny_train_config(**train_changes), model_config.d_model)
  shardings = train_step.state_shardings(model, tx, mesh)
  if initial_state is None:
    state = train_step.create_sharded_state(seed, model, tx, mesh)
  else:
    state = jax.device_put(initial_state, shardings)
  host_initial = jax.device_get(state)
  step = train_step.jit_train_step(model, tx, schedule, 0.1, mesh, shardings)
  losses_seen = []
  for i in range(num_steps):
    batch = random_batch(100 + i, 1, accum * micro, 12)
    batch = {k: v.reshape(accum, micro, -1) for k, v in batch.items()}
    state, metrics = step(state, sharding.global_batch_from_local(batch, mesh, batch_dim=1))
    losses_seen.append(float(metrics["loss"]))
  return Run(host_initial, host_initial.params, jax.device_get(state), losses_seen, state)


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


def test_cosine_schedule_warms_up_as_the_paper_then_decays_to_zero():
  """train.schedule='cosine': the paper's warm-up to the same peak, then
  peak * (1 + cos(pi * (step - warmup) / (num_steps + 1 - warmup))) / 2, step counted from 1."""
  warmup, num_steps, d_model, scale = 40, 200, 256, 0.7
  train = tiny_train_config(schedule="cosine", warmup_steps=warmup, num_steps=num_steps)
  train.lr_scale = scale
  schedule = optimizer.learning_rate(train, d_model)
  paper = optimizer.paper_learning_rate(d_model, warmup, scale)
  steps = np.arange(1, num_steps + 1)
  peak = scale * d_model**-0.5 * warmup**-0.5
  decay = 0.5 * peak * (1 + np.cos(np.pi * (steps - warmup) / (num_steps + 1 - warmup)))
  expected = np.where(steps <= warmup, peak * steps / warmup, decay)
  got = np.array([float(schedule(step - 1)) for step in steps])
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-9)
  # The warm-up is the paper's, and the last update still moves the parameters.
  np.testing.assert_allclose(got[:warmup], [float(paper(c)) for c in range(warmup)], rtol=1e-5)
  assert 0 < got[-1] < 1e-3 * peak
  # rsqrt (the default) is the paper's schedule.
  rsqrt = optimizer.learning_rate(tiny_train_config(warmup_steps=warmup, lr_scale=scale), d_model)
  assert float(rsqrt(150)) == pytest.approx(float(paper(150)))


def test_a_sweeps_learning_rate_settings_are_inputs_of_one_compiled_step():
  """Two trials differing in train.lr_scale and train.warmup_steps lower to one program (which
  the persistent compilation cache then compiles once), and a trial steps at its own rate: the
  host's schedule, bit for bit."""
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1}), jax.devices()[:1]
  )
  model = Transformer(TINY_MODEL)
  batch = sharding.global_batch_from_local(random_batch(7, 1, 4, 8), mesh, batch_dim=1)
  programs = []
  for scale, warmup in ((0.5, 40), (2.0, 10)):
    config = tiny_train_config(lr_scale=scale, warmup_steps=warmup)
    tx, host_schedule = optimizer.make_optimizer(config, TINY_MODEL.d_model)
    shardings, abstract = train_step.state_layout(model, tx, mesh)
    step = train_step.jit_train_step(
      model,
      tx,
      host_schedule,
      0.1,
      mesh,
      shardings,
      optimizer_for=functools.partial(optimizer.make_optimizer, config, TINY_MODEL.d_model),
      schedule_inputs=optimizer.schedule_inputs(config),
    )
    programs.append(step.lower(abstract, batch).as_text())
  assert programs[0] == programs[1]
  state = train_step.create_sharded_state(0, model, tx, mesh, shardings=shardings)
  for count in range(3):  # the second trial's; the first's is the same program
    state, metrics = step(state, batch)
    assert float(metrics["learning_rate"]) == float(host_schedule(count))
  # Under the cosine schedule the scale is an input (its warm-up and length stay constants).
  cosine = tiny_train_config(schedule="cosine", num_steps=100)

  def cosine_at(scale, count):
    inputs = {"lr_scale": scale, "warmup_steps": jnp.float32(cosine.warmup_steps)}
    return optimizer.learning_rate(cosine, 32, inputs)(count)

  lowered = [jax.jit(cosine_at).lower(jnp.float32(s), 50).as_text() for s in (0.5, 2.0)]
  assert lowered[0] == lowered[1]
  cosine.lr_scale = 2.0
  np.testing.assert_allclose(
    float(jax.jit(cosine_at)(jnp.float32(2.0), 50)),
    float(optimizer.learning_rate(cosine, 32)(50)),
    rtol=1e-6,
  )


def test_training_setup_reuses_an_init_trace_of_its_own_model_only():
  """training_setup(traced=(model, its logical state)), setup_run's trace from before the
  tokenizer, gives the layout a fresh trace gives: reused for that model, and for another (a
  different vocabulary size) the model it builds is traced anew."""
  config = _defaults.complete(ml_collections.ConfigDict({"mesh": {"data": 1, "fsdp": 1}}))
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])

  def traced(model_config):
    model = Transformer(model_config)
    tx, _ = optimizer.make_optimizer(config.train, model_config.d_model)
    return model, train_step.logical_state(model, tx)

  fresh = run_setup.training_setup(config, None, mesh, model_config=TINY_MODEL)
  for other in (TINY_MODEL, dataclasses.replace(TINY_MODEL, vocab_size=72)):
    reused = run_setup.training_setup(config, None, mesh, TINY_MODEL, traced=traced(other))
    assert reused.abstract_state == fresh.abstract_state
    assert reused.state_shardings == fresh.state_shardings
    assert reused.abstract_state.params["source_embedder"]["embedding"]["embedding"].shape[0] == 64


@pytest.mark.parametrize(
  "changes, message",
  [
    (dict(schedule="linear"), "train.schedule='linear' is not one of"),
    (dict(schedule="cosine", warmup_steps=100, num_steps=100), "must be larger than"),
  ],
)
def test_bad_schedules_are_one_error(changes, message):
  with pytest.raises(errors.BadValue, match=message):
    optimizer.make_optimizer(tiny_train_config(**changes), 32)


def test_sgd_update_is_minus_learning_rate_times_gradient():
  """train.optimizer='sgd': params -= lr(step) * gradient, with the warm-up schedule."""
  tx, _ = optimizer.make_optimizer(tiny_train_config(optimizer="sgd", grad_clip_norm=0.0), 32)
  params = np.array([1.0, -2.0, 3.0], np.float32)
  gradient = np.array([0.5, 0.25, -4.0], np.float32)
  state = tx.init(jnp.asarray(params))
  for step in (1, 2, 3):  # warm-up (10 steps): lr = 32^-0.5 * step * 10^-1.5
    updates, state = tx.update(jnp.asarray(gradient), state)
    expected = params - 32**-0.5 * step * 10**-1.5 * gradient
    params = np.asarray(optax.apply_updates(jnp.asarray(params), updates))
    np.testing.assert_allclose(params, expected, rtol=1e-6)
  with pytest.raises(ValueError, match="train.optimizer='rmsprop' is not one of 'adam', 'sgd'"):
    optimizer.make_optimizer(tiny_train_config(optimizer="rmsprop"), 32)


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
def single_device_run(cpu_devices):
  return run_steps({"data": 1, "fsdp": 1, "tensor": 1}, cpu_devices[:1])


@pytest.mark.parametrize(
  "mesh_axes",
  [
    {"data": 8, "fsdp": 1, "tensor": 1},
    {"data": 1, "fsdp": 8, "tensor": 1},
    {"data": 1, "fsdp": 1, "tensor": 8},
    {"data": 2, "fsdp": 2, "tensor": 2},
  ],
  ids=["data_parallel", "fsdp", "tensor", "data_fsdp_tensor"],
)
def test_sharded_steps_match_single_device(single_device_run, cpu_devices, mesh_axes):
  """3 SGD steps (dropout on) give the same losses and params on 8 CPU devices as on 1, from
  the one-device run's initial state put in the mesh's layout (that a sharded initialization
  is the one-device one is test_a_sharded_state_initializes_as_on_one_device's)."""
  run = run_steps(mesh_axes, cpu_devices, initial_state=single_device_run.initial_state)
  np.testing.assert_allclose(run.losses, single_device_run.losses, rtol=LOSS_RTOL)
  assert_same_params_after_real_movement(
    run.state.params, single_device_run.state.params, single_device_run.initial_params
  )
  # Parameters really are split as asked: FSDP splits "embed", tensor parallelism "mlp" and
  # "heads" (the shards' shapes, not the specs, which name the size-1 axes too).
  layer = run.live_state.params["encoder_layers_0"]
  fsdp, tensor = mesh_axes["fsdp"], mesh_axes["tensor"]
  for kernel, split in (
    (layer["ffn"]["wi"]["kernel"], (32 // fsdp, 64 // tensor)),  # [embed, mlp]
    (
      layer["self_attention"]["query"]["kernel"],
      (32 // fsdp, 8 // tensor, 4),
    ),  # [embed, heads, kv]
  ):
    assert {shard.data.shape for shard in kernel.addressable_shards} == {split}, kernel.sharding


def test_a_sharded_state_initializes_as_on_one_device(single_device_run, cpu_devices):
  """create_sharded_state on a data x fsdp x tensor = 2 x 2 x 2 mesh (every parameter kind
  split along some axis) gives the one-device state, bit for bit, already in its layout."""
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": 2, "fsdp": 2, "tensor": 2}), cpu_devices
  )
  model = Transformer(TINY_MODEL)
  tx, _ = optimizer.make_optimizer(tiny_train_config(**EQUIVALENCE_TRAIN), TINY_MODEL.d_model)
  state = train_step.create_sharded_state(0, model, tx, mesh)
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
    jax.device_get(state),
    single_device_run.initial_state,
  )
  kernel = state.params["encoder_layers_0"]["ffn"]["wi"]["kernel"]
  assert {shard.data.shape for shard in kernel.addressable_shards} == {(16, 32)}, kernel.sharding


def test_gradient_accumulation_equals_large_batch(single_device_run, cpu_devices):
  """4 micro-batches of 4 give the SGD update of one batch of 16 (no dropout), from the same
  initial state (the one-device run's: dropout leaves the parameters' initialization alone)."""
  config = TINY_MODEL.replace(dropout_rate=0.0, attention_dropout_rate=0.0, relu_dropout_rate=0.0)
  one_device = {"data": 1, "fsdp": 1, "tensor": 1}
  initial = single_device_run.initial_state
  one = run_steps(
    one_device, cpu_devices[:1], num_steps=2, micro=16, model_config=config, initial_state=initial
  )
  four = run_steps(
    one_device,
    cpu_devices[:1],
    num_steps=2,
    accum=4,
    micro=4,
    model_config=config,
    initial_state=initial,
  )
  np.testing.assert_allclose(four.losses, one.losses, rtol=1e-5)
  assert_same_params_after_real_movement(four.state.params, one.state.params, one.initial_params)


def test_checkpoint_restores_into_state_from_another_seed(tmp_path):
  """Save, then restore into a target initialized from a different seed: the saved values return."""
  import grain

  from transformer_mt.data.tokenizer import Tokenizer, train_tokenizer

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

"""train.prng_impl (training/dropout_rng.py): every PRNG trains as the default does without
dropout; each one's masks keep 1 - rate of the units, independently across steps and
micro-batches; rbg trains the same on 8 devices as on 1 and resumes bit-exactly; a resume with
another PRNG is refused before anything is written, and "auto" resumes with the recorded one."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import (
  assert_same_params,
  assert_same_params_after_real_movement,
  final_params,
  losses_by_step,
  tiny_overrides,
)

from transformer_mt import cli
from transformer_mt.config import defaults as _defaults
from transformer_mt.config import registry
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors, sharding
from transformer_mt.training import dropout_rng, optimizer, train, train_step

# As tests/test_training.py's equivalence runs: SGD (linear in the gradient), 8 heads, each
# layer kind once (compilations are what these tests cost).
MODEL = TransformerConfig(
  vocab_size=64,
  d_model=32,
  num_heads=8,
  d_ff=64,
  num_encoder_layers=1,
  num_decoder_layers=1,
  dropout_rate=0.1,
  attention_dropout_rate=0.1,
  relu_dropout_rate=0.1,
)
NO_DROPOUT = MODEL.replace(dropout_rate=0.0, attention_dropout_rate=0.0, relu_dropout_rate=0.0)
OTHER_IMPLS = ("rbg", "unsafe_rbg")


def random_batch(seed: int, rows: int = 8, length: int = 12, vocab: int = 64):
  """[1, rows, length] arrays with ragged padding."""
  rng = np.random.default_rng(seed)
  positions = np.arange(length)
  batch = {}
  for name in ("inputs", "targets"):
    ids = rng.integers(4, vocab, size=(1, rows, length)).astype(np.int32)
    ids[positions >= rng.integers(2, length + 1, size=(1, rows))[..., None]] = 0
    batch[name] = ids
  targets_in = np.concatenate([np.full((1, rows, 1), 2, np.int32), batch["targets"][..., :-1]], -1)
  batch["targets_in"] = np.where(batch["targets"] == 0, 0, targets_in)
  return batch


def run_steps(
  prng_impl, model_config=MODEL, devices=None, mesh_axes=None, num_steps=3, initial_state=None
):
  """(losses, initial params, final state) of `num_steps` SGD steps on fixed batches, from
  seed 0's state or from `initial_state` (a host state, put in this mesh's layout: no
  initialization compiled)."""
  devices = devices or jax.devices("cpu")[:1]
  mesh_axes = mesh_axes or {"data": 1, "fsdp": 1, "tensor": 1}
  mesh = sharding.make_mesh(ml_collections.ConfigDict(mesh_axes), devices)
  model = Transformer(model_config)
  train_config = _defaults.base_config().train
  train_config.update(optimizer="sgd", warmup_steps=10, lr_scale=1.0, grad_clip_norm=0.0)
  tx, schedule = optimizer.make_optimizer(train_config, model_config.d_model)
  shardings = train_step.state_shardings(model, tx, mesh, prng_impl)
  if initial_state is None:
    state = train_step.create_sharded_state(0, model, tx, mesh, prng_impl)
  else:
    state = jax.device_put(initial_state, shardings)
  host_initial = jax.device_get(state)
  initial = host_initial.params
  step = train_step.jit_train_step(model, tx, schedule, 0.1, mesh, shardings, prng_impl=prng_impl)
  losses = []
  for i in range(num_steps):
    batch = sharding.global_batch_from_local(random_batch(100 + i), mesh, batch_dim=1)
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  return losses, initial, jax.device_get(state), host_initial


@pytest.fixture(scope="module")
def threefry_without_dropout():
  return run_steps(dropout_rng.THREEFRY, NO_DROPOUT)


@pytest.mark.parametrize("prng_impl", OTHER_IMPLS)
def test_without_dropout_every_prng_trains_as_threefry(threefry_without_dropout, prng_impl):
  """Same parameters at step 0 and after 3 SGD steps (an update linear in the gradient, so
  equal parameters mean equal gradients), same losses, bit for bit: the PRNG reaches
  nothing but the dropout masks. The key data has the PRNG's own shape."""
  losses, initial, state, _ = run_steps(prng_impl, NO_DROPOUT)
  reference_losses, reference_initial, reference, _ = threefry_without_dropout
  assert state.rng.shape == (4,) and reference.rng.shape == (2,)
  assert_same_params(initial, reference_initial)
  assert losses == reference_losses
  assert_same_params(state.params, reference.params)


def dropout_mask(prng_impl, step, micro, shape=(1000, 1000), rate=0.3):
  """The kept units (bool `shape`) of a Dropout(rate) layer under the train step's key for
  (`step`, micro-batch `micro`) of seed 0's run, as train_step derives it."""
  _, dropout_key = jax.random.split(jax.random.key(0))
  key_data = dropout_rng.initial_key_data(dropout_key, prng_impl)
  key = jax.random.fold_in(dropout_rng.step_key(key_data, jnp.int32(step), prng_impl), micro)
  out = nn.Dropout(rate).apply({}, jnp.ones(shape), deterministic=False, rngs={"dropout": key})
  kept = np.asarray(out) != 0
  np.testing.assert_allclose(np.asarray(out)[kept], 1.0 / (1.0 - rate), rtol=1e-6)
  return kept


@pytest.mark.parametrize("prng_impl", (dropout_rng.THREEFRY,) + OTHER_IMPLS)
def test_masks_keep_one_minus_the_rate_independently(prng_impl):
  """Each PRNG keeps 1 - rate of 10^6 units, within 5 standard errors (sqrt(p (1-p) / n) =
  4.6e-4); masks of two steps, and of two micro-batches of one step, agree on a unit as often
  as independent draws do (p^2 + (1-p)^2 = 0.58), not always."""
  keep, n = 0.7, 10**6
  tolerance = 5 * np.sqrt(keep * (1 - keep) / n)
  first = dropout_mask(prng_impl, step=0, micro=0)
  assert abs(first.mean() - keep) < tolerance, first.mean()
  agree = keep**2 + (1 - keep) ** 2
  agree_tolerance = 5 * np.sqrt(agree * (1 - agree) / n)
  for other in (dropout_mask(prng_impl, step=1, micro=0), dropout_mask(prng_impl, 0, micro=1)):
    assert abs(other.mean() - keep) < tolerance, other.mean()
    assert abs((first == other).mean() - agree) < agree_tolerance, (first == other).mean()


@pytest.fixture(scope="module")
def threefry_losses(cpu_devices):
  """The losses of threefry's run with dropout on one device (both rbg kinds compare)."""
  return run_steps(dropout_rng.THREEFRY, devices=cpu_devices[:1])[0]


@pytest.mark.parametrize("prng_impl", OTHER_IMPLS)
def test_rbg_trains_the_same_on_8_devices_as_on_1(cpu_devices, prng_impl, threefry_losses):
  """Dropout on, a data x fsdp x tensor mesh of 2 x 2 x 2, from the 1-device run's initial
  state (its key data included) put in the mesh's layout: the losses and parameters of 1
  device (XLA replicates RngBitGenerator, so its bits do not depend on the sharding). The
  masks are not threefry's: the losses differ from threefry's run."""
  one = run_steps(prng_impl, devices=cpu_devices[:1])
  eight = run_steps(
    prng_impl,
    devices=cpu_devices,
    mesh_axes={"data": 2, "fsdp": 2, "tensor": 2},
    initial_state=one[3],
  )
  np.testing.assert_allclose(eight[0], one[0], rtol=1e-5)
  assert_same_params_after_real_movement(eight[2].params, one[2].params, one[1])
  assert not np.allclose(threefry_losses, one[0], rtol=1e-4)


def test_auto_is_unsafe_rbg_on_accelerators_and_threefry_on_cpu():
  assert dropout_rng.resolve("auto", "gpu") == dropout_rng.resolve("auto", "tpu") == "unsafe_rbg"
  assert dropout_rng.resolve("auto", "cpu") == "threefry2x32"
  assert dropout_rng.resolve("rbg", "cpu") == "rbg"
  assert dropout_rng.key_data_shape("threefry2x32") == (2,)
  assert dropout_rng.key_data_shape("rbg") == dropout_rng.key_data_shape("unsafe_rbg") == (4,)
  with pytest.raises(errors.BadValue, match=r"train.prng_impl='philox'.*unsafe_rbg, auto"):
    dropout_rng.resolve("philox")


# A run on the synthetic pair with dropout: rbg for 6 steps at once, and 3 + 3 resumed (the
# second leg with "auto", which must take the checkpoints' rbg).
TINY = tiny_overrides("model.dropout_rate=0.1") + [
  "train.checkpoint_every=3",
  "evaluate.test_after_training=False",
]


def tiny_config(steps, prng_impl="rbg"):
  return registry.load_experiment(
    "demo", TINY + [f"train.num_steps={steps}", f"train.prng_impl='{prng_impl}'"]
  )


@pytest.fixture(scope="module")
def rbg_runs(tmp_path_factory):
  """(straight, resumed, the resumed leg's result) workdirs: 6 rbg steps at once; 3 rbg
  steps, then resumed to 6 with train.prng_impl="auto"."""
  straight = str(tmp_path_factory.mktemp("rbg_straight"))
  resumed = str(tmp_path_factory.mktemp("rbg_resumed"))
  train.train(tiny_config(6), straight, progress=False)
  train.train(tiny_config(3), resumed, progress=False)
  return straight, resumed, train.train(tiny_config(6, "auto"), resumed, progress=False)


@pytest.mark.slow
def test_rbg_run_resumes_bit_exactly(rbg_runs):
  """6 steps == 3 steps, a checkpoint, and 3 more (resumed with "auto": rbg again, see
  test_auto_resumes_with_the_recorded_prng): same parameters and per-step losses."""
  straight, resumed, _ = rbg_runs
  assert_same_params(final_params(resumed, 6), final_params(straight, 6))
  assert losses_by_step(resumed) == losses_by_step(straight)
  assert sorted(losses_by_step(straight)) == list(range(1, 7))


def files_and_times(folder):
  return {
    os.path.join(root, name): os.stat(os.path.join(root, name)).st_mtime_ns
    for root, _, names in os.walk(folder)
    for name in names
  }


@pytest.mark.slow
@pytest.mark.parametrize("other", ["threefry2x32", "unsafe_rbg"])
def test_resume_with_another_prng_is_one_error_line(rbg_runs, other, capsys):
  """The checkpoints were made with rbg: resuming with threefry (another key shape) or
  unsafe_rbg (the same shape, other masks) stops with one error line and exit status 2,
  and leaves every file of the workdir as it was."""
  workdir = rbg_runs[1]
  before = files_and_times(workdir)
  argv = ["train", "--experiment", "demo", "--workdir", workdir, *TINY, "train.num_steps=9"]
  assert cli.main([*argv, f"train.prng_impl='{other}'"]) == 2
  error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
  assert len(error) == 1 and "train.prng_impl=rbg" in error[0], error
  assert files_and_times(workdir) == before


@pytest.mark.slow
def test_auto_resumes_with_the_recorded_prng(rbg_runs):
  """A resume with "auto" (threefry on this CPU: the resumed leg of `rbg_runs`) takes the
  checkpoints' rbg: the run goes on from the checkpoint of step 3 to 6 (bit for bit the
  straight rbg run: test_rbg_run_resumes_bit_exactly), and its saved config records rbg
  again."""
  _, workdir, result = rbg_runs
  assert dropout_rng.resolve("auto", "cpu") == "threefry2x32"
  assert result["step"] == 6
  with open(os.path.join(workdir, "checkpoints", "6", "config", "metadata")) as f:
    assert json.load(f)["train"]["prng_impl"] == "rbg"

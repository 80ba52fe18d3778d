"""A non-finite loss or gradient (`train.nonfinite`): 'stop' exits 2 with the last checkpoint
intact; 'skip' has optax.apply_if_finite's semantics, bit for bit, and its count survives a
resume."""

import jax
import numpy as np
import pytest
import trained_runs
from helpers import assert_same_params, final_params

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.training import optimizer, train
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import metrics_log as metrics

# test_fault_tolerance.py's tiny run with dropout, without the decoding after the last step:
# the policy is about training steps, and the parameters are checked directly.
TINY = trained_runs.TINY


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nan_policy(tmp_path, capsys, policy):
  workdir = tmp_path / "run"
  overrides = [
    *TINY,
    "train.checkpoint_every=5",
    "train.inject_nonfinite_at=7",
    f"train.nonfinite='{policy}'",
    "train.num_steps=12",
  ]
  status = cli.main(["train", "--experiment", "demo", "--workdir", str(workdir), *overrides])
  err = capsys.readouterr().err
  steps = checkpointing.all_steps(str(workdir))
  if policy == "stop":
    assert status == 2
    error_lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and "Traceback" not in err  # (the rest is the progress bar)
    assert error_lines[0].startswith("error: Non-finite loss or gradient at step 7")
    assert "the last checkpoint (step 5) is intact" in error_lines[0]
    assert steps == [5]  # nothing was saved after the bad step
  else:
    assert status == 0 and steps[-1] == 12
    records = metrics.read_metrics(str(workdir))
    assert [r["step"] for r in records if r.get("nonfinite")] == [7]
    skipped = [r["nonfinite_steps_skipped"] for r in records if "nonfinite_steps_skipped" in r]
    assert skipped[-1] == 1
    # The logged rate is the schedule at the optimizer's count, which stops at step 7: step 8
    # applies (and logs) the rate of update 7, the one step 7 would have applied.
    rates = {r["step"]: r["learning_rate"] for r in records if "learning_rate" in r}
    assert rates[8] == rates[7] and rates[7] > rates[6]  # warmup: the rate rises each update
    config, tokenizer, _ = checkpointing.read_config(str(workdir), 12)
    from transformer_mt.runtime import sharding
    from transformer_mt.training import setup as run_setup

    setup = run_setup.training_setup(config, tokenizer, sharding.make_mesh(config.mesh))
    manager = checkpointing.make_manager(str(workdir), read_only=True)
    state, _ = checkpointing.restore_training(manager, 12, setup.abstract_state)
    assert int(state.step) == 12 and int(optimizer.updates_applied(state.opt_state)) == 11
    # Resumed, the count of skipped steps continues (from the checkpoint's step and count).
    longer = registry.load_experiment("demo", overrides[:-1] + ["train.num_steps=14"])
    train.train(longer, str(workdir), progress=False)
    records = metrics.read_metrics(str(workdir))
    assert [
      r["nonfinite_steps_skipped"] for r in records if r["step"] == 14 and "data/pairs_seen" in r
    ] == [1]
  # The resumed run's last step (the off-grid step 12 was a resume point, since superseded).
  params = final_params(str(workdir), checkpointing.all_steps(str(workdir))[-1])
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))


def test_skipped_nonfinite_step_is_as_if_its_batch_was_never_seen():
  """train.nonfinite='skip' has optax.apply_if_finite's semantics. The poisoned step leaves
  params and the whole optimizer state (moments, Adam's and the schedule's counts)
  bit-identical to before it; only `step` advances. So the run equals, bit for bit, one that
  never saw that batch and only bumped the step (which keys dropout), and it logs the
  learning rate and reaches the count of a run that never saw the batch at all."""

  from transformer_mt.config import defaults as _defaults
  from transformer_mt.model.transformer import Transformer
  from transformer_mt.model.transformer_config import TransformerConfig
  from transformer_mt.runtime import sharding
  from transformer_mt.training import train_step

  model = Transformer(
    TransformerConfig(
      vocab_size=64, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1,
      num_decoder_layers=1, dropout_rate=0.1,
    )
  )  # fmt: skip
  train_config = _defaults.base_config().train
  train_config.update(warmup_steps=4, grad_clip_norm=1.0)
  tx, schedule = optimizer.make_optimizer(train_config, 32)
  mesh = sharding.make_mesh(_defaults.base_config().mesh, jax.devices()[:1])
  shardings = train_step.state_shardings(model, tx, mesh)
  poisoned_at = 3
  step_with_poison, plain_step = (
    train_step.jit_train_step(model, tx, schedule, 0.1, mesh, shardings, inject)
    for inject in (poisoned_at, 0)
  )
  rng = np.random.default_rng(0)

  def batch():
    tokens = rng.integers(4, 64, size=(3, 1, 8, 10)).astype(np.int32)
    host = {"inputs": tokens[0], "targets": tokens[1], "targets_in": tokens[2]}
    return sharding.global_batch_from_local(host, mesh, batch_dim=1)

  batches = [batch() for _ in range(6)]  # step s trains on batches[s - 1]
  fresh = lambda: train_step.create_sharded_state(0, model, tx, mesh)  # noqa: E731

  def run(step_fn, indices, bump_after=None):
    """(host copy of the state after each step, each step's metrics)."""
    state, states, logged = fresh(), [], []
    for i in indices:
      state, step_metrics = step_fn(state, batches[i])
      states.append(jax.device_get(state))
      logged.append(jax.device_get(step_metrics))
      if i == bump_after:
        state = state.replace(step=state.step + 1)  # a step taken without an update
    return states, logged

  skipping, skipping_logs = run(step_with_poison, range(6))
  before, after = skipping[poisoned_at - 2], skipping[poisoned_at - 1]
  assert skipping_logs[poisoned_at - 1]["nonfinite"] == 1
  assert sum(m["nonfinite"] for m in skipping_logs) == 1
  assert int(after.step) == int(before.step) + 1
  assert_same_params(after.params, before.params)
  assert_same_params(after.opt_state, before.opt_state)  # moments and both counts
  assert int(optimizer.updates_applied(after.opt_state)) == poisoned_at - 1

  # Never fed the poisoned batch, only the step number bumped in its place: bit-identical.
  # (The same compiled step, whose poison then never fires: another program may round
  # differently.)
  never_saw = [i for i in range(6) if i != poisoned_at - 1]
  bumped, bumped_logs = run(step_with_poison, never_saw, bump_after=poisoned_at - 2)
  assert sum(m["nonfinite"] for m in bumped_logs) == 0
  assert_same_params(bumped[-1].params, skipping[-1].params)
  assert_same_params(bumped[-1].opt_state, skipping[-1].opt_state)
  for ours, theirs in zip(skipping_logs[poisoned_at:], bumped_logs[poisoned_at - 1 :]):
    assert ours["loss"] == theirs["loss"] and ours["learning_rate"] == theirs["learning_rate"]

  # Never fed it at all (dropout keys differ from here on, so the parameters do too): the
  # same counts, and after the skip the same learning rates, the schedule at the count.
  unseen, unseen_logs = run(plain_step, never_saw)
  assert int(optimizer.updates_applied(unseen[-1].opt_state)) == 5
  assert int(optimizer.updates_applied(skipping[-1].opt_state)) == 5
  rates = [float(m["learning_rate"]) for m in skipping_logs]
  assert rates == [float(schedule(count)) for count in (0, 1, 2, 2, 3, 4)]
  assert rates[poisoned_at:] == [float(m["learning_rate"]) for m in unseen_logs[poisoned_at - 1 :]]

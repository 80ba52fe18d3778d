"""Early stopping (`train.patience`, fairseq's --patience): the action against a brute-force
count over random loss sequences, the history read back from metrics.jsonl, and a tiny run
that stops where its scripted validation losses say, resumes counting across a restart, and
runs no step more when started again after stopping."""

import json
import os

import numpy as np
import pytest
from helpers import tiny_overrides

from transformer_mt.config import registry
from transformer_mt.runtime import errors
from transformer_mt.training import actions, train, validation
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import metrics_log as metrics


def _brute_force_stop(losses, patience):
  """The index of the evaluation that ends the run, or None: the first i at which the last
  strictly lower loss than every earlier one (the best so far) lies `patience` or more
  evaluations back."""
  for i in range(len(losses)):
    best_index = min(range(i + 1), key=lambda j: (losses[j], j))  # the first of the minimum
    if i - best_index >= patience:
      return i
  return None


class _Step:
  """What EarlyStopping reads and writes of actions.Step."""

  def __init__(self, number, loss):
    self.number, self.validation_loss, self.stop = number, loss, False


@pytest.mark.parametrize("patience", [1, 2, 3, 5])
def test_early_stopping_stops_where_a_brute_force_count_does(patience):
  rng = np.random.default_rng(patience)
  for _ in range(200):
    # Few distinct values, so ties (which are not improvements) are common.
    losses = [float(v) for v in rng.integers(0, 6, size=rng.integers(1, 15))]
    action = actions.EarlyStopping(patience, [])
    stopped = None
    for i, loss in enumerate(losses):
      step = _Step(10 * (i + 1), loss)
      action.after(step)
      if step.stop:
        stopped = i
        break
    assert stopped == _brute_force_stop(losses, patience), losses
    assert action.ended_run == (stopped is not None)
    # The same losses as a resumed run's history give the same decision, with no step.
    restored = actions.EarlyStopping(patience, [(10 * (i + 1), v) for i, v in enumerate(losses)])
    assert restored.stopped_at == (None if stopped is None else 10 * (stopped + 1))


def test_steps_without_a_validation_loss_and_patience_0_never_stop():
  action = actions.EarlyStopping(2, [])
  for number in range(1, 10):
    step = _Step(number, None)
    action.after(step)
    assert not step.stop
  never = actions.EarlyStopping(0, [(1, 1.0), (2, 2.0), (3, 3.0)])
  step = _Step(4, 4.0)
  never.after(step)
  assert not step.stop and not never.ended_run


def test_validation_history_keeps_the_losses_up_to_the_checkpoint(tmp_path):
  rows = [
    {"step": 1, "loss": 9.0},
    {"step": 2, "validation/loss": 5.0, "validation/accuracy": 0.1},
    {"step": 4, "validation/loss": 4.0},
    {"step": 6, "validation/loss": 4.5},
    {"data/pairs_seen": 3},
  ]
  text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8, "validation/lo'
  (tmp_path / "metrics.jsonl").write_text(text, encoding="utf-8")
  assert metrics.validation_history(str(tmp_path), 4) == [(2, 5.0), (4, 4.0)]
  assert metrics.validation_history(str(tmp_path), 100) == [(2, 5.0), (4, 4.0), (6, 4.5)]
  assert metrics.validation_history(str(tmp_path / "none"), 4) == []


@pytest.mark.parametrize(
  "settings, wanted",
  [(["train.patience=-1"], "train.patience=-1"), (["train.patience=2", "train.eval_every=0"], "")],
)
def test_a_bad_patience_is_one_user_error(settings, wanted):
  config = registry.load_experiment("demo", settings)
  with pytest.raises(errors.BadValue, match=wanted or "eval_every=0"):
    actions.patience_of(config.train)


# Validation losses by step for the tiny run below: the best is at step 4, then 3 worse ones.
SCRIPTED = {2: 5.0, 4: 4.0, 6: 4.5, 8: 4.0, 10: 4.2, 12: 3.0, 14: 2.0}


@pytest.fixture
def scripted_validation(monkeypatch):
  """validation.validation_fn's validate, returning SCRIPTED's loss for each evaluation in
  order (the run evaluates every 2 steps, so the n-th call is step 2n)."""
  calls = []

  def validation_fn(pairs, *args):
    def validate(params):
      calls.append(len(calls))
      return {"validation/loss": SCRIPTED[2 * len(calls)], "validation/accuracy": 0.5}

    return validate

  monkeypatch.setattr(validation, "validation_fn", validation_fn)
  return calls


def _config(num_steps):
  return registry.load_experiment(
    "demo",
    tiny_overrides(
      "data.num_validation=8",
      "train.checkpoint_every=2",
      "train.keep_checkpoints=3",
      f"train.num_steps={num_steps}",
      "train.eval_every=2",
      "train.bleu_every=0",
    )
    + ["train.patience=3"],
  )


def test_a_run_stops_early_resumes_counting_and_stays_stopped(tmp_path, scripted_validation):
  workdir = str(tmp_path / "run")
  # First leg: 6 steps, no stop yet (the best is step 4's 4.0; step 6 is one worse).
  first = train.train(_config(6), workdir, progress=False)
  assert first["step"] == 6 and first["stopped_early_at"] is None
  # Resumed to 30: steps 8 and 10 are the 2nd and 3rd without a better loss (8's equal 4.0
  # is no improvement), so the run ends at 10 with the history of the first leg counted.
  second = train.train(_config(30), workdir, progress=False)
  assert second["stopped_early_at"] == 10 and second["step"] == 10
  assert second["bleu"] is not None  # a finished run: the held-out evaluation follows
  assert checkpointing.all_steps(workdir)[-1] == 10
  logged = [r["step"] for r in metrics.read_metrics(workdir) if "loss" in r]
  assert logged == list(range(1, 11))
  # Started again, it runs no step and evaluates the same parameters.
  third = train.train(_config(30), workdir, progress=False)
  assert third["step"] == 10 and third["stopped_early_at"] == 10
  assert third["bleu"] == second["bleu"]
  assert len(scripted_validation) == 5
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "10"))


def test_patience_without_a_validation_split_is_one_user_error(tmp_path):
  config = registry.load_experiment(
    "demo",
    tiny_overrides("train.num_steps=4", "train.eval_every=2", "data.num_validation=0")
    + ["train.patience=2"],
  )
  with pytest.raises(errors.BadValue, match="no validation split"):
    train.train(config, str(tmp_path / "run"), progress=False)
  assert not os.path.exists(tmp_path / "run" / "checkpoints")

"""The training loop's actions (training/actions.py), each alone with fakes: no model, no JAX
training. What they promise the loop: metrics are fetched before a checkpoint is written, a
non-finite step stops the run once the saves in flight are done (or is counted and warned
about), the profiler traces the part of its range a run reaches, the best-BLEU checkpoint
waits for the latest manager, and a preemption makes its step the last one."""

import logging
import types

import ml_collections
import pytest

from transformer_mt.runtime import errors
from transformer_mt.training import actions, train, train_step
from transformer_mt.workdir import checkpointing, retention


class Recorder:
  """A writer, a progress bar and checkpoint managers that append what is asked of them to one
  shared list of events, so a test can read their order."""

  def __init__(self, events, name="manager", save_every=0):
    self.events, self.name, self.save_every = events, name, save_every

  # metrics_log.MetricWriter
  def write(self, step, scalars):
    self.events.append(("write", step, dict(scalars)))

  def flush(self):
    self.events.append(("flush",))

  # tqdm
  def set_postfix(self, **values):
    self.events.append(("postfix",))

  def update(self, n):
    self.events.append(("bar", n))

  def close(self):
    self.events.append(("bar_close",))

  # ocp.CheckpointManager
  def should_save(self, step):
    return bool(self.save_every) and step % self.save_every == 0

  def wait_until_finished(self):
    self.events.append(("wait", self.name))

  def latest_step(self):
    return 0

  def all_steps(self):
    return []


def step_metrics(nonfinite=False):
  return {"loss": 1.5, "accuracy": 0.5, "num_tokens": 100.0, "nonfinite": float(nonfinite)}


def make_step(number, log=False, final=False, nonfinite=False, state=None):
  return actions.Step(number, state, step_metrics(nonfinite), log=log, final=final)


def log_metrics(events, policy="stop", skipped=0, save_every=0):
  counts = types.SimpleNamespace(seen=7, empty=0, too_long=0)
  recorder = Recorder(events, save_every=save_every)
  return actions.LogMetrics(recorder, recorder, recorder, counts, policy, skipped, max_len=32)


def rows(events):
  return [(event[1], event[2]) for event in events if event[0] == "write"]


def test_log_metrics_writes_the_share_of_time_spent_waiting_for_input(monkeypatch):
  """input_wait_share: the pending steps' waits for their batches over the interval's wall
  time (a fake clock: 10 s since the last fetch, 1 + 3 s of them waiting)."""
  clock = iter([100.0, 110.0, 110.0])
  monkeypatch.setattr(actions.time, "perf_counter", lambda: next(clock))
  events = []
  action = log_metrics(events)
  for number, wait in ((1, 1.0), (2, 3.0)):
    step = make_step(number, log=number == 2)
    step.input_wait_s = wait
    action.after(step)
  shares = [row["input_wait_share"] for _, row in rows(events) if "loss" in row]
  assert shares == [0.4, 0.4]


def test_log_metrics_fetches_before_a_save_step():
  """Steps 1 and 2 stay pending; step 3, neither a log step nor the last but a checkpoint step,
  has all three written (with the data counters) before anything else may save it."""
  events = []
  action = log_metrics(events, save_every=3)
  action.after(make_step(1))
  action.after(make_step(2))
  assert events == []
  action.after(make_step(3))
  assert [step for step, _ in rows(events)] == [1, 2, 3, 3]
  assert rows(events)[0][1]["loss"] == 1.5 and "tokens_per_second" in rows(events)[0][1]
  assert rows(events)[3][1] == {
    "data/pairs_seen": 7,
    "data/dropped_empty": 0,
    "data/dropped_too_long": 0,
    "nonfinite_steps_skipped": 0,
  }
  assert ("flush",) in events and ("bar", 3) in events
  # A log step and the last step fetch too.
  events.clear()
  action.after(make_step(4, log=True))
  action.after(make_step(5, final=True))
  assert [step for step, _ in rows(events)] == [4, 4, 5, 5]


def test_log_metrics_stop_policy_raises_after_waiting_for_the_saves():
  events = []
  action = log_metrics(events, policy="stop")
  action.after(make_step(1))
  with pytest.raises(train_step.NonFiniteError, match="at step 2;"):
    action.after(make_step(2, log=True, nonfinite=True))
  # The rows are written first, then the saves in flight finish, then the bar closes.
  names = [event[0] for event in events]
  assert names[-3:] == ["flush", "wait", "bar_close"]
  assert rows(events)[-1][1]["nonfinite_steps_skipped"] == 1


def test_log_metrics_skip_policy_counts_and_warns(caplog):
  events = []
  action = log_metrics(events, policy="skip", skipped=2)  # two skipped before a resume
  with caplog.at_level(logging.WARNING):
    action.after(make_step(1, nonfinite=True))
    action.after(make_step(2, log=True))
  assert action.skipped == 3
  assert rows(events)[-1][1]["nonfinite_steps_skipped"] == 3
  assert "Skipped the update of step 1: non-finite loss or gradient." in caplog.text
  assert ("wait", "manager") not in events


def test_log_metrics_refuses_an_unknown_policy():
  with pytest.raises(errors.BadValue, match="train.nonfinite='ignore'"):
    log_metrics([], policy="ignore")


def test_log_metrics_close_closes_the_bar_and_reports_dropped_pairs(caplog):
  events = []
  action = log_metrics(events)
  action.filter_counts.too_long = 4
  with caplog.at_level(logging.INFO):
    action.close()
  assert events == [("bar", 0), ("bar_close",)]
  assert "dropped 0 empty and 4 longer than data.max_len=32 tokens" in caplog.text


@pytest.mark.parametrize("steps", [[4], [5, 3], [0, 2], [1.5, 2], [1, 2, 3]])
def test_profile_refuses_a_bad_range(steps, tmp_path):
  with pytest.raises(errors.BadValue, match="train.profile_steps"):
    actions.Profile(steps, str(tmp_path))


@pytest.fixture
def traces(monkeypatch):
  """The profiler calls Profile makes, recorded instead of tracing."""
  calls = []
  monkeypatch.setattr(actions.jax.profiler, "start_trace", lambda d: calls.append(("start", d)))
  monkeypatch.setattr(actions.jax.profiler, "stop_trace", lambda: calls.append(("stop",)))
  monkeypatch.setattr(actions.jax, "block_until_ready", lambda x: calls.append(("ready",)))
  return calls


def run_profile(profile, numbers, calls):
  started = []
  for number in numbers:
    profile.before(number)
    if profile.active:
      started.append(number)
    profile.after(make_step(number))
  profile.close()
  return started


def test_profile_traces_its_range_and_a_resumed_run_the_rest(traces, tmp_path):
  directory = str(tmp_path / "tensorboard")
  assert run_profile(actions.Profile([3, 5], str(tmp_path)), range(1, 9), traces) == [3, 4, 5]
  assert traces == [("start", directory), ("ready",), ("stop",)]
  traces.clear()
  # Resumed at step 3 (steps 4.. run): the trace starts at 4 and still stops after 5.
  assert run_profile(actions.Profile([3, 5], str(tmp_path)), range(4, 9), traces) == [4, 5]
  assert traces == [("start", directory), ("ready",), ("stop",)]
  traces.clear()
  # Resumed past the range, or no range: nothing is traced.
  assert run_profile(actions.Profile([3, 5], str(tmp_path)), range(6, 9), traces) == []
  assert run_profile(actions.Profile([], str(tmp_path)), range(1, 4), traces) == []
  assert traces == []


def test_profile_close_stops_a_trace_the_run_ended_inside(traces, tmp_path, caplog):
  with caplog.at_level(logging.INFO):
    assert run_profile(actions.Profile([3, 10], str(tmp_path)), range(1, 6), traces) == [3, 4, 5]
  assert traces == [("start", str(tmp_path / "tensorboard")), ("stop",)]
  assert "Wrote a profiler trace of steps 3-10" in caplog.text


def test_validation_bleu_waits_for_the_latest_manager_before_saving_the_best(monkeypatch):
  events = []
  monkeypatch.setattr(
    checkpointing,
    "save_best",
    lambda manager, step, params, config, tokenizer, bleu: events.append(
      ("save_best", manager.name, step, params, bleu)
    ),
  )

  def scores(params):
    events.append(("scores", params))
    return {"validation/bleu": 12.5, "validation/chrf": 40.0}

  action = actions.ValidationBleu(
    scores,
    4,
    Recorder(events),
    Recorder(events, "latest"),
    Recorder(events, "best"),
    config=None,
    tokenizer=None,
  )
  params = types.SimpleNamespace(params="P")
  for number in (1, 2, 3, 5, 6):
    action.after(make_step(number, state=params))
  assert events == []
  action.after(make_step(4, state=params))
  assert events == [
    ("scores", "P"),
    ("write", 4, {"validation/bleu": 12.5, "validation/chrf": 40.0}),
    ("flush",),
    ("wait", "latest"),
    ("save_best", "best", 4, "P", 12.5),
    ("wait", "best"),
  ]
  events.clear()
  action.after(make_step(7, final=True, state=params))  # the final step, off the period
  assert ("save_best", "best", 7, "P", 12.5) in events


def test_a_stopping_steps_bleu_waits_until_its_checkpoint_is_saved(monkeypatch):
  """A preemption (or early stop) on a BLEU step: nothing is decoded in `after`; `close`, which
  the loop calls after SaveCheckpoint saved the step, waits for that save, then evaluates."""
  events = []
  monkeypatch.setattr(
    checkpointing,
    "save_best",
    lambda manager, step, params, config, tokenizer, bleu: events.append(("save_best", step)),
  )

  def scores(params):
    events.append(("scores", params))
    return {"validation/bleu": 12.5, "validation/chrf": 40.0}

  action = actions.ValidationBleu(
    scores, 4, Recorder(events), Recorder(events, "latest"), Recorder(events, "best"), None, None
  )
  step = make_step(4, state=types.SimpleNamespace(params="P"))
  step.stop = True
  action.after(step)
  assert events == []
  events.append(("checkpoint saved by SaveCheckpoint.after", 4))
  action.close()
  assert events[:3] == [
    ("checkpoint saved by SaveCheckpoint.after", 4),
    ("wait", "latest"),
    ("scores", "P"),
  ]
  assert ("save_best", 4) in events
  events.clear()
  action.close()  # evaluated once
  assert events == []


def test_validation_loss_is_due_every_eval_every_and_at_the_final_step():
  events = []
  state = types.SimpleNamespace(params="P")
  action = actions.ValidationLoss(lambda p: {"validation/loss": 2.0}, 3, Recorder(events))
  for number in range(1, 8):
    action.after(make_step(number, final=number == 7, state=state))
  assert [event[1] for event in events if event[0] == "write"] == [3, 6, 7]
  # Without validation pairs (validate None) or with eval_every 0: never.
  for validate, every in ((None, 3), (lambda p: {}, 0)):
    events.clear()
    quiet = actions.ValidationLoss(validate, every, Recorder(events))
    quiet.after(make_step(3, final=True, state=state))
    assert events == []


def test_pruning_reports_its_metric_and_stops_where_the_pruner_says():
  """The trial hears each value of its metric at its step; the step the pruner answers True
  to is the run's last. Steps without the metric are not reported; a process without a
  reporter (not process 0) follows the others' decision, here none."""
  heard = []

  class Reporter:
    def report(self, step, value):
      heard.append((step, value))
      return step == 20

  action = actions.Pruning(Reporter(), "validation/bleu")
  steps = [make_step(number) for number in (10, 15, 20)]
  steps[0].scores.update({"validation/bleu": 1.5, "validation/loss": 3.0})
  steps[2].scores.update({"validation/bleu": 0.5})
  for step in steps:
    action.after(step)
  assert heard == [(10, 1.5), (20, 0.5)]
  assert [step.last for step in steps] == [False, False, True] and action.pruned_at == 20
  follower = actions.Pruning(None, "validation/bleu")
  follower.after(steps[0])
  assert follower.pruned_at is None


class FakeSignal:
  def __init__(self, stop_at):
    self.stop_at, self.asked = stop_at, []

  def stop_after(self, number, log_step):
    self.asked.append((number, log_step))
    return number == self.stop_at

  def describe(self):
    return "SIGTERM"


def test_preemption_makes_its_step_the_last_one(caplog):
  action = actions.Preemption(FakeSignal(stop_at=3))
  steps = [make_step(number, log=number == 2) for number in (1, 2, 3)]
  for step in steps:
    action.after(step)
  assert [(step.stop, step.last) for step in steps] == [(False, False)] * 2 + [(True, True)]
  assert action.stop_signal.asked == [(1, False), (2, True), (3, False)]
  assert action.stopped and action.stopped_at == 3
  with caplog.at_level(logging.WARNING):
    action.close()
  assert "Stopped by SIGTERM after step 3; its checkpoint is saved." in caplog.text


def test_save_checkpoint_forces_the_last_step_and_waits_on_close(monkeypatch, caplog):
  saved = []
  monkeypatch.setattr(
    checkpointing,
    "save",
    lambda manager, step, *args, force, resume_point_only: saved.append((step, force)),
  )
  events = []
  config = ml_collections.ConfigDict({"train": {"num_steps": 5}})
  action = actions.SaveCheckpoint(Recorder(events), "batches", config, None, restored_step=5)
  action.after(make_step(4))
  stopped = make_step(5)
  stopped.stop = True
  action.after(stopped)
  assert saved == [(4, False), (5, True)]
  with caplog.at_level(logging.INFO):
    action.close()
  assert "Checkpoint step 5 already reached train.num_steps=5." in caplog.text
  assert events == [("wait", "manager")]


def test_a_save_off_the_grid_is_marked_a_resume_point(monkeypatch):
  """Checkpoints every 5: a signal's stop at 17 and the last step of a run ending at 23 are
  saved off the grid, so marked; 15 and a stop at 20, on it, are regular."""
  events = []
  monkeypatch.setattr(
    checkpointing,
    "save",
    lambda manager, step, *args, force, resume_point_only: events.append(
      (step, force, resume_point_only)
    ),
  )
  config = ml_collections.ConfigDict({"train": {"num_steps": 23}})
  action = actions.SaveCheckpoint(Recorder([], save_every=5), "batches", config, None, None)
  action.after(make_step(15))
  action.after(make_step(16))
  for number in (17, 20):
    stopped = make_step(number)
    stopped.stop = stopped.preempted = True
    action.after(stopped)
  action.after(make_step(23, final=True))
  assert events == [
    (15, False, False),
    (16, False, False),
    (17, True, True),  # off the grid: a resume point
    (20, True, False),  # on it: a regular checkpoint
    (23, True, True),  # the last step, off the grid
  ]


def kept_by_policy(keep, steps, marked, save_every=5):
  """The steps retention.KeepRegular keeps of `steps` (the last being saved now), where the
  older ones in `marked` carry the resume-point mark."""
  policy = retention.KeepRegular(keep, save_every, read_mark=lambda step: step in marked)
  infos = [types.SimpleNamespace(step=step, metrics=None, time=None) for step in steps]
  return [step for step, kept in zip(steps, policy.should_preserve(infos, context=None)) if kept]


def test_resume_points_never_count_toward_the_checkpoints_kept():
  # A resume point being saved (17) is kept beside the last 3 regular ones.
  assert kept_by_policy(3, [5, 10, 15, 17], marked=set()) == [5, 10, 15, 17]
  # Once a newer save starts, older resume points go, and push out no regular checkpoint.
  assert kept_by_policy(3, [5, 10, 12, 13, 15], marked={12, 13}) == [5, 10, 15]
  assert kept_by_policy(3, [5, 10, 15, 17, 20], marked={17}) == [10, 15, 20]
  # An older checkpoint without the mark (saved before it existed) counts as regular.
  assert kept_by_policy(3, [5, 7, 10, 15], marked=set()) == [7, 10, 15]
  # keep=None keeps every regular checkpoint.
  assert kept_by_policy(None, [5, 10, 12, 15], marked={12}) == [5, 10, 15]


def test_resume_point_marks_are_read_once():
  reads = []
  policy = retention.KeepRegular(2, 5, read_mark=lambda step: reads.append(step) or False)
  for steps in ([5], [5, 10], [5, 10, 15]):
    infos = [types.SimpleNamespace(step=step, metrics=None, time=None) for step in steps]
    policy.should_preserve(infos, context=None)
  assert reads == []  # each was the save in progress once, judged by the grid then
  policy = retention.KeepRegular(2, 5, read_mark=lambda step: reads.append(step) or False)
  infos = [types.SimpleNamespace(step=step, metrics=None, time=None) for step in (5, 10, 15)]
  policy.should_preserve(infos, context=None)
  policy.should_preserve(infos, context=None)
  assert reads == [5, 10]


class Spy(actions.Action):
  """Appends what the loop asks of it to `events`."""

  def __init__(self, name, events, stop_at=None):
    self.name, self.events, self.stop_at = name, events, stop_at

  def before(self, number):
    self.events.append((self.name, "before", number))

  def after(self, step):
    self.events.append((self.name, "after", step.number, step.last))
    if step.number == self.stop_at:
      step.stop = True


def test_run_loop_calls_the_actions_in_order_and_stops_when_asked():
  """A resumed run (at step 2) of 6 steps that one action stops after step 4: later actions
  see that step as the last, the loop leaves, and closing is the caller's (train._train)."""
  events = []
  config = ml_collections.ConfigDict({"train": {"num_steps": 6, "log_every": 2}})
  run = types.SimpleNamespace(
    config=config,
    state=2,
    start=2,
    batches=iter(range(100)),
    step_fn=lambda state, batch: (state + 1, {"batch": batch}),
  )
  loop_actions = [Spy("a", events, stop_at=4), Spy("b", events)]
  assert train.run_loop(run, loop_actions) == 4
  assert events == [
    ("a", "before", 3),
    ("b", "before", 3),
    ("a", "after", 3, False),
    ("b", "after", 3, False),
    ("a", "before", 4),
    ("b", "before", 4),
    ("a", "after", 4, False),
    ("b", "after", 4, True),
  ]


def test_default_actions_come_in_the_contracts_order(monkeypatch, tmp_path):
  """Profile, preemption, metrics (the NaN check), validation loss, early stopping (which
  reads the loss just computed), BLEU, then the save (which sees early stopping's stop)."""
  monkeypatch.setattr(train.optimizer, "updates_applied", lambda opt_state: 0)
  config = ml_collections.ConfigDict(
    {
      "train": {
        "num_steps": 6,
        "profile_steps": [],
        "nonfinite": "stop",
        "eval_every": 2,
        "patience": 0,
      },
      "data": {"max_len": 32},
    }
  )
  unused = ("writer", "manager", "best_manager", "filter_counts", "validate", "batches")
  run = types.SimpleNamespace(
    config=config,
    start=0,
    state=types.SimpleNamespace(opt_state=None),
    workdir=str(tmp_path),
    bleu_every=0,
    **dict.fromkeys(unused + ("tokenizer", "restored_step")),
  )
  kinds = [type(a) for a in train.default_actions(run, FakeSignal(None), progress=False)]
  assert kinds == [
    actions.Profile,
    actions.Preemption,
    actions.LogMetrics,
    actions.ValidationLoss,
    actions.EarlyStopping,
    actions.ValidationBleu,
    actions.SaveCheckpoint,
  ]

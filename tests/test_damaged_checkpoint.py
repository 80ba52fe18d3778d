"""A damaged checkpoint skipped on resume is set aside, so its step can be saved again."""

import pathlib
import re
import shutil
import signal

import pytest
import test_fault_tolerance
from test_fault_tolerance import (
  TINY,
  _truncate_arrays,
  assert_same_params,
  final_params,
  losses_by_step,
)

from transformer_mt import checkpointing, cli, distributed, registry, resume, train, train_step

# The uninterrupted 10-step run with checkpoints at 5 and 10 (module-scoped): each test copies and
# damages it, and every resumed run must equal it bit for bit.
ten_steps = test_fault_tolerance.ten_steps
SET_ASIDE = re.compile(r"Moved the damaged checkpoint of step (\d+) \((.+)\) to (\S+); ")


def config(steps):
  return registry.load_experiment(
    "demo", TINY + [f"train.num_steps={steps}", "train.checkpoint_every=5"]
  )


def set_aside_warnings(caplog):
  """(step, damage, destination) of each warning that set a damaged checkpoint aside."""
  found = [SET_ASIDE.match(r.getMessage()) for r in caplog.records if r.levelname == "WARNING"]
  return [(int(m[1]), m[2], pathlib.Path(m[3])) for m in found if m]


def test_a_run_ending_at_its_damaged_step_saves_that_step_again(ten_steps, tmp_path, caplog):
  """Step 10 damaged and num_steps=10: the run falls back to step 5, trains 6..10 again and
  saves step 10 (Orbax refused to while the damaged step was listed), exit 0. It equals the
  uninterrupted run bit for bit, and the damaged copy is where the warning says."""
  workdir = tmp_path / "run"
  shutil.copytree(ten_steps, workdir)
  _truncate_arrays(workdir / "checkpoints" / "10")
  damaged_files = sorted(
    (str(p.relative_to(workdir / "checkpoints" / "10")), p.read_bytes())
    for p in (workdir / "checkpoints" / "10").rglob("*")
    if p.is_file()
  )
  caplog.set_level("INFO")
  command = ["train", "--experiment", "demo", "--workdir", str(workdir), *TINY]
  assert cli.main([*command, "train.num_steps=10", "train.checkpoint_every=5"]) == 0
  assert "Resumed from the checkpoint of step 5" in caplog.text
  [(step, damage, moved_to)] = set_aside_warnings(caplog)
  assert step == 10 and damage.startswith("OUT_OF_RANGE reading "), damage
  assert moved_to == workdir / "checkpoints_damaged" / "10"
  assert damaged_files == sorted(
    (str(p.relative_to(moved_to)), p.read_bytes()) for p in moved_to.rglob("*") if p.is_file()
  )
  assert checkpointing.all_steps(str(workdir)) == [5, 10]
  assert_same_params(final_params(str(workdir), 10), final_params(str(ten_steps), 10))
  assert losses_by_step(str(workdir)) == losses_by_step(str(ten_steps))


def _sigterm_after_step(monkeypatch, stop_at):
  """Makes the training step send this process SIGTERM once it has computed step `stop_at`:
  the real signal and handler of a preemption, at a step chosen in advance."""
  jit_train_step = train_step.jit_train_step

  def with_preemption(*args, **kwargs):
    step_fn = jit_train_step(*args, **kwargs)

    def step(state, batch):
      state, step_metrics = step_fn(state, batch)
      if int(state.step) == stop_at:
        signal.raise_signal(signal.SIGTERM)
      return state, step_metrics

    return step

  monkeypatch.setattr(train_step, "jit_train_step", with_preemption)


@pytest.mark.slow
def test_a_preemption_at_the_damaged_step_saves_it_again(ten_steps, tmp_path, caplog):
  """Checkpoints at 5 and 7 (a preemption's), step 7 damaged; the resumed run is preempted at
  step 7 again, so its forced save lands on the damaged step: it is saved and the run stops
  cleanly. Resumed once more, the run finishes equal to the uninterrupted one bit for bit."""
  workdir = tmp_path / "run"
  caplog.set_level("INFO")
  with pytest.MonkeyPatch.context() as monkeypatch:
    _sigterm_after_step(monkeypatch, 7)
    assert train.train(config(10), str(workdir), progress=False)["preempted"]
    assert checkpointing.all_steps(str(workdir)) == [5, 7]
    _truncate_arrays(workdir / "checkpoints" / "7")
    caplog.clear()
    result = train.train(config(10), str(workdir), progress=False)
  assert result["preempted"] and result["step"] == 7
  assert "Resumed from the checkpoint of step 5" in caplog.text
  assert "Stopped by SIGTERM after step 7" in caplog.text
  [(step, damage, moved_to)] = set_aside_warnings(caplog)
  assert step == 7 and damage.startswith("OUT_OF_RANGE reading "), damage
  assert moved_to == workdir / "checkpoints_damaged" / "7" and (moved_to / "params").is_dir()
  assert checkpointing.all_steps(str(workdir)) == [5, 7]
  assert train.train(config(10), str(workdir), progress=False)["step"] == 10
  assert_same_params(final_params(str(workdir), 10), final_params(str(ten_steps), 10))
  assert losses_by_step(str(workdir)) == losses_by_step(str(ten_steps))


def test_only_process_0_moves_and_a_second_copy_of_a_step_does_not_collide(
  tmp_path, monkeypatch, caplog
):
  """In a multi-process run the other processes move nothing, and all of them meet at a
  barrier after process 0 moved the steps, before anyone reads the step list again. A step
  set aside before keeps its copy; the new one is STEP-2."""
  steps_dir = tmp_path / "checkpoints"
  for step in (10, 15):
    (steps_dir / str(step) / "params").mkdir(parents=True)
  (tmp_path / "checkpoints_damaged" / "10").mkdir(parents=True)
  events = []
  monkeypatch.setattr(distributed, "barrier", lambda name: events.append(("barrier", name)))
  monkeypatch.setattr(distributed, "is_primary", lambda: False)
  caplog.set_level("WARNING")
  resume.set_aside_damaged(str(tmp_path), {15: "x is empty", 10: "y is missing"})
  assert events == [("barrier", "damaged checkpoints set aside")]
  assert sorted(p.name for p in steps_dir.iterdir()) == ["10", "15"]
  assert not caplog.records

  monkeypatch.setattr(distributed, "is_primary", lambda: True)
  resume.set_aside_damaged(str(tmp_path), {15: "x is empty", 10: "y is missing"})
  assert [p.name for p in steps_dir.iterdir()] == []
  assert set_aside_warnings(caplog) == [
    (10, "y is missing", tmp_path / "checkpoints_damaged" / "10-2"),
    (15, "x is empty", tmp_path / "checkpoints_damaged" / "15"),
  ]
  assert (tmp_path / "checkpoints_damaged" / "10-2" / "params").is_dir()
  assert not (tmp_path / "checkpoints_damaged" / "10" / "params").exists()

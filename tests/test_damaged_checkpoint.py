"""Damaged checkpoints (missing, empty or truncated files): resume skips them for the newest one
that reads back, and sets them aside so their step can be saved again; a restore failure that is
not damage stops instead; readers (translate, evaluate, score, average) give one error line."""

import asyncio
import pathlib
import re
import shutil
import signal
import subprocess

import pytest
import trained_runs
from helpers import ROOT, assert_same_params, final_params, losses_by_step, run_py

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.runtime import distributed
from transformer_mt.training import resume, train, train_step
from transformer_mt.training import setup as run_setup
from transformer_mt.workdir import checkpointing

TINY = trained_runs.TINY  # test_fault_tolerance.py's
SET_ASIDE = re.compile(r"Moved the damaged checkpoint of step (\d+) \((.+)\) to (\S+); ")


def config(steps):
  return registry.load_experiment(
    "demo", TINY + [f"train.num_steps={steps}", "train.checkpoint_every=5"]
  )


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(ten_steps, tmp_path, caplog):
  """The reference is the 10-step run itself; a copy of it has its latest checkpoint damaged."""
  assert checkpointing.all_steps(str(ten_steps)) == [5, 10]
  workdir = str(trained_runs.copy_of(ten_steps, tmp_path / "run"))
  # Truncate every array file of the latest checkpoint, as a full disk or a crash would.
  for path in (pathlib.Path(workdir) / "checkpoints" / "10" / "params").rglob("*"):
    if path.is_file() and path.stat().st_size > 0 and path.parent.name == "d":
      path.write_bytes(path.read_bytes()[:10])
  caplog.set_level("WARNING")
  resumed = train.train(config(15), workdir, progress=False)
  assert "Checkpoint 10" in caplog.text and "falling back to the previous one" in caplog.text
  # Resumed from step 5, it recomputes 6..10 exactly, then continues to 15.
  assert resumed["step"] == 15
  assert losses_by_step(workdir)[10] == losses_by_step(str(ten_steps))[10]


def _array_files(step_dir):
  return [p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"]


def _truncate_arrays(step_dir):
  for path in _array_files(step_dir):
    path.write_bytes(path.read_bytes()[:10])


def _delete_arrays(step_dir):
  for path in _array_files(step_dir):
    path.unlink()


def _delete_array_data(step_dir):
  """Only the data files each process wrote (params/ocdbt.process_*/d/), not the B-tree nodes
  of params/d/: tensorstore reads the missing data as an empty, truncated stream."""
  for path in _array_files(step_dir):
    if path.parent.parent.name.startswith("ocdbt.process_"):
      path.unlink()


def _delete_array_metadata(step_dir):
  for path in step_dir.glob("*/_METADATA"):
    path.unlink()


def _delete_data_iterator(step_dir):
  shutil.rmtree(step_dir / "data_iter")


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory):
  """A finished 10-step run with checkpoints at 5 and 10 (trained_runs.py, built once per
  session), copied by each test that damages it."""
  return trained_runs.ten_steps(tmp_path_factory)


def _snapshot(directory):
  """Every file under `directory` with its size and modification time."""
  return {
    str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
    for p in sorted(directory.rglob("*"))
    if p.is_file()
  }


@pytest.mark.parametrize(
  "damage, reason",
  [
    (_truncate_arrays, "OUT_OF_RANGE reading"),
    (_delete_arrays, "NOT_FOUND reading"),
    (_delete_array_data, "FAILED_PRECONDITION reading"),
    (_delete_array_metadata, "_METADATA is missing"),
    (_delete_data_iterator, "data_iter is missing"),
  ],
)
def test_only_a_damaged_checkpoint_is_skipped(ten_steps, tmp_path, caplog, damage, reason):
  """The resume alone (setup_run, which restores the newest readable checkpoint): training on
  from it is test_corrupt_latest_checkpoint_falls_back_to_the_previous's."""
  workdir = tmp_path / "run"
  shutil.copytree(ten_steps, workdir)
  damage(workdir / "checkpoints" / "10")
  caplog.set_level("INFO")
  run = run_setup.setup_run(config(12), str(workdir))
  run.writer.close()
  run.manager.close()
  assert run.start == 5 and run.restored_step == 5
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  skipped = [w for w in warnings if w.startswith("Checkpoint 10 in ")]
  assert len(skipped) == 1 and "is damaged (" in skipped[0] and reason in skipped[0], warnings
  assert "Resumed from the checkpoint of step 5" in caplog.text


def test_a_failed_read_waits_for_its_other_reads_before_orbax_closes_its_loop(
  ten_steps, tmp_path, monkeypatch, caplog
):
  """Orbax reads every array of an item at once, on an event loop of its own that it closes
  when the first read fails. Every other read must be done by then: one still running later
  completes into the closed loop ("Event loop is closed") or leaves an error nobody retrieves
  ("Task exception was never retrieved"), tracebacks printed after the one warning (issue 41).
  Every array read but the first starts 0.2 s late, so the others are always still running
  when the first one fails, as they are now and then in a real run."""
  import gc

  from orbax.checkpoint._src.serialization import serialization

  from transformer_mt.model import setup as run_setup
  from transformer_mt.runtime import errors, sharding

  workdir = tmp_path / "run"
  shutil.copytree(ten_steps, workdir)
  _delete_arrays(workdir / "checkpoints" / "10")
  config, tokenizer, _ = checkpointing.read_config(str(workdir), 5)
  abstract_params = run_setup.model_setup(
    config, tokenizer, sharding.make_mesh(config.mesh)
  ).abstract_params
  read, reads = serialization.async_deserialize, []

  async def read_late_but_the_first(*args, **kwargs):
    reads.append(None)
    if len(reads) > 1:
      await asyncio.sleep(0.2)
    return await read(*args, **kwargs)

  running_at_close = []
  close = asyncio.BaseEventLoop.close

  def recording_close(loop):
    running_at_close.append(len(asyncio.all_tasks(loop)))
    close(loop)

  monkeypatch.setattr(serialization, "async_deserialize", read_late_but_the_first)
  monkeypatch.setattr(asyncio.BaseEventLoop, "close", recording_close)
  caplog.set_level("ERROR", logger="asyncio")
  # The parameters' metadata (resume's model check), then the parameters themselves.
  with pytest.raises(OSError, match="No parameter metadata"):
    checkpointing.shape_mismatches(str(workdir), 10, abstract_params)
  with pytest.raises(errors.BadValue, match="damaged"):
    checkpointing.restore_params(str(workdir), 10, abstract_params)
  gc.collect()  # an unretrieved error is reported when its task is collected
  assert len(reads) > 1 and running_at_close, (reads, running_at_close)
  still_running = [count for count in running_at_close if count]
  assert not still_running, f"{len(still_running)} loops closed with tasks running: {still_running}"
  assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]


def test_resuming_past_a_damaged_checkpoint_prints_its_warnings_and_no_traceback(
  ten_steps, tmp_path
):
  """`run.py train` over a damaged latest checkpoint, as a user runs it: stderr has the
  warning that skips it and the one that sets it aside, and nothing of Orbax's event loops."""
  workdir = tmp_path / "run"
  shutil.copytree(ten_steps, workdir)
  _delete_arrays(workdir / "checkpoints" / "10")
  command = run_py("train", "--experiment", "demo", "--workdir", str(workdir), *TINY)
  command += ["train.num_steps=12", "train.checkpoint_every=5"]
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr
  for noise in ("Task exception was never retrieved", "Event loop is closed", "Traceback"):
    assert noise not in done.stderr, done.stderr
  warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
  assert len(warnings) == 2, warnings
  assert warnings[0].startswith("WARNING Checkpoint 10 in ") and "NOT_FOUND reading" in warnings[0]
  assert warnings[0].endswith("falling back to the previous one.")
  assert warnings[1].startswith("WARNING Moved the damaged checkpoint of step 10 ")
  assert "Resumed from the checkpoint of step 5" in done.stderr


def test_only_a_missing_file_of_the_checkpoint_itself_is_damage(ten_steps):
  """A FileNotFoundError about some other file (a transient error elsewhere) is not damage:
  a whole checkpoint must not be moved aside for it (issue 34)."""
  from transformer_mt.workdir import checkpointing

  items = ("params", "train_state", "data_iter", "config", "tokenizer")
  step_dir = ten_steps / "checkpoints" / "10"
  inside = str(step_dir / "params" / "d" / "lost")
  elsewhere = FileNotFoundError(2, "No such file or directory", "/tmp/some/other/file")
  assert checkpointing.find_damage(str(ten_steps), 10, items, elsewhere) is None
  wrapped = RuntimeError("restore failed")
  wrapped.__cause__ = FileNotFoundError(2, "No such file or directory", inside)
  assert "FileNotFoundError" in checkpointing.find_damage(str(ten_steps), 10, items, wrapped)
  # Without a filename, the message decides.
  in_message = FileNotFoundError(f"cannot open {inside}")
  assert checkpointing.find_damage(str(ten_steps), 10, items, in_message) is not None
  assert checkpointing.find_damage(str(ten_steps), 10, items, FileNotFoundError("x")) is None


def test_a_restore_error_that_is_not_damage_stops_and_keeps_every_checkpoint(
  ten_steps, tmp_path, capsys
):
  workdir = tmp_path / "run"
  shutil.copytree(ten_steps, workdir)
  before = _snapshot(workdir / "checkpoints")
  # Gradient clipping adds an optimizer state the checkpoints do not have.
  command = ["train", "--workdir", str(workdir), *TINY, "train.num_steps=12"]
  assert cli.main([*command, "train.grad_clip_norm=1.0"]) == 2
  err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
  assert len(err) == 1, err
  assert err[0].startswith("error: Cannot restore the checkpoint of step 10 in ")
  assert "train.grad_clip_norm" in err[0] and "not skipped" in err[0]
  assert "damaged" not in err[0] and "move" not in err[0] and "delete" not in err[0]
  assert _snapshot(workdir / "checkpoints") == before


def test_every_checkpoint_damaged_is_one_line_that_deletes_nothing(ten_steps, tmp_path, capsys):
  workdir = tmp_path / "run"
  shutil.copytree(ten_steps, workdir)
  for step in (5, 10):
    _truncate_arrays(workdir / "checkpoints" / str(step))
  before = _snapshot(workdir / "checkpoints")
  assert cli.main(["train", "--workdir", str(workdir), *TINY, "train.num_steps=12"]) == 2
  err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
  assert len(err) == 1 and "Every checkpoint in" in err[0] and "steps [5, 10]" in err[0], err
  assert "new --workdir" in err[0] and "move" not in err[0]
  assert _snapshot(workdir / "checkpoints") == before


def _empty_config_metadata(checkpoint):
  (checkpoint / "config" / "metadata").write_bytes(b"")


@pytest.mark.parametrize(
  "damage, expected",
  [
    (_truncate_arrays, ("checkpoint 10", "damaged (OUT_OF_RANGE reading")),
    (_empty_config_metadata, ("config and tokenizer of checkpoint 10", "metadata is empty")),
  ],
  ids=["parameters", "config"],
)
def test_translate_from_a_damaged_checkpoint_is_one_line(
  damage, expected, ten_steps, tmp_path, capsys
):
  """Reading a damaged checkpoint (its arrays truncated, or its config item emptied) is a file
  problem, not a bug: one error line naming the step and the damage, exit 2, and a readable
  step still translates."""
  workdir = tmp_path / "run"
  shutil.copytree(ten_steps, workdir)
  damage(workdir / "checkpoints" / "10")
  source = tmp_path / "in.txt"
  source.write_text("the old dog\n")
  command = ["translate", "--workdir", str(workdir), "--input", str(source)]
  assert cli.main([*command, "--output", str(tmp_path / "out10.txt")]) == 2
  err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
  assert len(err) == 1, err
  assert all(fragment in err[0] for fragment in expected), err
  assert not (tmp_path / "out10.txt").exists()
  command += ["--step", "5", "--output", str(tmp_path / "out5.txt")]
  assert cli.main(command) == 0
  assert len((tmp_path / "out5.txt").read_text().splitlines()) == 1


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

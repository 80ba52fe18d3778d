"""Kill -9 and preemption with bit-exact resume, corrupt checkpoints, NaN policy, config faults."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from transformer_mt import checkpointing, cli, metrics, registry, train

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Long enough (a few seconds on 2 cores) that the signal lands mid-run.
STEPS = 80
TINY = [
  "model.d_model=32",
  "model.num_heads=2",
  "model.d_ff=64",
  "model.num_encoder_layers=1",
  "model.num_decoder_layers=1",
  "model.dropout_rate=0.1",
  "data.num_train=2000",
  "data.num_eval=8",
  "tokenizer.vocab_size=300",
  "tokenizer.sample_size=2000",
  "train.batch_tokens=256",
  "train.log_every=5",
  "decode.max_len=24",
  "decode.beam_size=1",
]


def final_params(workdir, step):
  from transformer_mt import run_setup, sharding

  config, tokenizer, _ = checkpointing.read_config(workdir, step)
  setup = run_setup.model_setup(config, tokenizer, sharding.make_mesh(config.mesh))
  return jax.device_get(checkpointing.restore_params(workdir, step, setup.abstract_params))


def assert_same_params(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def losses_by_step(workdir):
  return {r["step"]: r["loss"] for r in metrics.read_metrics(workdir) if "loss" in r}


def train_command(workdir, steps, extra=()):
  return [
    sys.executable,
    "run.py",
    "train",
    "--experiment",
    "demo",
    "--workdir",
    str(workdir),
    *TINY,
    f"train.num_steps={steps}",
    "train.checkpoint_every=5",
    *extra,
  ]


def subprocess_env():
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  return env


def wait_for_checkpoint(workdir, step, process, timeout=120):
  done = pathlib.Path(workdir) / "checkpoints" / str(step) / "commit_success.txt"
  deadline = time.time() + timeout
  while not done.exists():
    assert process.poll() is None, "training exited before its first checkpoint"
    assert time.time() < deadline, "no checkpoint appeared in time"
    time.sleep(0.05)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  subprocess.run(
    train_command(workdir, STEPS), cwd=ROOT, env=subprocess_env(), check=True, capture_output=True
  )
  return workdir


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(uninterrupted, tmp_path):
  """SIGKILL at a random moment after the first checkpoint; the restarted run ends with the
  same parameters, and logs the same losses for every step, as the uninterrupted run."""
  process = subprocess.Popen(
    train_command(tmp_path, STEPS),
    cwd=ROOT,
    env=subprocess_env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  wait_for_checkpoint(tmp_path, 5, process)
  time.sleep(np.random.default_rng().uniform(0.0, 1.0))
  assert process.poll() is None, "the run finished before it could be killed; raise STEPS"
  process.send_signal(signal.SIGKILL)
  process.wait()
  subprocess.run(
    train_command(tmp_path, STEPS), cwd=ROOT, env=subprocess_env(), check=True, capture_output=True
  )
  assert_same_params(final_params(tmp_path, STEPS), final_params(uninterrupted, STEPS))
  expected, resumed = losses_by_step(uninterrupted), losses_by_step(tmp_path)
  assert sorted(resumed) == list(range(1, STEPS + 1))
  assert all(resumed[step] == expected[step] for step in resumed)


@pytest.mark.slow
def test_one_worker_sigkill_then_resume_matches_the_in_process_run(uninterrupted, tmp_path):
  """data.num_workers=1 (the pipeline in a worker process, batches prefetched onto the
  devices), killed with SIGKILL after a checkpoint and resumed: it ends with the parameters
  and per-step losses of the uninterrupted in-process run, since one worker yields the same
  batches as none."""
  command = train_command(tmp_path, STEPS, ["data.num_workers=1"])
  process = subprocess.Popen(
    command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  wait_for_checkpoint(tmp_path, 5, process)
  time.sleep(np.random.default_rng().uniform(0.0, 1.0))
  assert process.poll() is None, "the run finished before it could be killed; raise STEPS"
  process.send_signal(signal.SIGKILL)
  process.wait()
  subprocess.run(command, cwd=ROOT, env=subprocess_env(), check=True, capture_output=True)
  assert_same_params(final_params(tmp_path, STEPS), final_params(uninterrupted, STEPS))
  expected, resumed = losses_by_step(uninterrupted), losses_by_step(tmp_path)
  assert sorted(resumed) == list(range(1, STEPS + 1))
  assert all(resumed[step] == expected[step] for step in resumed)


@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_exits_0(uninterrupted, tmp_path):
  process = subprocess.Popen(
    train_command(tmp_path, STEPS),
    cwd=ROOT,
    env=subprocess_env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  wait_for_checkpoint(tmp_path, 5, process)
  assert process.poll() is None, "the run finished before it could be stopped; raise STEPS"
  process.send_signal(signal.SIGTERM)
  _, err = process.communicate(timeout=120)
  assert process.returncode == 0
  assert "Stopped by SIGTERM after step" in err
  stopped_at = int(err.split("Stopped by SIGTERM after step ")[1].split(";")[0])
  assert checkpointing.all_steps(str(tmp_path))[-1] == stopped_at  # saved at the stop step
  subprocess.run(
    train_command(tmp_path, STEPS), cwd=ROOT, env=subprocess_env(), check=True, capture_output=True
  )
  assert_same_params(final_params(tmp_path, STEPS), final_params(uninterrupted, STEPS))


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
  config = lambda steps: registry.load_experiment(  # noqa: E731
    "demo", TINY + [f"train.num_steps={steps}", "train.checkpoint_every=5"]
  )
  reference = train.train(config(10), str(tmp_path / "reference"), progress=False)
  workdir = str(tmp_path / "run")
  train.train(config(10), workdir, progress=False)
  # Truncate every array file of the latest checkpoint, as a full disk or a crash would.
  for path in (pathlib.Path(workdir) / "checkpoints" / "10" / "params").rglob("*"):
    if path.is_file() and path.stat().st_size > 0 and path.parent.name == "d":
      path.write_bytes(path.read_bytes()[:10])
  caplog.set_level("WARNING")
  resumed = train.train(config(15), workdir, progress=False)
  assert "Checkpoint 10" in caplog.text and "falling back to the previous one" in caplog.text
  # Resumed from step 5, it recomputes 6..10 exactly, then continues to 15.
  assert resumed["step"] == 15
  assert losses_by_step(workdir)[10] == losses_by_step(str(tmp_path / "reference"))[10]
  assert reference["step"] == 10


def _array_files(step_dir):
  return [p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d"]


def _truncate_arrays(step_dir):
  for path in _array_files(step_dir):
    path.write_bytes(path.read_bytes()[:10])


def _delete_arrays(step_dir):
  for path in _array_files(step_dir):
    path.unlink()


def _delete_array_metadata(step_dir):
  for path in step_dir.glob("*/_METADATA"):
    path.unlink()


def _delete_data_iterator(step_dir):
  shutil.rmtree(step_dir / "data_iter")


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory):
  """A finished 10-step run with checkpoints at 5 and 10, copied by each test that damages it."""
  workdir = tmp_path_factory.mktemp("ten_steps") / "run"
  config = registry.load_experiment(
    "demo", TINY + ["train.num_steps=10", "train.checkpoint_every=5"]
  )
  train.train(config, str(workdir), progress=False)
  return workdir


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
    (_delete_array_metadata, "_METADATA is missing"),
    (_delete_data_iterator, "data_iter is missing"),
  ],
)
def test_only_a_damaged_checkpoint_is_skipped(ten_steps, tmp_path, caplog, damage, reason):
  workdir = tmp_path / "run"
  shutil.copytree(ten_steps, workdir)
  damage(workdir / "checkpoints" / "10")
  caplog.set_level("INFO")
  config = registry.load_experiment(
    "demo", TINY + ["train.num_steps=12", "train.checkpoint_every=5"]
  )
  assert train.train(config, str(workdir), progress=False)["step"] == 12
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  skipped = [w for w in warnings if w.startswith("Checkpoint 10 in ")]
  assert len(skipped) == 1 and "is damaged (" in skipped[0] and reason in skipped[0], warnings
  assert "Resumed from the checkpoint of step 5" in caplog.text


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


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nan_policy(tmp_path, capsys, policy):
  workdir = tmp_path / "run"
  status = cli.main(
    [
      "train",
      "--experiment",
      "demo",
      "--workdir",
      str(workdir),
      *TINY,
      "train.num_steps=12",
      "train.checkpoint_every=5",
      "train.inject_nonfinite_at=7",
      f"train.nonfinite='{policy}'",
    ]
  )
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
    assert (
      records[-1].get(
        "nonfinite_steps_skipped", max(r.get("nonfinite_steps_skipped", 0) for r in records)
      )
      >= 1
    )
  params = final_params(str(workdir), steps[-1])
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))


def test_model_config_that_does_not_fit_the_checkpoint(tmp_path, capsys):
  workdir = str(tmp_path / "run")
  assert (
    cli.main(
      ["train", "--workdir", workdir, *TINY, "train.num_steps=5", "train.checkpoint_every=5"]
    )
    == 0
  )
  capsys.readouterr()
  assert (
    cli.main(["train", "--workdir", workdir, *TINY, "model.d_ff=48", "train.num_steps=10"]) == 2
  )
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: The model config does not match the checkpoint of step 5")
  assert "['wi']['kernel']: checkpoint (32, 64) vs model (32, 48)" in err
  assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
  "argv,fragment",
  [
    (["train", "--workdir", "W", "model.num_heads=3"], "not divisible by num_heads=3"),
    (["train", "--workdir", "W", "mesh.data=3"], "needs 3 devices"),
    (["train", "--workdir", "W", "train.batch_tokens=100"], "adjust train.batch_tokens"),
    (["train", "--workdir", "W", "data.source='wmt'"], "is not one of"),
    (["train", "--workdir", "W", "model.layer_norm_position='mid'"], "layer_norm_position"),
    (["train", "--workdir", "W", "train.optimizer='rmsprop'"], "train.optimizer='rmsprop'"),
    (["translate", "--workdir", "W"], "does not exist"),
    (["evaluate", "--workdir", "W"], "does not exist"),
    (["average", "--workdir", "W", "--last", "2"], "does not exist"),
  ],
)
def test_bad_config_and_arguments_give_one_line(tmp_path, capsys, argv, fragment):
  argv = [str(tmp_path / "missing") if a == "W" else a for a in argv]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and fragment in err and len(err.splitlines()) == 1, err
  assert not (tmp_path / "missing").exists()


def test_no_pickle_or_eval_in_the_package():
  """Checkpoints and configs load through Orbax/JSON and ast.literal_eval only."""
  for path in (ROOT / "transformer_mt").glob("*.py"):
    source = path.read_text(encoding="utf-8")
    for forbidden in ("import pickle", "pickle.load", "eval(", "exec(", "yaml.load("):
      hits = [
        line
        for line in source.splitlines()
        if forbidden in line and "literal_eval" not in line and not line.strip().startswith("#")
      ]
      assert not hits, f"{path.name}: {hits}"
  assert json.loads(json.dumps({"ok": True}))


def test_debug_flag_shows_the_traceback(tmp_path):
  with pytest.raises(ValueError, match="Unknown experiment"):
    cli.main(["--debug", "train", "--experiment", "nope", "--workdir", str(tmp_path / "w")])

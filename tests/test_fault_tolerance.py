"""Kill -9 and preemption with bit-exact resume, and config faults. The non-finite step policy
is in test_nonfinite_steps.py, damaged checkpoints in test_damaged_checkpoint.py. The writer
lock a SIGKILLed run leaves behind, and its takeover by the resumed run, are checked on the
killed run here (the rest of the lock is test_workdir_lock.py's)."""

import json
import os
import pathlib
import signal
import subprocess
import time

import numpy as np
import pytest
import trained_runs
from helpers import ROOT, assert_same_params, child_xla_flags, final_params, losses_by_step, run_py

from transformer_mt import cli
from transformer_mt.training import preemption
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import lock as workdir_lock
from transformer_mt.workdir import metrics_log as metrics

# A run that is killed or stopped is endless: it can only end by the signal, whatever the
# machine's speed. It is then resumed to a final step a few steps past its newest checkpoint
# (`final_step`) and compared with an uninterrupted run at that step.
ENDLESS = 1_000_000
CHECKPOINT_EVERY = 5
# The resumed run trains at least this many steps past the checkpoint it resumes from.
RESUMED_STEPS = 5
# The uninterrupted reference's length (it keeps every checkpoint): past the final step of
# the interrupted runs on a loaded 2-core machine (where they are stopped after ~5-25 steps).
# A later final step (a faster machine) gets an uninterrupted run to exactly that step.
REFERENCE_STEPS = 40
# The tiny run with dropout, without the decoding after the last step (parameters and losses
# are compared here): test_damaged_checkpoint.py's too.
TINY = trained_runs.TINY


def final_step(resumed_from, every=CHECKPOINT_EVERY):
  """The first multiple of `every` at least RESUMED_STEPS steps past `resumed_from`."""
  return -(-(resumed_from + RESUMED_STEPS) // every) * every


def train_command(workdir, steps, extra=()):
  return run_py(
    "train",
    "--experiment",
    "demo",
    "--workdir",
    str(workdir),
    *TINY,
    f"train.num_steps={steps}",
    f"train.checkpoint_every={CHECKPOINT_EVERY}",
    *extra,
  )


def subprocess_env():
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env["XLA_FLAGS"] = child_xla_flags(1)
  return env


def wait_for_checkpoint(workdir, step, process, timeout=120):
  done = pathlib.Path(workdir) / "checkpoints" / str(step) / "commit_success.txt"
  deadline = time.time() + timeout
  while not done.exists():
    assert process.poll() is None, "training exited before its checkpoint"
    assert time.time() < deadline, "no checkpoint appeared in time"
    time.sleep(0.05)


def run_to(workdir, steps, extra=()):
  return subprocess.run(
    train_command(workdir, steps, extra),
    cwd=ROOT,
    env=subprocess_env(),
    check=True,
    capture_output=True,
    text=True,
  )


def start_endless(workdir, extra, stderr=subprocess.DEVNULL):
  return subprocess.Popen(
    train_command(workdir, ENDLESS, extra),
    cwd=ROOT,
    env=subprocess_env(),
    stdout=subprocess.DEVNULL,
    stderr=stderr,
  )


def kill_at_a_random_moment_after_the_first_checkpoint(workdir, extra=()):
  """Starts an endless run, SIGKILLs it 0-1 s after its checkpoint of step 5 (possibly while
  a later asynchronous save is being written) and returns the newest complete checkpoint's
  step: where the rerun resumes."""
  process = start_endless(workdir, extra)
  wait_for_checkpoint(workdir, 5, process)
  time.sleep(np.random.default_rng().uniform(0.0, 1.0))
  process.send_signal(signal.SIGKILL)
  assert process.wait() == -signal.SIGKILL  # killed, not crashed
  return checkpointing.all_steps(str(workdir))[-1]


def write_corpus_with_bad_pairs(folder):
  """A local en-xx corpus of 1500 pairs in which every 13th target is empty and every 11th
  source is longer than data.max_len tokens: both kinds of dropped pair occur in every batch
  window. Returns the overrides that train on it and log every step."""
  rng = np.random.default_rng(0)
  words = ["".join(rng.choice(list("abcdefghijklmnop"), rng.integers(2, 7))) for _ in range(400)]
  sources, targets = [], []
  for i in range(1500):
    sentence = list(rng.choice(words, rng.integers(3, 10)))
    sources.append(" ".join(sentence * (12 if i % 11 == 0 else 1)))
    targets.append("" if i % 13 == 0 else " ".join(reversed(sentence)))
  folder.mkdir()
  (folder / "train.en").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
  (folder / "train.xx").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
  return [
    "data.source='local'",
    f"data.root='{folder}'",
    "data.source_lang='en'",
    "data.target_lang='xx'",
    "data.train_prefixes=['train']",
    "data.test_prefixes=[]",
    "train.log_every=1",
  ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The overrides of every run started here: write_corpus_with_bad_pairs's corpus, every step
  logged."""
  return write_corpus_with_bad_pairs(tmp_path_factory.mktemp("corpus") / "data")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus):
  """`uninterrupted(step)`: the workdir of an uninterrupted run on `corpus` that has the
  checkpoint of `step` (a multiple of CHECKPOINT_EVERY) and logged every step up to it. The
  run to REFERENCE_STEPS keeps all its checkpoints; for a later step, a run to exactly that
  step."""
  runs = {}

  def workdir_at(step):
    assert step % CHECKPOINT_EVERY == 0, step
    steps = max(step, REFERENCE_STEPS)
    if steps not in runs:
      runs[steps] = tmp_path_factory.mktemp(f"uninterrupted_{steps}")
      run_to(runs[steps], steps, [*corpus, "train.keep_checkpoints=1000000"])
    return runs[steps]

  return workdir_at


def assert_resumed_as_uninterrupted(workdir, final, reference):
  """The parameters at `final`, and the loss of every step 1..final, bit-identical."""
  assert_same_params(final_params(workdir, final), final_params(reference, final))
  expected, resumed = losses_by_step(reference), losses_by_step(workdir)
  assert sorted(resumed) == list(range(1, final + 1))
  assert all(resumed[step] == expected[step] for step in resumed)


def logged_rows(workdir, up_to=None):
  """metrics.jsonl's rows in file order (those of steps up to `up_to`, if given), without the
  timing columns (the ones that may differ) and the compilation rows (one per process: a
  resumed run compiles again)."""
  return [
    {k: v for k, v in r.items() if k not in ("tokens_per_second", "input_wait_share")}
    for r in metrics.read_metrics(workdir)
    if (up_to is None or r["step"] <= up_to) and "compile/programs" not in r
  ]


def logged_past_checkpoint(workdir):
  """Whether metrics.jsonl holds a step past the newest complete checkpoint's next one."""
  if not (workdir / "checkpoints").is_dir():
    return False
  checkpoints = checkpointing.all_steps(str(workdir))
  if not checkpoints:  # (metrics.jsonl is written before the first checkpoint)
    return False
  # Complete lines only: the run may be writing the last one.
  lines = (workdir / "metrics.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
  logged = [json.loads(line)["step"] for line in lines if line.endswith("\n") and line.strip()]
  return max(logged) > checkpoints[-1] + 1


@pytest.mark.slow
def test_sigkill_then_sigterm_then_resume_is_bit_identical(uninterrupted, corpus, tmp_path):
  """One run, interrupted twice and finished (three processes, on `corpus`, which drops
  pairs of both kinds in every batch window, every step logged):

  1. SIGKILL at a random moment 0-1 s after its first checkpoint, once it has also logged
     steps past its newest checkpoint. It leaves its writer lock behind.
  2. Resumed, it takes over that lock (one warning line); SIGTERMed once it has saved a
     checkpoint, it saves the current step and exits 0.
  3. Resumed from that step, it runs to `final`.

  It ends with the parameters of the uninterrupted run, and metrics.jsonl holds each step
  once, in order, row for row what the uninterrupted run wrote (losses bit-identical): the
  rows the killed run logged past its checkpoint are logged once, and the dropped-pair
  counters (data/dropped_empty, data/dropped_too_long) continue from the checkpoint instead
  of restarting at zero. (The interrupted runs are configured for 10^6 steps and the last
  one for `final`, so it also shows that train.num_steps changes nothing but where the run
  ends: not the learning rate, the data order or the dropout keys.) No lock is left."""
  workdir = tmp_path / "run"
  # 1. Should a checkpoint complete between the look at metrics.jsonl and the kill (the test
  # descheduled on a loaded machine), nothing would be repeated: the run is then resumed and
  # killed again.
  for _ in range(3):
    killed = start_endless(workdir, corpus)
    wait_for_checkpoint(workdir, 5, killed)
    time.sleep(np.random.default_rng().uniform(0.0, 1.0))
    deadline = time.time() + 120
    while not logged_past_checkpoint(workdir):
      assert killed.poll() is None, "training exited"
      assert time.time() < deadline, "no step logged past a checkpoint in time"
      time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL  # killed, not crashed
    if logged_past_checkpoint(workdir):  # the resumed run repeats logged steps
      break
  else:
    pytest.fail("a checkpoint completed before each of 3 kills")
  assert workdir_lock.read_holder(str(workdir))["pid"] == killed.pid  # SIGKILL left it
  resumed_from = checkpointing.all_steps(str(workdir))[-1]

  # 2. In the training loop (its SIGTERM handler set) once it has saved a step.
  with open(tmp_path / "stopped.log", "w") as log:
    stopped = start_endless(workdir, corpus, stderr=log)
  wait_for_checkpoint(workdir, (resumed_from // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY, stopped)
  stopped.send_signal(signal.SIGTERM)
  try:
    assert stopped.wait(timeout=120) == 0
  finally:  # one that ignored the signal is not left running
    if stopped.poll() is None:
      stopped.kill()
  err = (tmp_path / "stopped.log").read_text()
  assert f"Took over the writer lock of {workdir} from pid {killed.pid}" in err
  assert f"Resumed from the checkpoint of step {resumed_from}" in err
  assert "Stopped by SIGTERM after step" in err
  stopped_at = int(err.split("Stopped by SIGTERM after step ")[1].split(";")[0])
  assert checkpointing.all_steps(str(workdir))[-1] == stopped_at  # saved at the stop step

  # 3.
  final = final_step(stopped_at)
  run_to(workdir, final, corpus)
  reference = uninterrupted(final)
  assert_resumed_as_uninterrupted(workdir, final, reference)
  expected = logged_rows(reference, up_to=final)
  counts = [r for r in expected if "data/dropped_empty" in r and r["step"] <= resumed_from][-1]
  assert counts["data/dropped_empty"] > 0 and counts["data/dropped_too_long"] > 0
  resumed = logged_rows(workdir)
  steps = [r["step"] for r in resumed]
  assert steps == sorted(steps)  # in order; each step's rows (loss, then counts) together
  assert resumed == expected
  assert not (workdir / workdir_lock.LOCK_FILENAME).exists()


@pytest.mark.slow
def test_one_worker_sigkill_then_resume_matches_the_in_process_run(uninterrupted, corpus, tmp_path):
  """data.num_workers=1 (the pipeline in a worker process, batches prefetched onto the
  devices), killed with SIGKILL after a checkpoint and resumed: it ends with the parameters
  and per-step losses of the uninterrupted in-process run, since one worker yields the same
  batches as none."""
  one_worker = [*corpus, "data.num_workers=1"]
  final = final_step(kill_at_a_random_moment_after_the_first_checkpoint(tmp_path, one_worker))
  run_to(tmp_path, final, one_worker)
  assert_resumed_as_uninterrupted(tmp_path, final, uninterrupted(final))


def test_a_stop_off_the_checkpoint_grid_leaves_what_an_uninterrupted_run_keeps(
  tmp_path_factory, tmp_path, monkeypatch, capsys
):
  """Two copies of the session's 10-step run (trained_runs.py: checkpoints 5 and 10) go on to
  step 20 (checkpoints every 5, the last 3 kept and averaged). A signal at step 12 saves step
  12 to resume from. Resumed, the stopped copy ends with the checkpoints of the copy never
  stopped, 10, 15 and 20, and averages those: 12 would otherwise push out 10 and be averaged
  in its place."""
  flags = [*TINY, "train.num_steps=20", "train.checkpoint_every=5"]
  flags += ["train.keep_checkpoints=3", "evaluate.average_last=3"]
  ten_steps = trained_runs.ten_steps(tmp_path_factory)
  reference, stopped = (
    str(trained_runs.copy_of(ten_steps, tmp_path / name)) for name in ("reference", "stopped")
  )
  assert cli.main(["train", "--workdir", reference, *flags]) == 0
  with monkeypatch.context() as patch:
    patch.setattr(preemption.StopOnSignal, "stop_after", lambda self, step, log: step == 12)
    assert cli.main(["train", "--workdir", stopped, *flags]) == 0
  assert checkpointing.all_steps(stopped) == [5, 10, 12]
  capsys.readouterr()
  assert cli.main(["train", "--workdir", stopped, *flags]) == 0
  assert checkpointing.all_steps(stopped) == checkpointing.all_steps(reference) == [10, 15, 20]
  assert "the mean of the last 3 checkpoints, steps [10, 15, 20]" in capsys.readouterr().out
  assert_same_params(final_params(stopped, 20), final_params(reference, 20))


def test_model_config_that_does_not_fit_the_checkpoint(tmp_path_factory, tmp_path, capsys):
  """A copy of the session's 10-step run (trained_runs.py), resumed with another d_ff."""
  workdir = str(trained_runs.copy_of(trained_runs.ten_steps(tmp_path_factory), tmp_path / "run"))
  before = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
  assert (
    cli.main(["train", "--workdir", workdir, *TINY, "model.d_ff=48", "train.num_steps=15"]) == 2
  )
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: The model config does not match the checkpoint of step 10")
  assert "['wi']['kernel']: checkpoint (32, 64) vs model (32, 48)" in err
  assert len(err.splitlines()) == 1
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == before


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
  for path in (ROOT / "transformer_mt").rglob("*.py"):
    source = path.read_text(encoding="utf-8")
    for forbidden in ("import pickle", "pickle.load", "eval(", "exec(", "yaml.load("):
      hits = [
        line
        for line in source.splitlines()
        if forbidden in line and "literal_eval" not in line and not line.strip().startswith("#")
      ]
      assert not hits, f"{path.name}: {hits}"


def test_debug_flag_shows_the_traceback(tmp_path):
  with pytest.raises(ValueError, match="Unknown experiment"):
    cli.main(["--debug", "train", "--experiment", "nope", "--workdir", str(tmp_path / "w")])

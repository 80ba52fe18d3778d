"""One writer per workdir (transformer_mt/workdir/lock.py): a second writer is refused with one
line naming the holder, a dead holder's lock is taken over, another host's needs --force_unlock,
and readers never need the lock. A SIGKILLed training run's lock, taken over by the run resumed
in its workdir, is checked on test_fault_tolerance.py's killed run (its process serves both)."""

import datetime
import json
import logging
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest
import trained_runs
from helpers import ROOT, child_xla_flags, run_py

from transformer_mt import cli
from transformer_mt.workdir import lock as workdir_lock
from transformer_mt.workdir import metrics_log as metrics

STEPS = 40
# A run that must still be running when the test acts on it is endless: it can only end by
# the signal the test sends it, whatever the machine's speed.
ENDLESS = 1_000_000
# trained_runs.TINY (test_fault_tolerance.py's run processes: the same compiled programs, which
# the compilation cache shares) with every checkpoint kept.
TINY = trained_runs.TINY + ["train.checkpoint_every=5", "train.keep_checkpoints=100"]
# A process (not this one: its pid would nest) that holds the lock of argv[1] until killed.
HOLDER = (
  "import sys, time\n"
  "from transformer_mt.workdir import lock as workdir_lock\n"
  "with workdir_lock.held(sys.argv[1]):\n"
  "  print('held', flush=True)\n"
  "  time.sleep(600)\n"
)


def subprocess_env():
  return dict(
    os.environ,
    PYTHONUNBUFFERED="1",
    PYTHONPATH=str(ROOT),
    XLA_FLAGS=child_xla_flags(1),
  )


def start_holder(workdir):
  process = subprocess.Popen(
    [sys.executable, "-c", HOLDER, str(workdir)],
    env=subprocess_env(),
    stdout=subprocess.PIPE,
    text=True,
  )
  assert process.stdout.readline() == "held\n"
  return process


def write_lock(workdir, **fields):
  os.makedirs(workdir, exist_ok=True)
  record = {
    "host": "node-17",
    "pid": 4242,
    "started": "2026-01-01T00:00:00+00:00",
    "command": "python run.py train --workdir x",
    **fields,
  }
  data = json.dumps(record).encode()
  pathlib.Path(workdir, workdir_lock.LOCK_FILENAME).write_bytes(data)
  return data


def enter(workdir, force_unlock=False):
  """Takes and releases the lock (raises WorkdirBusy when refused)."""
  with workdir_lock.held(str(workdir), force_unlock):
    pass


def lock_file(workdir):
  return pathlib.Path(workdir, workdir_lock.LOCK_FILENAME)


def test_the_lock_records_this_process_and_is_removed_with_the_directory_it_made(tmp_path):
  workdir = tmp_path / "new"
  before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
  with workdir_lock.held(str(workdir)):
    holder = workdir_lock.read_holder(str(workdir))
    assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
    started = datetime.datetime.fromisoformat(holder["started"])
    assert started.tzinfo is not None
    # Between two clock readings around the hold, not within a delay that depends on the load.
    assert before <= started <= datetime.datetime.now(datetime.timezone.utc)
    assert shlex.split(holder["command"])[1:] == sys.argv
    # Nothing but the lock: its temporary file is gone.
    assert sorted(os.listdir(workdir)) == [workdir_lock.LOCK_FILENAME]
    # A nested hold (reproduce -> train) shares the lock and leaves it in place.
    with workdir_lock.held(str(workdir)):
      pass
    assert lock_file(workdir).exists()
  assert not workdir.exists()  # made by the lock and still empty: removed
  assert workdir_lock.read_holder(str(workdir)) is None


def test_an_error_releases_the_lock_and_keeps_what_was_written(tmp_path):
  with pytest.raises(RuntimeError, match="boom"), workdir_lock.held(str(tmp_path)):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    raise RuntimeError("boom")
  assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]


def test_a_live_holder_on_this_host_is_refused_and_a_killed_one_is_taken_over(tmp_path, caplog):
  holder = start_holder(tmp_path)
  try:
    recorded = lock_file(tmp_path).read_bytes()
    for force in (False, True):  # --force_unlock never takes a live local run's lock
      with pytest.raises(workdir_lock.WorkdirBusy) as refused:
        enter(tmp_path, force)
      message = str(refused.value)
      assert f"pid {holder.pid} on host {socket.gethostname()}" in message
      assert "-c" in message and "\n" not in message
      assert lock_file(tmp_path).read_bytes() == recorded  # untouched
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  assert lock_file(tmp_path).read_bytes() == recorded  # SIGKILL left it behind
  with caplog.at_level(logging.WARNING), workdir_lock.held(str(tmp_path)):
    assert workdir_lock.read_holder(str(tmp_path))["pid"] == os.getpid()
  assert f"pid {holder.pid} on host" in caplog.text and "no longer running" in caplog.text
  assert not lock_file(tmp_path).exists()


def test_sigterm_outside_the_training_loop_releases_the_lock(tmp_path):
  holder = start_holder(tmp_path)
  holder.send_signal(signal.SIGTERM)
  assert holder.wait(timeout=60) == -signal.SIGTERM  # still the default SIGTERM exit
  assert not lock_file(tmp_path).exists()


# Holds the lock of argv[1] in a one-process jax.distributed run, whose preemption notifier
# catches SIGTERM in C from `initialize` on; then, in a training loop's stop-on-signal, sends
# itself signal argv[2] and steps until the loop would stop (JAX's sync point is reached).
UNDER_JAX_NOTIFIER = (
  "import os, signal, socket, sys, time\n"
  "import jax\n"
  "from transformer_mt.training import preemption\n"
  "from transformer_mt.workdir import lock as workdir_lock\n"
  "with socket.socket() as s:\n"
  "  s.bind(('127.0.0.1', 0))\n"
  "  port = s.getsockname()[1]\n"
  "jax.distributed.initialize(f'127.0.0.1:{port}', 1, 0)\n"
  "with workdir_lock.held(sys.argv[1]):\n"
  "  print('python handler:', signal.getsignal(signal.SIGTERM), flush=True)\n"
  "  with preemption.StopOnSignal() as stop:\n"
  "    os.kill(os.getpid(), signal.Signals[sys.argv[2]])\n"
  "    step = 1\n"
  "    while not stop.stop_after(step, log_step=False):\n"
  "      step += 1\n"
  "      time.sleep(0.001)\n"
  "  print('stopped by', stop.describe(), flush=True)\n"
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_lock_leaves_sigterm_to_jaxs_preemption_notifier(signum, tmp_path):
  """Where `jax.distributed.initialize` started JAX's preemption notifier (a C handler, which
  `signal.getsignal` reports as SIG_DFL), the lock puts no SIGTERM handler over it: the
  process survives SIGTERM (or SIGINT, which the loop re-raises as SIGTERM for JAX), JAX
  reaches its sync point, and the normal exit releases the lock. (Replacing it killed
  process 0 of a multi-process run, the lock's holder.)"""
  workdir = tmp_path / "run"
  done = subprocess.run(
    [sys.executable, "-c", UNDER_JAX_NOTIFIER, str(workdir), signum.name],
    env=dict(subprocess_env(), JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.splitlines() == [
    f"python handler: {signal.SIG_DFL!s}",
    "stopped by a preemption notice (SIGTERM or SIGINT to one of the processes)",
  ]
  assert not workdir.exists()  # the lock was released and its empty workdir removed


@pytest.mark.parametrize("failure", ["raises", "returns -1"])
def test_when_sigaction_cannot_be_asked_sigterm_is_left_alone(failure, monkeypatch):
  """A handler set in C is invisible to Python: if the OS cannot be asked, the lock must not
  put its own handler over what may be there (issue 34)."""

  class Libc:
    def sigaction(self, signum, new, old):
      if failure == "raises":
        raise OSError("no libc")
      return -1

  monkeypatch.setattr(workdir_lock.ctypes, "CDLL", lambda name: Libc())
  assert workdir_lock._os_default(signal.SIGTERM) is False
  previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what Python sees: the default
  try:
    workdir_lock._release_on_sigterm(install=True)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
  finally:
    workdir_lock._release_on_sigterm(install=False)
    signal.signal(signal.SIGTERM, previous)


def test_a_recycled_pid_is_not_the_holder(tmp_path, caplog):
  """The recorded pid runs (it is this process), but a lock with another start time was
  taken by a process that has died since, and whose pid was reused."""
  start, _ = workdir_lock._process_start(os.getpid())
  if start is None:
    pytest.skip("no /proc/PID/stat here")
  here = {"host": socket.gethostname(), "pid_namespace": workdir_lock._pid_namespace()}
  # Another pid with this process's start time: this host's check, not the record, decides.
  other = start_holder(tmp_path / "other")
  try:
    recorded = write_lock(
      tmp_path, pid=other.pid, process_start=workdir_lock._process_start(other.pid)[0], **here
    )
    with pytest.raises(workdir_lock.WorkdirBusy, match=f"pid {other.pid} on host"):
      enter(tmp_path)
    assert lock_file(tmp_path).read_bytes() == recorded
  finally:
    other.kill()
    other.wait()
  write_lock(tmp_path, pid=os.getpid(), process_start=start + 1, **here)
  with caplog.at_level(logging.WARNING), workdir_lock.held(str(tmp_path)):
    pass
  assert f"pid {os.getpid()} on host" in caplog.text and "no longer running" in caplog.text


def test_another_hosts_lock_is_refused_with_its_age_until_forced(tmp_path, caplog):
  started = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=2, minutes=5)
  recorded = write_lock(tmp_path, started=started.isoformat(timespec="seconds"))
  with pytest.raises(workdir_lock.WorkdirBusy) as refused, workdir_lock.held(str(tmp_path)):
    pytest.fail("entered a workdir locked by another host")
  message = str(refused.value)
  assert "pid 4242 on host node-17" in message and "2 h 5 min ago" in message
  assert "another host" in message and "--force_unlock" in message
  assert lock_file(tmp_path).read_bytes() == recorded
  with caplog.at_level(logging.WARNING), workdir_lock.held(str(tmp_path), force_unlock=True):
    assert workdir_lock.read_holder(str(tmp_path))["pid"] == os.getpid()
  assert "--force_unlock: took over" in caplog.text and "node-17" in caplog.text
  assert not lock_file(tmp_path).exists()


def test_a_lock_that_cannot_be_read_needs_force_unlock(tmp_path):
  lock_file(tmp_path).write_bytes(b"\x00garbage")
  with pytest.raises(workdir_lock.WorkdirBusy, match="--force_unlock"):
    enter(tmp_path)
  enter(tmp_path, force_unlock=True)
  assert not lock_file(tmp_path).exists()


def test_a_lock_taken_over_meanwhile_is_left_to_its_new_holder(tmp_path, caplog):
  with caplog.at_level(logging.WARNING), workdir_lock.held(str(tmp_path)):
    taken = write_lock(tmp_path)  # as --force_unlock from node-17 would
  assert lock_file(tmp_path).read_bytes() == taken
  assert "taken over by pid 4242 on host node-17" in caplog.text


@pytest.mark.parametrize(
  "argv",
  [
    ["train", "--experiment", "demo"],
    ["reproduce", "--experiment", "demo"],
  ],
  ids=["train", "reproduce"],
)
def test_writers_refuse_another_hosts_lock_in_one_line_and_force_unlock_is_a_flag(
  tmp_path, capsys, argv
):
  recorded = write_lock(tmp_path)
  assert cli.main(argv + ["--workdir", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ")
  assert "pid 4242 on host node-17" in err[0] and "python run.py train --workdir x" in err[0]
  assert os.listdir(tmp_path) == [workdir_lock.LOCK_FILENAME]
  assert lock_file(tmp_path).read_bytes() == recorded
  args = cli.build_parser().parse_args(argv + ["--workdir", "w", "--force_unlock"])
  assert args.force_unlock


def train_command(workdir, steps=STEPS):
  return run_py(
    "train", "--experiment", "demo", "--workdir", str(workdir), *TINY, f"train.num_steps={steps}"
  )


def wait_for(condition, process, what, timeout=300):
  deadline = time.time() + timeout
  while not condition():
    assert process.poll() is None, f"training exited before {what}"
    assert time.time() < deadline, f"no {what} in time"
    time.sleep(0.05)


def logged_steps(workdir):
  return [r["step"] for r in metrics.read_metrics(str(workdir)) if "loss" in r]


@pytest.mark.slow
def test_a_second_training_is_refused_and_the_first_writes_what_a_lone_run_does(tmp_path):
  """The first run is endless, so it still holds the lock when the second one starts; stopped
  by SIGTERM once it is training, it has written what a lone run stopped there writes."""
  workdir = tmp_path / "run"
  with open(tmp_path / "first.log", "w") as log:
    first = subprocess.Popen(
      train_command(workdir, ENDLESS),
      cwd=ROOT,
      env=subprocess_env(),
      stdout=log,
      stderr=subprocess.STDOUT,
    )
  try:
    wait_for(lambda: lock_file(workdir).exists(), first, "a writer lock")
    second = subprocess.run(
      train_command(workdir), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
    )
    # In the training loop (its SIGTERM handler set) once it has saved a step.
    done = workdir / "checkpoints" / "5" / "commit_success.txt"
    wait_for(done.exists, first, "a first checkpoint")
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=600)
  finally:
    if first.poll() is None:
      first.kill()
  output = (tmp_path / "first.log").read_text()
  assert second.returncode == 2, second.stderr
  errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1, second.stderr
  assert f"pid {first.pid} on host {socket.gethostname()}" in errors[0]
  assert "is being written by another run" in errors[0] and "run.py train" in errors[0]
  assert second.stdout == ""
  assert first.returncode == 0, output[-3000:]
  assert "Stopped by SIGTERM after step " in output, output[-3000:]
  stopped = int(output.split("Stopped by SIGTERM after step ")[1].split(";")[0])
  assert f"Done: step {stopped}," in output
  # What a lone run writes: every step's loss once, every 5th step's checkpoint and the stop
  # step's, no lock left.
  assert logged_steps(workdir) == list(range(1, stopped + 1))
  checkpoints = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir())
  assert checkpoints == sorted({*range(5, stopped + 1, 5), stopped})
  assert not lock_file(workdir).exists()
  # Readers need no lock and leave it alone: they work while a live writer holds it.
  holder = start_holder(workdir)
  try:
    recorded = lock_file(workdir).read_bytes()
    (tmp_path / "source.txt").write_text("hello world\n")
    translate = ["translate", "--workdir", str(workdir), "--input", str(tmp_path / "source.txt")]
    assert cli.main(translate + ["--output", str(tmp_path / "out.txt")]) == 0
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 1
    assert cli.main(["plot", str(workdir), "--output", str(tmp_path / "curves.png")]) == 0
    assert lock_file(workdir).read_bytes() == recorded
  finally:
    holder.kill()
    holder.wait()


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_stop_together_when_process_0_is_refused(tmp_path):
  """Process 0 holds the lock for a multi-process job; when it is refused, process 1 does not
  wait for it forever but stops too, pointing to process 0's error."""
  recorded = write_lock(tmp_path)
  env = dict(subprocess_env(), JAX_PLATFORMS="cpu")
  address = f"127.0.0.1:{free_port()}"
  processes = [
    subprocess.Popen(
      train_command(tmp_path)
      + ["--coordinator_address", address, "--num_processes", "2", "--process_id", str(i)],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  try:
    outputs = [process.communicate(timeout=300) for process in processes]
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
  errors = [[line for line in err.splitlines() if line.startswith("error: ")] for _, err in outputs]
  assert [process.returncode for process in processes] == [2, 2], outputs
  assert len(errors[0]) == 1 and "pid 4242 on host node-17" in errors[0][0]
  assert len(errors[1]) == 1 and "Process 0 could not take the writer lock" in errors[1][0]
  assert os.listdir(tmp_path) == [workdir_lock.LOCK_FILENAME]
  assert lock_file(tmp_path).read_bytes() == recorded

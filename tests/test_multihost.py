"""Two CPU processes on 127.0.0.1 (JAX's gloo collectives) train like one process.

`run.py train` is launched twice with --coordinator_address/--num_processes/--process_id.
Each process has 2 CPU devices (4 in the mesh) and reads its own half of the data. The
reference is one process on one device fed the same global batches: process 0's rows
followed by process 1's, built by the same input pipeline.
"""

import os
import re
import signal
import socket
import subprocess
import time

import jax
import numpy as np
import pytest
from helpers import (
  ROOT,
  assert_same_params_after_real_movement,
  child_xla_flags,
  experiment_file,
  run_py,
  tiny_overrides,
)

from transformer_mt.config import registry
from transformer_mt.data import input_pipeline
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.model.setup import model_config_for, model_setup
from transformer_mt.model.transformer import Transformer
from transformer_mt.runtime import sharding
from transformer_mt.training import optimizer, train, train_step
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import metrics_log as metrics

STEPS = 3
# Plain SGD at a learning rate that moves the parameters (lr 5.6e-3 to 1.7e-2 over the 3 steps),
# no clipping: a wrong gradient scale shows in the parameters (see tests/test_training.py).
OVERRIDES = tiny_overrides(
  "model.dropout_rate=0.1",
  "data.num_validation=8",
  "train.batch_tokens=512",
  "train.log_every=1",
  "train.optimizer=sgd",
  "train.lr_scale=1.0",
  "train.warmup_steps=10",
  "train.grad_clip_norm=0.0",
  f"train.num_steps={STEPS}",
  "train.eval_every=3",
  "train.bleu_every=3",
  "decode.beam_size=2",
)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_two_processes(
  workdir, log_dir, overrides=OVERRIDES, command=("train", "--experiment", "demo")
):
  """Starts both processes of `run.py COMMAND`; returns them and their log files (files, not
  pipes: a full pipe buffer would block one process and so both, at their next collective)."""
  env = dict(
    os.environ,
    PYTHONUNBUFFERED="1",
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=child_xla_flags(2),
  )
  address = f"127.0.0.1:{free_port()}"
  logs = [log_dir / f"process_{i}.log" for i in range(2)]
  processes = []
  for i, log in enumerate(logs):
    with open(log, "w") as f:
      processes.append(
        subprocess.Popen(
          run_py(
            *command,
            "--workdir",
            str(workdir),
            "--coordinator_address",
            address,
            "--num_processes",
            "2",
            "--process_id",
            str(i),
            *overrides,
          ),
          cwd=ROOT,
          env=env,
          stdout=f,
          stderr=subprocess.STDOUT,
        )
      )
  return processes, logs


def finish_two_processes(processes, logs, timeout=300):
  """Waits for both processes; returns their outputs, having checked that both exited 0."""
  try:
    for process in processes:
      process.wait(timeout=timeout)
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
  outputs = [log.read_text() for log in logs]
  for i, (process, output) in enumerate(zip(processes, outputs)):
    assert process.returncode == 0, f"process {i} failed:\n{output[-3000:]}"
  return outputs


def launch_two_processes(workdir, log_dir, overrides=OVERRIDES):
  """Runs both processes to completion; returns their outputs."""
  return finish_two_processes(*start_two_processes(workdir, log_dir, overrides))


def reference_run(workdir, device):
  """One process, one device, the same global batches: returns (initial params, params, losses)."""
  config = registry.load_experiment("demo", OVERRIDES)
  tokenizer = Tokenizer.load(os.path.join(workdir, "tokenizer.model"))
  from transformer_mt.data import sources as data_sources

  pairs = data_sources.load_pairs(config.data)["train"]
  model_config = model_config_for(config, tokenizer)
  model = Transformer(model_config)
  tx, schedule = optimizer.make_optimizer(config.train, model_config.d_model)
  mesh = sharding.make_mesh(config.mesh, [device])
  rows = input_pipeline.rows_per_batch(
    config.train.batch_tokens, config.data.max_len, 1, 2, batch_shards=4
  )
  shards = [
    input_pipeline.training_batches(
      pairs,
      tokenizer,
      rows,
      1,
      config.data.max_len,
      seed=config.train.seed,
      process_index=i,
      process_count=2,
    )[0]
    for i in range(2)
  ]
  state = train_step.create_sharded_state(config.train.seed, model, tx, mesh)
  initial_params = jax.device_get(state.params)
  step_fn = train_step.jit_train_step(
    model,
    tx,
    schedule,
    config.train.label_smoothing,
    mesh,
    train_step.state_shardings(model, tx, mesh),
  )
  losses = []
  for _ in range(STEPS):
    local = [next(shard) for shard in shards]
    batch = {k: np.concatenate([part[k] for part in local], axis=1) for k in local[0]}
    state, step_metrics = step_fn(state, sharding.global_batch_from_local(batch, mesh, 1))
    losses.append(float(step_metrics["loss"]))
  return initial_params, jax.device_get(state.params), losses


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path, cpu_devices):
  workdir = tmp_path / "run"
  outputs = launch_two_processes(workdir, tmp_path)
  assert "Process 0 of 2: 2 local devices, 4 in all." in outputs[0]
  # Only process 0 reports.
  assert "Done: step 3" in outputs[0] and "Done: step 3" not in outputs[1]
  assert "Held-out BLEU" in outputs[0] and "Held-out BLEU" not in outputs[1]

  config, tokenizer, step = checkpointing.read_config(str(workdir))
  assert step == STEPS
  mesh = sharding.make_mesh(config.mesh, cpu_devices[:1])
  target = model_setup(config, tokenizer, mesh).abstract_params
  params = jax.device_get(checkpointing.restore_params(str(workdir), STEPS, target))
  # The data iterator was saved per process.
  data_iter = {p.name for p in (workdir / "checkpoints" / str(STEPS) / "data_iter").iterdir()}
  assert {"process_0-of-2.json", "process_1-of-2.json"} <= data_iter, data_iter

  # The reference on a CPU device too: the processes ran on CPUs (JAX_PLATFORMS=cpu).
  initial_params, expected_params, expected_losses = reference_run(str(workdir), cpu_devices[0])
  logged = {r["step"]: r["loss"] for r in metrics.read_metrics(str(workdir)) if "loss" in r}
  np.testing.assert_allclose([logged[s] for s in range(1, STEPS + 1)], expected_losses, rtol=1e-5)
  assert_same_params_after_real_movement(params, expected_params, initial_params)
  # Validation loss and BLEU ran across both processes and were logged once.
  records = metrics.read_metrics(str(workdir))
  assert sum("validation/loss" in r for r in records) == 1
  assert sum("validation/bleu" in r for r in records) == 1

  # One process can take over the finished run (e.g. `run.py reproduce` to average and
  # evaluate), but not continue it: the data order depends on the process count.
  config = registry.load_experiment("demo", OVERRIDES)
  assert train.train(config, str(workdir), progress=False)["step"] == STEPS
  with pytest.raises(ValueError, match="written by 2 processes, and this run has 1"):
    train.train(
      registry.load_experiment("demo", OVERRIDES + ["train.num_steps=5"]),
      str(workdir),
      progress=False,
    )


def test_launch_detection_and_flag_errors(monkeypatch):
  from transformer_mt.runtime import distributed

  for name in ("SLURM_JOB_ID", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    monkeypatch.delenv(name, raising=False)
  assert not distributed.launched_as_several_processes()
  monkeypatch.setenv("SLURM_JOB_ID", "42")
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert not distributed.launched_as_several_processes()  # a one-task job is a plain run
  monkeypatch.setenv("SLURM_NTASKS", "8")
  assert distributed.launched_as_several_processes()
  monkeypatch.delenv("SLURM_JOB_ID")
  monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
  assert distributed.launched_as_several_processes()

  with pytest.raises(ValueError, match="needs all of --coordinator_address"):
    distributed.initialize("127.0.0.1:1234", num_processes=2)
  with pytest.raises(ValueError, match="--process_id 2 must be in 0..1"):
    distributed.initialize("127.0.0.1:1234", 2, 2)
  with pytest.raises(ValueError, match="must be HOST:PORT"):
    distributed.initialize("127.0.0.1", 2, 0)


# A run that only a signal stops: no log step (the old agreement point) and no evaluation.
STOP_OVERRIDES = OVERRIDES + [
  "train.eval_every=0",
  "train.bleu_every=0",
  "train.checkpoint_every=5",
  "train.log_every=100000",
  "data.num_eval=0",
]
# Where interrupted runs are resumed to, and the shared uninterrupted one ends: past the step a
# signal sent after step 5's checkpoint stops at (the furthest step any process reached, plus one;
# 11 to 16 on a loaded 2-core machine; a stop at or past it gets a reference of its own). Neither
# the learning rate nor the data order depends on train.num_steps.
FINAL_STEP = 40


def saved_params(workdir, step):
  config, tokenizer, _ = checkpointing.read_config(str(workdir))
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  target = model_setup(config, tokenizer, mesh).abstract_params
  return jax.device_get(checkpointing.restore_params(str(workdir), step, target))


def logged_losses(workdir):
  return {r["step"]: r["loss"] for r in metrics.read_metrics(str(workdir)) if "loss" in r}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """reference(final_step) -> (params, losses) of an uninterrupted two-process run to
  final_step: one run to FINAL_STEP shared by the tests that interrupt one, or, for a stop at or
  past it (a much faster machine), a fresh run to exactly that step; never a failure that depends
  on the machine's speed."""
  runs = {}

  def reference(final_step):
    if final_step not in runs:
      base = tmp_path_factory.mktemp(f"uninterrupted_{final_step}")
      workdir = base / "run"
      launch_two_processes(workdir, base, STOP_OVERRIDES + [f"train.num_steps={final_step}"])
      runs[final_step] = saved_params(workdir, final_step), logged_losses(workdir)
    return runs[final_step]

  return reference


@pytest.mark.slow
@pytest.mark.parametrize(
  "targets", [(0,), (1,), (0, 1)], ids=["process_0", "process_1", "all_processes"]
)
def test_sigterm_stops_both_processes_at_the_same_step(targets, uninterrupted, tmp_path):
  """SIGTERM to process 0 only (the one holding the writer lock), to process 1 only, or to
  both (as SLURM preempts), between log steps: both processes stop at the same step (JAX's
  preemption sync point, asked at every step), save that step's checkpoint, release the lock
  and exit 0. Resumed (the SLURM case: the checkpoint is the same whichever process was
  signalled, and each resume is two more processes to start), the run ends with the
  parameters and losses of an uninterrupted two-process run, bit for bit."""
  workdir = tmp_path / "run"
  # Endless: it can only end by the signal, whatever the machine's speed.
  processes, logs = start_two_processes(
    workdir, tmp_path, STOP_OVERRIDES + ["train.num_steps=1000000"]
  )
  first_checkpoint = workdir / "checkpoints" / "5" / "commit_success.txt"
  deadline = time.time() + 300
  while not first_checkpoint.exists():
    assert all(p.poll() is None for p in processes), "a process exited before step 5"
    assert time.time() < deadline, "no checkpoint of step 5 appeared in time"
    time.sleep(0.02)
  for i in targets:
    processes[i].send_signal(signal.SIGTERM)
  outputs = finish_two_processes(processes, logs)  # both exit 0
  stopped = [re.findall(r"Stopped by a preemption notice .* after step (\d+);", o) for o in outputs]
  assert stopped[0] and stopped[0] == stopped[1], stopped
  stop_step = int(stopped[0][0])
  assert checkpointing.all_steps(str(workdir))[-1] == stop_step
  data_iter = {p.name for p in (workdir / "checkpoints" / str(stop_step) / "data_iter").iterdir()}
  assert {"process_0-of-2.json", "process_1-of-2.json"} <= data_iter, data_iter
  assert not (workdir / "writer.lock").exists()
  if targets != (0, 1):
    return

  (tmp_path / "resumed").mkdir()
  final_step = FINAL_STEP if stop_step < FINAL_STEP else stop_step + 5
  finish = STOP_OVERRIDES + [f"train.num_steps={final_step}"]
  launch_two_processes(workdir, tmp_path / "resumed", finish)
  expected_params, expected_losses = uninterrupted(final_step)
  jax.tree.map(np.testing.assert_array_equal, saved_params(workdir, final_step), expected_params)
  assert logged_losses(workdir) == expected_losses
  assert sorted(expected_losses) == list(range(1, final_step + 1))


@pytest.mark.slow
def test_a_sweep_worker_of_two_processes_prunes_on_both_at_one_step(tmp_path):
  """One sweep worker across two processes: process 0 claims each trial and talks to the
  study, and its pruner's decision reaches process 1, so both stop the diverging trial at
  its first validation (else process 1 would wait at step 11's collectives for ever) and
  go on to the end of the budget together."""
  from optuna.trial import TrialState

  from transformer_mt.evaluation import sweep_report

  experiment = experiment_file(
    tmp_path,
    'Sweep(grid={"train.lr_scale": [0.5, 500.0]}, pruner="median", metric="loss", '
    'pruner_settings={"n_startup_trials": 1, "n_warmup_steps": 0})',
  )
  overrides = tiny_overrides(
    "data.num_validation=8",
    "train.num_steps=20",
    "train.warmup_steps=10",
    "train.checkpoint_every=10",
    "train.eval_every=10",
  )
  root = tmp_path / "root"
  processes, logs = start_two_processes(
    root,
    tmp_path,
    [*overrides, "train.nonfinite='skip'"],
    command=("sweep", "--experiment", experiment),
  )
  outputs = finish_two_processes(processes, logs, timeout=240)
  study, _ = sweep_report.load(str(root))
  assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED]
  assert list(study.trials[1].intermediate_values) == [10]
  assert checkpointing.all_steps(str(root / "trial_001")) == [10]
  assert "1 complete, 1 pruned" in outputs[0] and "| trial_" not in outputs[1]

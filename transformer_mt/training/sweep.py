"""Hyperparameter sweeps on an Optuna study: every worker asks the study for a trial, trains it
into ROOT/trial_<number>, reports its validation score at each validation (the pruner may stop
it there), and tells the study how it ended, until the trial budget is spent.

An experiment opts in with a `get_sweep()` returning a `Sweep` (config/search_space.py): the
space, the sampler (grid and random: the fixed trial lists of before; TPE, QMC: Optuna's), the
pruner, the budget and the metric. The study lives in a journal file in ROOT, or in the
database `--storage` names (workdir/study_storage.py), and ROOT/sweep.json records which.

Workers: `run.py sweep` is one; `--parallel K` starts K, each on 1/K of this host's devices;
on SLURM each array task is one (launch/slurm_sweep.sbatch). The storage numbers the trials,
so two workers never take the same one, and each trial's workdir lock (workdir/lock.py) is
held from its first step to the moment the study hears how it ended.

Faults: a worker stopped by SIGTERM checkpoints its trial and leaves it "running" in the study;
so does one killed with SIGKILL, without the checkpoint of its last steps. A worker looking for
work first takes over any running trial whose workdir lock is free (its holder is gone), and
trains it on from its checkpoint with the same parameters, its reported values kept. A trial
that fails with an error is recorded as failed with its error line, and the worker goes on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

import jax
import optuna
from optuna.trial import TrialState

from transformer_mt.config import registry
from transformer_mt.config.search_space import Sweep
from transformer_mt.data import text_files
from transformer_mt.evaluation.reports import RANKING_METRICS, TRIAL_FILENAME
from transformer_mt.runtime import distributed, errors
from transformer_mt.training import sweep_study
from transformer_mt.workdir import lock as workdir_lock
from transformer_mt.workdir import metrics_log as metrics
from transformer_mt.workdir import study_storage

# Sweep.metric -> the validation score the loop logs and the pruner hears.
METRIC_KEYS = {"bleu": "validation/bleu", "chrf": "validation/chrf", "loss": "validation/loss"}


def trial_overrides(trial: dict[str, Any]) -> list[str]:
  """A trial's {key: value} as overrides ("key=repr(value)") the registry parses back exactly."""
  return [f"{key}={value!r}" for key, value in trial.items()]


def trial_dir(root: str, number: int) -> str:
  return os.path.join(root, f"trial_{number:03d}")


def load_sweep(name: str) -> Sweep:
  """The `get_sweep()` of experiment `name`, checked; one line if it declares none."""
  module = registry.experiment_module(name)
  if not hasattr(module, "get_sweep"):
    with_sweeps = [
      n for n in registry.experiment_names() if hasattr(registry.experiment_module(n), "get_sweep")
    ]
    raise errors.BadValue(
      f"Experiment {name!r} declares no sweep (a get_sweep() function in "
      f"experiments/{name}.py). Experiments with sweeps: {', '.join(with_sweeps)}"
    )
  sweep = module.get_sweep()
  sweep.check()
  sweep_study.sampler(sweep)  # Optuna checks the settings, before any trial runs
  sweep_study.pruner(sweep)
  return sweep


def prepare(
  name: str, root: str, overrides: Sequence[str] = (), storage: str | None = None
) -> tuple[Sweep, dict[str, Any]]:
  """(the sweep, the record of ROOT/sweep.json), checked before anything runs: no override
  sets a swept key, every key exists (each trial's config of a fixed list is built; for an
  Optuna sampler, one at each end of every range) and the metric is evaluated."""
  sweep = load_sweep(name)
  swept = set(sweep.grid) | set(sweep.random)
  for override in overrides:
    if override.partition("=")[0] in swept:
      raise errors.BadValue(
        f"{override!r} sets a key the sweep varies; change the sweep in "
        f"experiments/{name}.py instead."
      )
  if sweep.sampler_name in ("grid", "random"):
    examples = sweep.trials()
  else:
    examples = [
      {k: _end_of(d, end) for k, d in sweep_study.space(sweep).items()} for end in (0, -1)
    ]
  for values in examples:
    config = registry.load_experiment(name, list(overrides) + trial_overrides(values))
    every = config.train.eval_every if sweep.metric == "loss" else config.train.bleu_every
    if not every:
      flag = "train.eval_every" if sweep.metric == "loss" else "train.bleu_every"
      raise errors.BadValue(
        f"The sweep judges trials by validation {sweep.metric}: set {flag} > 0 (the steps "
        "between validations, where the pruner decides)."
      )
  return sweep, sweep_study.record_of(name, overrides, sweep, storage, root)


def worker_command(
  name: str, root: str, overrides: Sequence[str] = (), storage: str | None = None
) -> str:
  """The command of one worker, as `--dry-run` prints it (a URL's password hidden)."""
  shown = ["--storage", study_storage.shown(storage)] if storage else []
  return shlex.join(
    ["python", "run.py", "sweep", "--experiment", name, "--workdir", root, *shown, *overrides]
  )


def _end_of(dist, end: int):
  if isinstance(dist, optuna.distributions.CategoricalDistribution):
    return dist.choices[end]
  return (dist.low, dist.high)[end]


def run(
  name: str,
  root: str,
  overrides: Sequence[str] = (),
  parallel: int = 1,
  storage: str | None = None,
  force_unlock: bool = False,
) -> optuna.Study:
  """Works on the sweep's study until its budget is spent; returns the study.

  Args:
    name: an experiment declaring `get_sweep()`.
    root: the sweep's directory: ROOT/sweep.json records it, ROOT/trial_NNN/ are the trials'
      workdirs, ROOT/study.journal the study (unless `storage` names another).
    overrides: settings for every trial; none may set a key the sweep varies.
    parallel: workers at once, each its own process on its own group of this host's devices
      (`device_groups`); 1: this process is the one worker.
    storage: an SQLAlchemy URL or a journal path (workdir/study_storage.py); None: the journal
      file in ROOT.
    force_unlock: take over trial locks left by another host (which this host cannot check).

  Raises:
    errors.UserError: one line: a bad sweep, storage or --parallel (before any trial runs),
      or, with `parallel` > 1, workers that failed (after the others ran; rerun to retry).
  """
  sweep, record = prepare(name, root, overrides, storage)
  if parallel > 1:
    device_groups(parallel)  # a bad --parallel fails before the study is touched
  study, backend = sweep_study.open_study(root, record, sweep, storage)
  if parallel > 1:
    _run_workers(name, root, overrides, parallel, storage, force_unlock)
  else:
    work(name, root, overrides, sweep, study, backend, force_unlock)
  return study


def work(name, root, overrides, sweep: Sweep, study, backend, force_unlock: bool) -> None:
  """One worker: claims trials and trains them until the budget is spent or a signal stops
  one (that trial stays running in the study, its checkpoint saved, for the next worker).

  A worker of several processes (one trial across hosts) claims on process 0, which alone
  holds the trial's lock and talks to the study; the others learn the trial's number from it
  and train it beside it."""
  while True:
    with contextlib.ExitStack() as holding:
      trial = _claim_for_job(root, sweep, study, backend, force_unlock, holding)
      if trial is None:
        logging.info("Sweep %s: no trial left to run (budget %d).", name, sweep.budget())
        return
      finished = run_trial(name, overrides, sweep, study, trial, root)
    if not finished:
      logging.warning(
        "Sweep stopped by a signal during trial %d; rerun the same command to resume it.",
        trial.number,
      )
      return


# What process 0 tells the others instead of a trial number.
_NO_TRIAL, _CLAIM_FAILED = -1, -2


def _claim_for_job(root, sweep, study, backend, force_unlock, holding):
  """`_claim` on process 0; every process gets the same trial (the others a Trial object of
  the number process 0 broadcast, which they only read), or None on all."""
  if jax.process_count() == 1:
    return _claim(root, sweep, study, backend, force_unlock, holding)
  trial, number = None, _NO_TRIAL
  try:
    if distributed.is_primary():
      trial = _claim(root, sweep, study, backend, force_unlock, holding)
      number = _NO_TRIAL if trial is None else trial.number
  except BaseException:
    distributed.from_primary(_CLAIM_FAILED)  # the others must not wait for a number forever
    raise
  number = distributed.from_primary(number)
  if number == _CLAIM_FAILED:
    raise errors.Stopped("Process 0 could not claim a trial; its error says why.")
  if number == _NO_TRIAL or distributed.is_primary():
    return trial
  frozen = study.get_trials(deepcopy=False)[number]
  return optuna.trial.Trial(study, frozen._trial_id)


def _claim(root, sweep: Sweep, study, backend, force_unlock, holding) -> optuna.trial.Trial | None:
  """The next trial for this worker, its workdir lock entered on `holding`: a running trial
  whose worker is gone, else a new one within the budget; None when the budget is spent."""
  while True:
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
      trial = _take_over(root, sweep, study, backend, frozen, force_unlock, holding)
      if trial is not None:
        return trial
    if len(study.get_trials(deepcopy=False)) >= sweep.budget():
      return None
    trial = study.ask()
    if trial.number >= sweep.budget():  # another worker asked at the same moment
      trial.set_user_attr("over_budget", True)
      study.tell(trial, state=TrialState.FAIL)
      return None
    sweep_study.suggest(trial, sweep)
    try:
      holding.enter_context(workdir_lock.held(trial_dir(root, trial.number), force_unlock))
    except workdir_lock.WorkdirBusy:
      continue  # taken over by another worker between our ask and our lock: it runs it
    return trial


def _take_over(root, sweep, study, backend, frozen, force_unlock, holding):
  """The running trial `frozen` if its workdir lock is free (its worker is gone), locked."""
  workdir = trial_dir(root, frozen.number)
  if not os.path.isdir(workdir) or set(frozen.params) != set(sweep_study.space(sweep)):
    return None  # its worker has asked for it but not yet taken it
  lock = contextlib.ExitStack()
  try:
    lock.enter_context(workdir_lock.held(workdir, force_unlock))
  except workdir_lock.WorkdirBusy:
    return None  # its worker runs it
  if backend.get_trial(frozen._trial_id).state != TrialState.RUNNING:
    lock.close()  # it ended between the listing and the lock
    return None
  holding.enter_context(lock)
  logging.warning(
    "Trial %d was left running by a worker that is gone (its workdir lock is free): training "
    "it on from its checkpoint with the same parameters.",
    frozen.number,
  )
  return optuna.trial.Trial(study, frozen._trial_id)


def run_trial(name, overrides, sweep: Sweep, study, trial, root: str) -> bool:
  """Trains (or resumes) one trial and tells the study how it ended: complete (its last
  validation value), pruned or failed; False if a signal stopped it (it stays running)."""
  from transformer_mt.training import train

  values = {key: trial.params[key] for key in sweep_study.space(sweep)}
  workdir = trial_dir(root, trial.number)
  metric_key = METRIC_KEYS[sweep.metric]
  status = {"trial": os.path.basename(workdir), "number": trial.number, "params": values}
  status["overrides"] = trial_overrides(values)
  logging.info("Trial %d: %s", trial.number, " ".join(status["overrides"]))
  start = time.perf_counter()
  try:
    config = registry.load_experiment(name, list(overrides) + status["overrides"])
    primary = distributed.is_primary()
    reporter = sweep_study.TrialReporter(trial, metric_key) if primary else None
    result = train.train(config, workdir, prune_on=metric_key, reporter=reporter)
  except Exception as e:  # noqa: BLE001 - recorded, and the sweep goes on
    if not distributed.is_primary():
      return True  # process 0 records it
    if not isinstance(e, errors.UserError):
      logging.error("Trial %d failed:\n%s", trial.number, traceback.format_exc())
    error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    logging.error("Trial %d failed: %s", trial.number, error)
    _record(workdir, dict(status, status="failed", error=error))
    trial.set_user_attr("error", error)
    study.tell(trial, state=TrialState.FAIL)
    return True
  if result["preempted"]:
    return False
  if not primary:
    return True
  logged = metrics.read_metrics(workdir)
  losses = [r["loss"] for r in logged if "loss" in r]
  status.update(
    status="pruned" if result["pruned_at"] else "finished",
    steps=result["step"],
    pruned_at=result["pruned_at"],
    value=_value_at(logged, metric_key, result["step"]),
    **{field: _value_at(logged, key, result["step"]) for key, field, _ in RANKING_METRICS.values()},
    test_bleu=result["bleu"],
    final_loss=losses[-1] if losses else None,
    wall_seconds_this_run=time.perf_counter() - start,
  )
  _record(workdir, status)
  if result["pruned_at"]:
    study.tell(trial, state=TrialState.PRUNED)
  elif status["value"] is None:
    trial.set_user_attr("error", f"no {metric_key} was logged at the last step")
    study.tell(trial, state=TrialState.FAIL)
  else:
    study.tell(trial, status["value"])
  return True


def _value_at(logged: list[dict], key: str, step: int) -> float | None:
  """The score `key` logged at `step` (trained now or in an earlier run), or None."""
  found = [r[key] for r in logged if key in r and r["step"] == step]
  return found[-1] if found else None


def _record(workdir: str, status: dict) -> None:
  """WORKDIR/trial.json: how the trial ended, for `report` and for whoever reads the root."""
  os.makedirs(workdir, exist_ok=True)
  text_files.write_atomically(os.path.join(workdir, TRIAL_FILENAME), json.dumps(status, indent=2))


def device_groups(parallel: int) -> tuple[str, list[list[str]]]:
  """(environment variable, its value per group): K disjoint groups of this host's devices.

  Worked out from the environment, without starting a JAX backend here (a TPU can be
  opened by one process only, and a GPU backend would reserve memory the trials need):
  GPUs from CUDA_VISIBLE_DEVICES or nvidia-smi; otherwise CPU devices from XLA_FLAGS.
  """
  if distributed.on_tpu_host():
    raise errors.BadValue(
      "--parallel is not supported on TPU hosts: run one trial per job with "
      "--trial i (see --dry-run and launch/slurm_sweep.sbatch)."
    )
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is None and shutil.which("nvidia-smi"):
    listing = subprocess.run(
      ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True
    )
    visible = ",".join(listing.stdout.split()) if listing.returncode == 0 else None
  if visible:
    variable, devices = "CUDA_VISIBLE_DEVICES", visible.split(",")
  else:
    match = re.search(
      r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    variable, devices = "XLA_FLAGS", [str(i) for i in range(int(match.group(1)) if match else 1)]
  if parallel < 1 or len(devices) % parallel:
    hint = (
      ""
      if variable == "CUDA_VISIBLE_DEVICES"
      else "; on CPU, simulate devices with XLA_FLAGS=--xla_force_host_platform_device_count=N"
    )
    raise errors.BadValue(
      f"--parallel {parallel} must divide the {len(devices)} devices of this host "
      f"({variable}) into equal groups{hint}."
    )
  size = len(devices) // parallel
  groups = [devices[i * size : (i + 1) * size] for i in range(parallel)]
  return variable, groups


def _group_environment(variable: str, group: list[str]) -> dict[str, str]:
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  if variable == "CUDA_VISIBLE_DEVICES":
    env[variable] = ",".join(group)
  else:
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    env[variable] = f"{flags} --xla_force_host_platform_device_count={len(group)}".strip()
  return env


def _run_workers(name, root, overrides, parallel: int, storage, force_unlock: bool) -> None:
  """K worker processes (`run.py sweep` each, on one device group) on the same study; their
  output goes to ROOT/logs/worker_<k>.log. SIGTERM/SIGINT is passed on to them: each
  checkpoints its trial and stops."""
  variable, groups = device_groups(parallel)
  os.makedirs(os.path.join(root, "logs"), exist_ok=True)
  running, lock = set(), threading.Lock()
  stopping = threading.Event()

  def forward(signum, frame):
    stopping.set()
    with lock:
      for process in running:
        process.send_signal(signum)

  def worker(index: int) -> int:
    command = [
      sys.executable, "-m", "transformer_mt.cli", "sweep", "--experiment", name,
      "--workdir", root, *(["--storage", storage] if storage else []), *overrides,
      *(["--force_unlock"] if force_unlock else []),
    ]  # fmt: skip
    log_path = os.path.join(root, "logs", f"worker_{index}.log")
    group = groups[index]
    devices = (
      f"GPUs {','.join(group)}"
      if variable == "CUDA_VISIBLE_DEVICES"
      else (f"{len(group)} CPU device(s)")
    )
    logging.info("Worker %d on %s (log: %s)", index, devices, log_path)
    with open(log_path, "a", encoding="utf-8") as log, lock:
      if stopping.is_set():
        return 0
      process = subprocess.Popen(
        command, env=_group_environment(variable, group), stdout=log, stderr=subprocess.STDOUT
      )
      running.add(process)
    returncode = process.wait()
    with lock:
      running.discard(process)
    return returncode

  previous = {}
  if threading.current_thread() is threading.main_thread():
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
      returncodes = list(pool.map(worker, range(parallel)))
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
  failed = [
    f"worker {i} (exit {code}, see {os.path.join(root, 'logs', f'worker_{i}.log')})"
    for i, code in enumerate(returncodes)
    if code
  ]
  if stopping.is_set():
    logging.warning("Sweep stopped by a signal; rerun the same command to resume.")
  if failed:
    raise errors.BadValue("Some workers failed (the others went on): " + "; ".join(failed))

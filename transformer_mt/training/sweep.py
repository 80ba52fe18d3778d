"""Hyperparameter sweeps: an experiment declares a grid and/or random search over config keys.

An experiment file opts in with a `get_sweep()` returning a `Sweep` (config/search_space.py):

    def get_sweep():
      return Sweep(grid={"train.lr_scale": [0.5, 1.0], "train.warmup_steps": [250, 500]},
                   random={"model.dropout_rate": uniform(0.0, 0.3)}, num_random=2, seed=0)

The trials are the grid's cartesian product, each crossed with `num_random` draws of the
random keys (or only one of the two). The draws come from `seed`, so the same sweep
always expands to the same trials. `run.py sweep --experiment NAME --workdir ROOT` trains trial i
into ROOT/trial_<i>, one after another or `--parallel K` at a time on K disjoint device
groups (one `--trial i` process per group, its devices set by CUDA_VISIBLE_DEVICES or, on
CPU, XLA_FLAGS). A trial whose trial.json says
"finished" is skipped and an unfinished one resumes from its checkpoint, so rerunning an
interrupted sweep continues it. `--dry-run` prints one `--trial i` command per trial,
for a SLURM job array (launch/slurm_sweep.sbatch). Trials are ranked by the validation
BLEU of their last step (`run.py report ROOT`, evaluation/reports.py), or by its chrF
(`--metric chrf`), which training logs beside BLEU from the same hypotheses. Trials recorded
before chrF was logged have none: they are ranked after those that do, shown as "–".
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from transformer_mt.config import registry
from transformer_mt.config.search_space import Sweep
from transformer_mt.data import text_files
from transformer_mt.evaluation.reports import (
  RANKING_METRICS,
  SWEEP_FILENAME,
  TRIAL_FILENAME,
  trial_status,
)
from transformer_mt.runtime import distributed, errors
from transformer_mt.workdir import lock as workdir_lock
from transformer_mt.workdir import metrics_log as metrics


def _literal(value) -> str:
  """A value as an override the registry parses back exactly (repr of a Python literal)."""
  return repr(value)


def trial_overrides(trial: dict[str, Any]) -> list[str]:
  """A trial's {key: value} as overrides ("key=repr(value)") the registry parses back exactly."""
  return [f"{key}={_literal(value)}" for key, value in trial.items()]


def load_sweep(name: str) -> Sweep:
  """The `get_sweep()` of experiment `name`; a ValueError (one line) if it declares none."""
  module = registry.experiment_module(name)
  if not hasattr(module, "get_sweep"):
    with_sweeps = [
      n for n in registry.experiment_names() if hasattr(registry.experiment_module(n), "get_sweep")
    ]
    raise errors.BadValue(
      f"Experiment {name!r} declares no sweep (a get_sweep() function in "
      f"experiments/{name}.py). Experiments with sweeps: {', '.join(with_sweeps)}"
    )
  return module.get_sweep()


def plan(
  name: str, root: str, overrides: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """([{"name", "workdir", "overrides"}] per trial, the sweep record), validated.

  Every trial's config is built (so an unknown key fails before anything runs), and the
  plan must match the one recorded in ROOT/sweep.json by an earlier run of this sweep.
  """
  sweep = load_sweep(name)
  swept = set(sweep.grid) | set(sweep.random)
  for override in overrides:
    if override.partition("=")[0] in swept:
      raise errors.BadValue(
        f"{override!r} sets a key the sweep varies; change the sweep in "
        f"experiments/{name}.py instead."
      )
  trials = []
  for index, values in enumerate(sweep.trials()):
    trial_name = f"trial_{index:03d}"
    config = registry.load_experiment(name, list(overrides) + trial_overrides(values))
    if not config.train.bleu_every:
      raise errors.BadValue(
        "Sweeps rank trials by validation BLEU or chrF: set train.bleu_every > 0."
      )
    trials.append(
      {
        "name": trial_name,
        "workdir": os.path.join(root, trial_name),
        "overrides": trial_overrides(values),
      }
    )
  record = {
    "experiment": name,
    "overrides": list(overrides),
    "trials": [{"name": t["name"], "overrides": t["overrides"]} for t in trials],
  }
  path = os.path.join(root, SWEEP_FILENAME)
  if os.path.exists(path):
    previous = text_files.read_json(path)
    if previous != record:
      raise errors.BadValue(
        f"{path} records a different sweep (experiment, overrides or trials "
        f"changed since it started): {previous}. Use a new --workdir, or rerun with "
        "the same experiment and overrides."
      )
  return trials, record


def _final_validation_score(workdir: str, step: int, name: str) -> float | None:
  """The validation score `name` (e.g. "validation/bleu") logged at the final step (trained
  now or in an earlier run); None when it was not logged."""
  final = [r[name] for r in metrics.read_metrics(workdir) if name in r and r["step"] == step]
  return final[-1] if final else None


def run_trial(
  name: str, base_overrides: Sequence[str], trial: dict[str, Any], force_unlock: bool = False
) -> dict | None:
  """Trains (or resumes) one trial and records its result; None if a signal stopped it.

  The trial's workdir lock (workdir/lock.py) is held from training to trial.json, so a
  second process running the same trial (e.g. a doubly submitted array task) is refused.

  Args:
    name: the experiment; `base_overrides` apply to every trial, then `trial["overrides"]`.
    trial: one entry of `plan`'s list: {"name", "workdir", "overrides"}.

  Returns:
    The status written to WORKDIR/trial.json: the trial, its steps, final validation BLEU
    and chrF, held-out BLEU, final loss and wall time.
  """
  config = registry.load_experiment(name, list(base_overrides) + trial["overrides"])
  with workdir_lock.held(trial["workdir"], force_unlock):
    return _train_and_record(config, trial, force_unlock)


def _train_and_record(config, trial: dict[str, Any], force_unlock: bool) -> dict | None:
  from transformer_mt.training import train

  start = time.perf_counter()
  result = train.train(config, trial["workdir"], force_unlock=force_unlock)
  if result["preempted"]:
    return None
  losses = [r["loss"] for r in metrics.read_metrics(trial["workdir"]) if "loss" in r]
  status = {
    "status": "finished",
    "trial": trial["name"],
    "overrides": trial["overrides"],
    "steps": result["step"],
    **{
      field: _final_validation_score(trial["workdir"], result["step"], logged)
      for logged, field, _ in RANKING_METRICS.values()
    },
    "test_bleu": result["bleu"],
    "final_loss": losses[-1] if losses else None,
    "wall_seconds_this_run": time.perf_counter() - start,
  }
  text_files.write_atomically(
    os.path.join(trial["workdir"], TRIAL_FILENAME), json.dumps(status, indent=2)
  )
  return status


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


def run(
  name: str,
  root: str,
  overrides: Sequence[str] = (),
  parallel: int = 1,
  only_trial: int | None = None,
  force_unlock: bool = False,
) -> list[dict[str, Any]]:
  """Runs the sweep's unfinished trials (or only trial `only_trial`); returns every status.

  A whole sweep holds the writer lock of ROOT (workdir/lock.py), so a second whole sweep
  into it is refused at once; a `--trial i` run does not (the tasks of a job array share
  the root), and each trial holds its own workdir's lock. `force_unlock` takes over locks
  left by another host, the root's and the trials'.

  Args:
    name: an experiment declaring `get_sweep()`.
    root: the sweep's directory: ROOT/sweep.json records the plan, ROOT/trial_NNN/ are the
      trials' workdirs.
    overrides: settings for every trial; none may set a key the sweep varies.
    parallel: trials run at once, each in its own process on its own group of this host's
      devices (`device_groups`).
    only_trial: run only this trial index (one task of a job array).

  Returns:
    Every trial's status (trial.json's; unfinished ones marked so), in trial order.

  Raises:
    ValueError: a bad sweep, plan or --parallel (before anything runs), or, with
      `parallel` > 1, trials that failed (after the others ran; rerun to retry).
  """
  trials, record = plan(name, root, overrides)
  with workdir_lock.held(root, force_unlock) if only_trial is None else contextlib.nullcontext():
    return _run_trials(name, root, overrides, trials, record, parallel, only_trial, force_unlock)


def _run_trials(
  name: str,
  root: str,
  overrides: Sequence[str],
  trials: list[dict[str, Any]],
  record: dict[str, Any],
  parallel: int,
  only_trial: int | None,
  force_unlock: bool,
) -> list[dict[str, Any]]:
  if only_trial is not None:
    if not 0 <= only_trial < len(trials):
      raise errors.BadValue(
        f"--trial {only_trial} is out of range: the sweep has {len(trials)} "
        f"trials (0..{len(trials) - 1})."
      )
    selected = [trials[only_trial]]
  else:
    selected = trials
  os.makedirs(root, exist_ok=True)
  if not os.path.exists(os.path.join(root, SWEEP_FILENAME)):
    text_files.write_atomically(os.path.join(root, SWEEP_FILENAME), json.dumps(record, indent=2))
  todo = []
  for trial in selected:
    if (trial_status(trial["workdir"]) or {}).get("status") == "finished":
      logging.info("Skipping %s: finished earlier.", trial["name"])
    else:
      todo.append(trial)
  logging.info("Sweep %s: %d trials, %d to run.", name, len(trials), len(todo))
  if parallel == 1:
    for trial in todo:
      logging.info("Trial %s: %s", trial["name"], " ".join(trial["overrides"]))
      if run_trial(name, overrides, trial, force_unlock) is None:
        logging.warning(
          "Sweep stopped by a signal during %s; rerun the same command to resume.", trial["name"]
        )
        break
  else:
    _run_parallel(name, root, overrides, trials, todo, parallel, force_unlock)
  return [
    trial_status(t["workdir"])
    or {"status": "unfinished", "trial": t["name"], "overrides": t["overrides"]}
    for t in trials
  ]


def _run_parallel(
  name: str,
  root: str,
  overrides: Sequence[str],
  trials: list[dict[str, Any]],
  todo: list[dict[str, Any]],
  parallel: int,
  force_unlock: bool = False,
) -> None:
  """Runs trials K at a time, each in its own `run.py sweep --trial i` process on one device
  group; output goes to ROOT/logs/<trial>.log. SIGTERM/SIGINT is passed on to the running
  trials (which checkpoint and stop) and no new trial starts."""
  variable, groups = device_groups(parallel)
  os.makedirs(os.path.join(root, "logs"), exist_ok=True)
  free, running, lock = queue.Queue(), set(), threading.Lock()
  for group in groups:
    free.put(group)
  stopping = threading.Event()

  def forward(signum, frame):
    stopping.set()
    with lock:
      for process in running:
        process.send_signal(signum)

  def run_on_free_group(trial) -> int | None:
    group = free.get()
    try:
      if stopping.is_set():
        return None
      index = trials.index(trial)
      command = [
        sys.executable,
        "-m",
        "transformer_mt.cli",
        "sweep",
        "--experiment",
        name,
        "--workdir",
        root,
        *overrides,
        "--trial",
        str(index),
        *(["--force_unlock"] if force_unlock else []),
      ]
      log_path = os.path.join(root, "logs", f"{trial['name']}.log")
      devices = (
        f"GPUs {','.join(group)}"
        if variable == "CUDA_VISIBLE_DEVICES"
        else f"{len(group)} CPU device(s)"
      )
      logging.info(
        "Trial %s on %s (log: %s): %s",
        trial["name"],
        devices,
        log_path,
        " ".join(trial["overrides"]),
      )
      with open(log_path, "a", encoding="utf-8") as log:
        process = subprocess.Popen(
          command, env=_group_environment(variable, group), stdout=log, stderr=subprocess.STDOUT
        )
        with lock:
          running.add(process)
        returncode = process.wait()
        with lock:
          running.discard(process)
      return returncode
    finally:
      free.put(group)

  previous = {}
  if threading.current_thread() is threading.main_thread():
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
      returncodes = dict(zip((t["name"] for t in todo), pool.map(run_on_free_group, todo)))
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
  failed = [
    f"{n} (exit {code}, see {os.path.join(root, 'logs', n + '.log')})"
    for n, code in returncodes.items()
    if code
  ]
  if stopping.is_set():
    logging.warning("Sweep stopped by a signal; rerun the same command to resume.")
  if failed:
    raise errors.BadValue(
      "Some trials failed (the others went on; rerun to retry): " + "; ".join(failed)
    )


def dry_run_commands(name: str, root: str, overrides: Sequence[str] = ()) -> list[str]:
  """One `run.py sweep ... --trial i` command per trial (e.g. for a SLURM job array)."""
  trials, _ = plan(name, root, overrides)
  base = ["python", "run.py", "sweep", "--experiment", name, "--workdir", root, *overrides]
  return [
    f"{shlex.join(base + ['--trial', str(i)])}  # {' '.join(t['overrides'])}"
    for i, t in enumerate(trials)
  ]

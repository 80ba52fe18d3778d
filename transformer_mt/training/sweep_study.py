"""A sweep's Optuna study: built from the experiment's `Sweep` (config/search_space.py), opened
on its storage (workdir/study_storage.py), recorded in ROOT/sweep.json, and the trial's side of
pruning (`TrialReporter`, which the training loop's `Pruning` action calls).

One study per sweep root. Its name and storage are recorded in ROOT/sweep.json with the
experiment, the overrides and the sweep itself, and also in the study (user attribute
"sweep"), so that a worker started later with a changed sweep is refused, whether it reads
the root or only the shared database.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import optuna

from transformer_mt.config.search_space import FIXED_SAMPLERS, Distribution, Sweep
from transformer_mt.data import text_files
from transformer_mt.evaluation.reports import SWEEP_FILENAME
from transformer_mt.runtime import errors
from transformer_mt.workdir import study_storage

# Optuna logs every trial at INFO; the sweep logs its own lines.
optuna.logging.set_verbosity(optuna.logging.WARNING)


def distribution(value: Distribution | list) -> optuna.distributions.BaseDistribution:
  """A grid key's values (a categorical choice) or a Distribution, as Optuna's."""
  if not isinstance(value, Distribution):
    return optuna.distributions.CategoricalDistribution(list(value))
  if value.kind == "uniform":
    return optuna.distributions.FloatDistribution(value.low, value.high)
  if value.kind == "log_uniform":
    return optuna.distributions.FloatDistribution(value.low, value.high, log=True)
  if value.kind == "int":
    return optuna.distributions.IntDistribution(int(value.low), int(value.high))
  return optuna.distributions.CategoricalDistribution(list(value.choices))


def space(sweep: Sweep) -> dict[str, optuna.distributions.BaseDistribution]:
  """key -> Optuna distribution, grid keys first, in the sweep's order."""
  keys = {**sweep.grid, **sweep.random}
  try:
    return {key: distribution(values) for key, values in keys.items()}
  except (TypeError, ValueError) as e:
    raise errors.BadValue(f"The sweep's space cannot be an Optuna one: {e}") from e


class FixedTrialsSampler(optuna.samplers.BaseSampler):
  """Trial number i takes the i-th {key: value} of a fixed list: the grid and random sweeps,
  trial for trial as before Optuna. The study's storage gives each number out once, so two
  workers never take the same entry."""

  def __init__(self, trials: list[dict[str, Any]]):
    self.trials = trials

  def infer_relative_search_space(self, study, trial):
    return {}

  def sample_relative(self, study, trial, search_space):
    return {}

  def sample_independent(self, study, trial, param_name, param_distribution):
    return self.trials[trial.number][param_name]


def tpe_startup_trials(num_trials: int) -> int:
  """TPE's random start-up trials when the sweep does not set them: a third of the budget, 2
  to 10. Optuna's default, 10, would leave a budget of 10 or fewer trials all random."""
  return min(10, max(2, num_trials // 3))


def sampler(sweep: Sweep) -> optuna.samplers.BaseSampler:
  name = sweep.sampler_name
  if name in FIXED_SAMPLERS:
    return FixedTrialsSampler(sweep.trials())
  settings = dict(sweep.sampler_settings, seed=sweep.seed)
  try:
    if name == "tpe":
      settings.setdefault("n_startup_trials", tpe_startup_trials(sweep.num_trials))
      return optuna.samplers.TPESampler(**settings)
    return optuna.samplers.QMCSampler(**settings)
  except (TypeError, ValueError) as e:
    raise errors.BadValue(
      f"The sweep's sampler {name!r} refuses its settings {sweep.sampler_settings}: {e}"
    ) from e


def pruner(sweep: Sweep) -> optuna.pruners.BasePruner:
  kinds = {
    "none": optuna.pruners.NopPruner,
    "median": optuna.pruners.MedianPruner,
    "asha": optuna.pruners.SuccessiveHalvingPruner,
    "hyperband": optuna.pruners.HyperbandPruner,
  }
  try:
    return kinds[sweep.pruner](**sweep.pruner_settings)
  except (TypeError, ValueError) as e:
    raise errors.BadValue(
      f"The sweep's pruner {sweep.pruner!r} refuses its settings {sweep.pruner_settings}: {e}"
    ) from e


def suggest(trial: optuna.trial.Trial, sweep: Sweep) -> dict[str, Any]:
  """The trial's {key: value}, asked of the study's sampler key by key (so TPE sees the space)."""
  values = {}
  for key, dist in space(sweep).items():
    if isinstance(dist, optuna.distributions.FloatDistribution):
      values[key] = trial.suggest_float(key, dist.low, dist.high, log=dist.log)
    elif isinstance(dist, optuna.distributions.IntDistribution):
      values[key] = trial.suggest_int(key, dist.low, dist.high)
    else:
      values[key] = trial.suggest_categorical(key, dist.choices)
  return values


def record_of(name: str, overrides, sweep: Sweep, storage: str | None, root: str) -> dict:
  """What ROOT/sweep.json holds: the experiment, the overrides, the sweep, the study's name
  and storage (None: the journal file in ROOT; a URL's password is never written)."""
  return {
    "experiment": name,
    "overrides": list(overrides),
    "sweep": sweep.describe(),
    "study_name": f"transformer_mt:{name}:{os.path.basename(os.path.abspath(root))}",
    "storage": study_storage.shown(storage) if storage else None,
  }


def check_record(root: str, record: dict) -> None:
  """Refuses a sweep that differs from the one ROOT/sweep.json records (one line)."""
  path = os.path.join(root, SWEEP_FILENAME)
  if not os.path.exists(path):
    return
  previous = text_files.read_json(path)
  if "study_name" not in previous:
    raise errors.BadValue(
      f"{path} records a sweep from before sweeps ran on Optuna studies; `run.py report "
      f"{root}` still ranks its trials. Start this sweep in a new --workdir."
    )
  if previous != record:
    changed = sorted(k for k in record if previous.get(k) != record[k])
    raise errors.BadValue(
      f"{path} records a different sweep ({', '.join(changed)} changed since it started). Use "
      "a new --workdir, or rerun with the same experiment, sweep, overrides and --storage."
    )


def open_study(root: str, record: dict, sweep: Sweep, storage: str | None):
  """(the study, its storage): created on first use, loaded after; the record is written to
  ROOT/sweep.json and checked against the study's own copy."""
  check_record(root, record)
  backend = study_storage.open_storage(storage, root)
  study = optuna.create_study(
    storage=backend,
    study_name=record["study_name"],
    sampler=sampler(sweep),
    pruner=pruner(sweep),
    direction=sweep.direction,
    load_if_exists=True,
  )
  # One attribute, written whole: workers starting together see it complete or not at all.
  described = json.dumps(
    {k: record[k] for k in ("experiment", "overrides", "sweep")}, sort_keys=True
  )
  recorded = study.user_attrs.get("sweep")
  if recorded is None:
    study.set_user_attr("sweep", described)
  elif recorded != described:
    raise errors.BadValue(
      f"The study {record['study_name']!r} in {study_storage.shown(storage or root)} was "
      "started by a different sweep or with other overrides. Use a new --workdir (a new "
      "study), or the same experiment, sweep and overrides."
    )
  os.makedirs(root, exist_ok=True)
  path = os.path.join(root, SWEEP_FILENAME)
  if not os.path.exists(path):
    text_files.write_atomically(path, json.dumps(record, indent=2))
  return study, backend


class TrialReporter:
  """The trial's side of pruning: each validation value is reported at its step, and Optuna's
  pruner says whether to stop. Called by process 0 only (training/actions.py `Pruning`)."""

  def __init__(self, trial: optuna.trial.Trial, metric_key: str):
    self.trial, self.metric_key = trial, metric_key

  def report(self, step: int, value: float) -> bool:
    """Reports `value` at `step`; whether the trial should stop there."""
    if step in self.trial.storage.get_trial(self.trial._trial_id).intermediate_values:
      return False  # reported before a resume: the pruner said go on then
    self.trial.report(value, step)
    prune = self.trial.should_prune()
    if prune:
      logging.info("Pruned at step %d: %s %.4g.", step, self.metric_key, value)
    return prune

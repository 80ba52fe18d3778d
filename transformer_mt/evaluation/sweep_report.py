"""`run.py report ROOT` for a sweep on an Optuna study: its trials ranked, each with its state
(complete, pruned, failed, running), the steps it trained, its value and best value of the
sweep's metric, its test BLEU and its parameters; Optuna's own plots as PNG; and the command
of the live view (optuna-dashboard).

The study is read from the storage ROOT/sweep.json records (the journal file in ROOT by
default), the same way `optuna.load_study` reads it from outside the project; trial.json in
each trial's workdir adds what the study does not hold (test BLEU, an error line).
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Any

from transformer_mt.data import text_files
from transformer_mt.evaluation.reports import SWEEP_FILENAME, trial_status
from transformer_mt.runtime import errors
from transformer_mt.workdir import study_storage

LABELS = {"bleu": "validation BLEU", "chrf": "validation chrF", "loss": "validation loss"}
# The order of states in the table: ranked complete trials, then the others.
STATE_ORDER = ("complete", "pruned", "running", "failed", "waiting")
PLOTS = ("optimization_history", "intermediate_values", "param_importances")


def is_study_root(root: str) -> bool:
  path = os.path.join(root, SWEEP_FILENAME)
  return os.path.exists(path) and "study_name" in text_files.read_json(path)


def load(root: str, storage: str | None = None):
  """(the study, ROOT/sweep.json's record). `storage` is needed where the record hides a
  password (the URL is recorded without it)."""
  import optuna

  record = text_files.read_json(os.path.join(root, SWEEP_FILENAME))
  recorded = record["storage"]
  if storage is None and recorded and "***" in recorded:
    raise errors.BadValue(
      f"The study of {root} is in {recorded}, whose password is not recorded: pass "
      "--storage with the whole URL."
    )
  spec = storage or recorded
  backend = study_storage.open_storage(spec, root)
  try:
    study = optuna.load_study(study_name=record["study_name"], storage=backend)
  except KeyError as e:
    raise errors.BadValue(
      f"{study_storage.shown(spec or study_storage.journal_path(None, root))} holds no study "
      f"{record['study_name']!r}: no worker of this sweep has started yet, or --storage "
      "names another database."
    ) from e
  return study, record


def rows(study, root: str) -> list[dict[str, Any]]:
  """One row per trial, in table order: complete trials best first, then pruned ones (the
  longest trained first), running and failed ones."""
  from optuna.trial import TrialState

  maximize = study.direction.name == "MAXIMIZE"
  names = {
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "waiting",
  }
  table = []
  for trial in study.get_trials(deepcopy=False):
    if trial.user_attrs.get("over_budget"):
      continue  # asked at the same moment as another worker's last trial: never ran
    status = trial_status(os.path.join(root, f"trial_{trial.number:03d}")) or {}
    reported = trial.intermediate_values
    pick = max if maximize else min
    table.append(
      {
        "trial": f"trial_{trial.number:03d}",
        "state": names[trial.state],
        "steps": status.get("steps") or (max(reported) if reported else None),
        "value": trial.value
        if trial.value is not None
        else (reported[max(reported)] if reported else None),
        "best": pick(reported.values()) if reported else None,
        "test_bleu": status.get("test_bleu"),
        "params": trial.params,
        "error": trial.user_attrs.get("error"),
      }
    )

  def order(row):
    value = row["value"] if row["value"] is not None else (-math.inf if maximize else math.inf)
    return (
      STATE_ORDER.index(row["state"]),
      -(row["steps"] or 0) if row["state"] == "pruned" else 0,
      -value if maximize else value,
    )

  return sorted(table, key=order)


def table(root: str, storage: str | None = None, metric: str | None = None) -> str:
  """The markdown table of the sweep's trials."""
  study, record = load(root, storage)
  sweep = record["sweep"]
  if metric is not None and metric != sweep["metric"]:
    raise errors.BadValue(
      f"The sweep in {root} judges its trials by validation {sweep['metric']} (its "
      f"get_sweep()); --metric {metric} ranks only sweeps from before Optuna."
    )
  found = rows(study, root)
  counts = ", ".join(
    f"{sum(r['state'] == state for r in found)} {state}" for state in STATE_ORDER[:4]
  )

  def fmt(value, spec=".2f"):
    return "–" if value is None else format(value, spec)

  label = LABELS[sweep["metric"]]
  lines = [
    f"Sweep {record['experiment']} in {root}"
    + (f" (overrides: {' '.join(record['overrides'])})" if record["overrides"] else "")
    + f": sampler {sweep['sampler']}, pruner {sweep['pruner']}, ranked by {label}; {counts}",
    "",
    f"| rank | trial | state | steps | {label} | best {label} | test BLEU | parameters |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for rank, r in enumerate(found, start=1):
    shown_rank = str(rank) if r["state"] == "complete" else "–"
    params = " ".join(
      f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items()
    )
    state = r["state"] + (f": {r['error']}" if r["error"] and r["state"] == "failed" else "")
    lines.append(
      f"| {shown_rank} | {r['trial']} | {state} | {r['steps'] or '–'} | {fmt(r['value'])} | "
      f"{fmt(r['best'])} | {fmt(r['test_bleu'])} | {params} |"
    )
  live = record["storage"] or study_storage.journal_path(None, root)
  lines += ["", f"Live view: pip install optuna-dashboard, then `optuna-dashboard {live}`."]
  return "\n".join(lines)


def write_plots(root: str, directory: str, storage: str | None = None) -> list[str]:
  """Optuna's matplotlib plots of the study as PNG files in `directory`: optimization history,
  intermediate values, parameter importances (the last needs two complete trials). Returns
  the paths written."""
  import matplotlib

  matplotlib.use("Agg")  # files only, on machines without a display
  import matplotlib.pyplot as plt
  import optuna.visualization.matplotlib as plots

  study, _ = load(root, storage)
  os.makedirs(directory, exist_ok=True)
  written = []
  for name in PLOTS:
    try:
      with warnings.catch_warnings():  # "experimental" since Optuna 2.2, and still there
        warnings.simplefilter("ignore")
        axes = getattr(plots, f"plot_{name}")(study)
    except (ValueError, RuntimeError) as e:  # e.g. importances of fewer than 2 complete trials
      logging.warning("No %s plot: %s", name.replace("_", " "), e)
      continue
    figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
    path = os.path.join(directory, f"{name}.png")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    written.append(path)
  return written

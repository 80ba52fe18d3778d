"""Reports of finished work, read from workdirs alone: the results of `run.py reproduce` rows as a
markdown table beside the published BLEU (plus a PNG chart), and the trials of a sweep ranked by
their validation score (`run.py report`).

Only files are read (results.json, sweep.json, trial.json), so reporting needs neither a model
nor training; training/reproduce.py and training/sweep.py write those files with the names below.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from transformer_mt.data import text_files
from transformer_mt.runtime import errors

RESULTS_FILENAME = "results.json"
SWEEP_FILENAME = "sweep.json"
TRIAL_FILENAME = "trial.json"
# --metric name -> (the validation score's key in metrics.jsonl, in trial.json, its label).
RANKING_METRICS = {
  "bleu": ("validation/bleu", "validation_bleu", "validation BLEU"),
  "chrf": ("validation/chrf", "validation_chrf", "validation chrF"),
}


def check_metric(metric: str) -> None:
  """Fails before any work (a sweep may run for hours before it ranks) on an unknown name."""
  if metric not in RANKING_METRICS:
    raise errors.BadValue(
      f"--metric {metric!r} is not a ranking metric: use one of {', '.join(RANKING_METRICS)}."
    )


def trial_status(workdir: str) -> dict[str, Any] | None:
  path = os.path.join(workdir, TRIAL_FILENAME)
  if not os.path.exists(path):
    return None
  return text_files.read_json(path)


def ranking_table(root: str, metric: str = "bleu") -> str:
  """The trials of the sweep in ROOT as a markdown table, best validation `metric` ("bleu" or
  "chrf") first. A finished trial without that score (chrF of a trial run before chrF was
  logged) is ranked after every trial with one."""
  check_metric(metric)
  _, field, label = RANKING_METRICS[metric]
  record = text_files.read_json(os.path.join(root, SWEEP_FILENAME))
  rows = [
    trial_status(os.path.join(root, t["name"]))
    or {"status": "unfinished", "trial": t["name"], "overrides": t["overrides"]}
    for t in record["trials"]
  ]
  # Best score first; ties (e.g. all 0 after a few steps) by lower final loss.
  finished = sorted(
    (r for r in rows if r["status"] == "finished"),
    key=lambda r: (
      -(r[field] if r.get(field) is not None else -math.inf),
      r["final_loss"] if r["final_loss"] is not None else math.inf,
    ),
  )
  unfinished = [r for r in rows if r["status"] != "finished"]

  def fmt(value, spec=".2f"):
    return "–" if value is None else format(value, spec)

  lines = [
    f"Sweep {record['experiment']} in {root}"
    + (f" (overrides: {' '.join(record['overrides'])})" if record["overrides"] else "")
    + f", ranked by {label}",
    "",
    "| rank | trial | overrides | validation BLEU | validation chrF | test BLEU | final loss "
    "| steps |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for rank, r in enumerate(finished, start=1):
    lines.append(
      f"| {rank} | {r['trial']} | {' '.join(r['overrides'])} | "
      f"{fmt(r['validation_bleu'])} | {fmt(r.get('validation_chrf'))} | "
      f"{fmt(r['test_bleu'])} | {fmt(r['final_loss'], '.3f')} | {r['steps']} |"
    )
  for r in unfinished:
    lines.append(f"| – | {r['trial']} | {' '.join(r['overrides'])} | unfinished | | | | |")
  return "\n".join(lines)


def is_sweep_dir(path: str) -> bool:
  return os.path.exists(os.path.join(path, SWEEP_FILENAME))


def load_results(workdirs: Sequence[str]) -> list[dict[str, Any]]:
  rows = []
  for workdir in workdirs:
    path = os.path.join(workdir, RESULTS_FILENAME)
    if not os.path.exists(path):
      raise errors.MissingFile(
        f"{path} does not exist; run `run.py reproduce NAME --workdir {workdir}` first."
      )
    rows.append(dict(text_files.read_json(path), workdir=workdir))
  return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  """The rows beside the published BLEU. chrF and chrF++ are read with .get: a results.json
  written before they were reported lacks them and shows "–"."""

  def fmt(value, spec=".2f"):
    return "–" if value is None else format(value, spec)

  lines = [
    "| experiment | published BLEU | ours: paper-comparable | ours: sacreBLEU | ours: chrF "
    "| ours: chrF++ | params | steps | wall time (this run) | hardware |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['experiment']} | {fmt(r.get('paper_bleu'), 'g')} | "
      f"{fmt(r['paper_comparable_bleu'])} | {fmt(r['sacrebleu'])} | "
      f"{fmt(r.get('chrf'))} | {fmt(r.get('chrf_plus_plus'))} | "
      f"{r['parameters'] / 1e6:.1f}M | {r['steps']} | "
      f"{r['wall_seconds_this_run'] / 60:.1f} min | {r['hardware']} |"
    )
  lines.append("")
  lines.append(
    "sacreBLEU signature(s): " + "; ".join(sorted({r["sacrebleu_signature"] for r in rows}))
  )
  for label, key in (("chrF", "chrf_signature"), ("chrF++", "chrf_plus_plus_signature")):
    signatures = sorted({r[key] for r in rows if r.get(key)})
    if signatures:
      lines.append(f"{label} signature(s): " + "; ".join(signatures))
  # What "paper-comparable" means differs by data: tensor2tensor's tokenized, compound-split
  # BLEU of detokenized text, or multi-bleu.perl on text that is tokenized already (Multi30k).
  methods = [
    (r["experiment"], r["paper_comparable_method"])
    for r in rows
    if r.get("paper_comparable_method")
  ]
  if methods:
    lines.append("")
    lines += ["Paper-comparable BLEU, as computed:"] + [f"- {n}: {m}" for n, m in methods]
  # Rows of published models say where their figure comes from (the paper rows: its table 2).
  sources = [(r["experiment"], r["paper_bleu_source"]) for r in rows if r.get("paper_bleu_source")]
  if sources:
    lines.append("")
    lines += ["Published figures:"] + [f"- {name}: {source}" for name, source in sources]
  return "\n".join(lines)


def bar_chart(rows: Sequence[dict[str, Any]], path: str) -> None:
  from matplotlib.figure import Figure

  figure = Figure(figsize=(max(5, 1.6 * len(rows)), 4))
  axes = figure.add_subplot()
  names = [r["experiment"] for r in rows]
  positions = range(len(rows))
  axes.bar(
    [p - 0.2 for p in positions], [r.get("paper_bleu") or 0 for r in rows], 0.4, label="paper"
  )
  axes.bar(
    [p + 0.2 for p in positions],
    [r["paper_comparable_bleu"] for r in rows],
    0.4,
    label="ours (paper-comparable)",
  )
  axes.set_xticks(list(positions), names, rotation=20, ha="right", fontsize=8)
  axes.set_ylabel("BLEU")
  axes.legend()
  figure.tight_layout()
  try:
    figure.savefig(path, dpi=120)
  except OSError as e:
    raise text_files.DataError(text_files.cannot_write(path, e)) from e


def report(workdirs: Sequence[str], chart_path: str | None = None) -> str:
  rows = load_results(workdirs)
  if chart_path:
    bar_chart(rows, chart_path)
  return markdown_table(rows)

"""`run.py reproduce ROW` and `run.py report`: one command per row of the WMT table.

reproduce = train (or resume) -> average the last N checkpoints (the experiment's
`evaluate.average_last`) -> evaluate on the test split, all in one workdir, ending
with WORKDIR/results.json. A row of a published model (`init.from=hf:NAME`) imports it
into WORKDIR/pretrained first; with `train.num_steps=0` that import is what is evaluated.
report = those results as a markdown table beside the published BLEU, with chrF and chrF++
(rows reproduced before chrF was reported show "–"), plus a PNG chart.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import jax

from transformer_mt.config import registry
from transformer_mt.data import text_files
from transformer_mt.evaluation import test_set as evaluate
from transformer_mt.model import estimates
from transformer_mt.model.setup import model_config_for
from transformer_mt.model.transformer import count_parameters
from transformer_mt.runtime import errors
from transformer_mt.training import finetune, train
from transformer_mt.workdir import averaging, checkpointing
from transformer_mt.workdir import lock as workdir_lock

RESULTS_FILENAME = "results.json"


def _averaged_dir(workdir: str, last_n: int) -> tuple[str, list[int]]:
  """Averages the last N checkpoints, reusing an earlier average of the same steps."""
  steps = checkpointing.all_steps(workdir)[-last_n:]
  output = os.path.join(workdir, f"averaged_last{last_n}_to{steps[-1]}")
  if os.path.exists(checkpointing.checkpoint_dir(output)):
    return output, steps
  return averaging.average_last(workdir, last_n, output)


def plan(name: str, workdir: str, overrides: Sequence[str] = ()) -> str:
  """What `reproduce` would do, with the training estimate (`--dry-run`): reads the
  experiment only; trains, imports and writes nothing."""
  config = registry.load_experiment(name, overrides)
  source = config.init["from"]
  lines = [f"{name}: {config.description}"]
  if source:
    lines.append(f"import {source} into {os.path.join(workdir, 'pretrained')}")
  if config.train.num_steps == 0 and source:
    lines.append("evaluate the import as it is (no training, no averaging)")
  else:
    lines.append(
      f"train {config.train.num_steps:,} updates in {workdir} (resuming from its latest "
      f"checkpoint), {config.train.batch_tokens:,} target-token slots per update"
    )
    last_n = config.evaluate.average_last
    lines.append(
      f"average the last {last_n} checkpoints" if last_n > 1 else "no checkpoint averaging"
    )
  lines.append(
    f"evaluate on the test split (beam {config.decode.beam_size}, alpha {config.decode.alpha})"
    f" -> {os.path.join(workdir, RESULTS_FILENAME)}"
  )
  reason = estimates.not_estimated(config)
  if reason:
    why = "nothing is trained" if reason == "import" else "the model's shapes are the import's"
    lines.append(f"estimate: none ({why})")
  else:
    lines += estimates.describe(estimates.estimate(config))
  return "\n".join(lines)


def reproduce(
  name: str, workdir: str, overrides: Sequence[str] = (), force_unlock: bool = False
) -> dict[str, Any]:
  """Train, average, evaluate and write results.json, holding the workdir's writer lock
  throughout (workdir_lock.py; `train` inside shares it), so no second run writes into the
  workdir between training and the results; `force_unlock` takes over another host's lock."""
  config = registry.load_experiment(name, overrides)
  with workdir_lock.held_for_job(workdir, force_unlock):
    return _reproduce(name, workdir, overrides, config)


def _reproduce(name: str, workdir: str, overrides: Sequence[str], config) -> dict[str, Any]:
  start = time.perf_counter()
  if config.train.num_steps == 0 and finetune.source(config):
    # A published model evaluated as it is: nothing to train or average.
    eval_dir = finetune.import_into_workdir(config, workdir)
    trained, averaged = {"step": 0}, [0]
  else:
    trained = train.train(config, workdir)
    if trained.get("preempted"):
      raise errors.Stopped("Training was stopped by a signal; rerun the same command to resume.")
    last_n = config.evaluate.average_last
    eval_dir, averaged = (
      _averaged_dir(workdir, last_n)
      if last_n > 1
      else (workdir, checkpointing.all_steps(workdir)[-1:])
    )
  scores = evaluate.evaluate(eval_dir, "test")
  # The evaluated checkpoint's own model (an import's or a fine-tuned one's, not the
  # experiment file's model section).
  saved, tokenizer, _ = checkpointing.read_config(eval_dir)
  model = model_config_for(saved, tokenizer)
  results = {
    "experiment": name,
    "description": config.description,
    "paper_bleu": config.paper_bleu,
    "paper_bleu_source": config.paper_bleu_source,
    "sacrebleu": scores["sacrebleu"],
    "sacrebleu_signature": scores["sacrebleu_signature"],
    "paper_comparable_bleu": scores["paper_bleu"],
    "paper_comparable_method": scores["paper_bleu_method"],
    "chrf": scores["chrf"],
    "chrf_signature": scores["chrf_signature"],
    "chrf_plus_plus": scores["chrf_plus_plus"],
    "chrf_plus_plus_signature": scores["chrf_plus_plus_signature"],
    "parameters": count_parameters(model),
    "steps": trained["step"],
    "averaged_steps": averaged,
    "beam_size": scores["beam_size"],
    "alpha": scores["alpha"],
    "test_sentences": scores["num_sentences"],
    "wall_seconds_this_run": time.perf_counter() - start,
    "hardware": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
    "overrides": list(overrides),
  }
  text_files.write_atomically(
    os.path.join(workdir, RESULTS_FILENAME), json.dumps(results, indent=2)
  )
  return results


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
      f"| {r['experiment']} | {fmt(r.get('paper_bleu'), '.1f')} | "
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

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
from transformer_mt.evaluation.reports import RESULTS_FILENAME
from transformer_mt.model import estimates
from transformer_mt.model.setup import model_config_for
from transformer_mt.model.transformer import count_parameters
from transformer_mt.runtime import errors
from transformer_mt.training import finetune, train
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import lock as workdir_lock


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
  throughout (workdir/lock.py; `train` inside shares it), so no second run writes into the
  workdir between training and the results; `force_unlock` takes over another host's lock.

  An experiment with `init.from` and train.num_steps=0 (a published model) is imported and
  evaluated as it is. A workdir with checkpoints resumes, and an existing average of the same
  steps is reused, so rerunning after a stop finishes the job.

  Args:
    name: an experiment name or file (`registry.load_experiment`).
    overrides: "section.key=value" settings on top of the experiment.

  Returns:
    The results written to WORKDIR/results.json: sacreBLEU, the paper-comparable BLEU, chrF
    and chrF++ with their signatures, the paper's figure, parameters, steps, averaged steps,
    decoding settings, wall time and hardware.

  Raises:
    errors.UserError: as `train.train` and `evaluate` raise them; errors.Stopped when a
      signal stopped training (rerunning resumes).
  """
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
    # The test split is read once, by the evaluation below: training's own held-out
    # evaluation of the same model would decode it a second time.
    with config.unlocked():
      config.evaluate.test_after_training = False
    trained = train.train(config, workdir)
    if trained.get("preempted"):
      raise errors.Stopped("Training was stopped by a signal; rerun the same command to resume.")
    # The run's final model: the average train wrote (evaluate.average_last = N > 1) or its
    # latest checkpoint.
    eval_dir = trained["final_model"]
    averaged = trained.get("averaged_steps") or checkpointing.all_steps(workdir)[-1:]
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

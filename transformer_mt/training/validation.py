"""Scoring during and after training: validation loss, validation BLEU and chrF, and the
held-out test BLEU a finished run prints.

The loop's actions (actions.py) call `validation_scores` through this module's attribute, so
a test can replace it (tests/test_end_to_end.py scripts the BLEU a run sees).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from transformer_mt.data import input_pipeline
from transformer_mt.decoding.settings import decode_settings
from transformer_mt.decoding.translator import Translator
from transformer_mt.evaluation import corpus_scores as evaluation
from transformer_mt.runtime import sharding
from transformer_mt.runtime.ahead_of_time import Programs
from transformer_mt.training import train_step

# Held-out (source, reference, hypothesis) triples printed above the final BLEU line.
HELD_OUT_EXAMPLES = 3


def validation_fn(pairs, tokenizer, model, mesh, shardings, config):
  """A function params -> validation metrics (loss, nll, accuracy), or None without pairs."""
  if not pairs:
    return None
  eval_step = train_step.jit_eval_step(model, mesh, shardings, config.train.loss_chunk_tokens)
  rows = input_pipeline.bucket_length(config.decode.batch_size, mesh.devices.size)
  batches = list(
    input_pipeline.evaluation_batches(
      pairs, tokenizer, rows, model.config.pad_id, model.config.decoder_start_id
    )
  )

  # One program per padded batch shape [1, rows, bucket].
  names = [f"eval_step[{b['inputs'].shape[1]}x{b['inputs'].shape[2]}]" for b in batches]
  ahead: Programs | None = None  # where list_programs put them: wait there before each call

  def validate(params):
    totals = []
    for name, batch in zip(names, batches):
      if ahead is not None:
        ahead.wait(name)
      totals.append(eval_step(params, sharding.global_batch_from_host(batch, mesh, batch_dim=1)))
    sums = {k: sum(float(t[k]) for t in totals) for k in totals[0]}
    tokens = max(sums["num_tokens"], 1.0)
    return {
      "validation/loss": sums["nll"] / tokens,
      "validation/accuracy": sums["correct"] / tokens,
    }

  def list_programs(programs: Programs, abstract_params) -> None:
    """Adds the eval step of every batch shape to `programs` (runtime/ahead_of_time.py)."""
    nonlocal ahead
    ahead = programs
    for name, batch in zip(names, batches):
      placed = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=sharding.batch_sharding(mesh, x.ndim, 1)
        ),
        batch,
      )
      programs.add(name, lambda placed=placed: eval_step.lower(abstract_params, placed))

  validate.list_programs = list_programs
  return validate


def bleu_pairs(config, pairs) -> list[tuple[str, str]]:
  """The validation pairs BLEU is computed on: the first train.bleu_sentences (0: all)."""
  limit = config.train.bleu_sentences or len(pairs)
  return [pairs[i] for i in range(min(limit, len(pairs)))]


def validation_scores(
  params, model_config, tokenizer, mesh, config, pairs, forced_first_id=None, ahead=None
) -> dict[str, float]:
  """BLEU (the experiment's `evaluate.bleu`: sacreBLEU, or tokenized BLEU for tokenized data)
  and chrF of the current parameters on (the first train.bleu_sentences of) validation, as
  metrics.jsonl records them. chrF rides along because it scores the same hypotheses (no
  second decode), so a sweep can be ranked by either. `ahead`: the run's Programs, where
  the decode programs compile ahead (training/run_programs.py)."""
  chosen = bleu_pairs(config, pairs)
  translator = Translator(
    params=params,
    model_config=model_config,
    tokenizer=tokenizer,
    mesh=mesh,
    forced_first_id=forced_first_id,
    ahead=ahead,
    **decode_settings(config),
  )
  hypotheses = translator.translate([source for source, _ in chosen])
  references = [target for _, target in chosen]
  return {
    "validation/bleu": evaluation.headline_bleu(hypotheses, references, config.evaluate.bleu)[0],
    "validation/chrf": evaluation.corpus_chrf(hypotheses, references)[0],
  }


def evaluate_held_out(
  translator: Translator, pairs: list[tuple[str, str]], num_samples: int, bleu_kind: str
) -> dict[str, Any]:
  """Translates the held-out sources with the run's decode settings and scores them with the
  experiment's BLEU (`evaluate.bleu`), printing a few examples and one line that names it."""
  start = time.perf_counter()
  hypotheses = translator.translate([source for source, _ in pairs])
  elapsed = time.perf_counter() - start
  references = [target for _, target in pairs]
  bleu, signature = evaluation.headline_bleu(hypotheses, references, bleu_kind)
  name = "BLEU" if bleu_kind == "sacrebleu" else evaluation.TOKENIZED_BLEU_NAME
  label = "sacreBLEU signature" if bleu_kind == "sacrebleu" else "method"
  if jax.process_index() == 0:
    for source, reference, hypothesis in list(zip((s for s, _ in pairs), references, hypotheses))[
      :num_samples
    ]:
      print(f"  source:     {source}\n  reference:  {reference}\n  hypothesis: {hypothesis}\n")
    print(
      f"Held-out {name} {bleu:.2f} on {len(pairs)} sentences "
      f"({len(pairs) / elapsed:.0f} sentences/s, beam {translator.beam_size})\n"
      f"  {label}: {signature}"
    )
  exact = float(np.mean([h == r for h, r in zip(hypotheses, references)]))
  return {"bleu": bleu, "bleu_signature": signature, "exact_match": exact}

"""The training loop: data -> tokenizer -> sharded state -> steps -> checkpoints -> BLEU.

Running `train` into a workdir that already holds checkpoints resumes from the
latest one: parameters, optimizer state, step, dropout RNG and the data iterator
all continue exactly where they stopped.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from transformer_mt import (checkpointing, data_sources, evaluation, input_pipeline, metrics,
                            optimizer, sharding, train_step)
from transformer_mt.model import Transformer
from transformer_mt.tokenizer import load_or_train
from transformer_mt.translate import Translator, decode_settings, model_config_for


def train(config: ml_collections.ConfigDict, workdir: str, progress: bool = True) -> dict[str, Any]:
  """Trains (or resumes) the experiment `config` in `workdir`, then evaluates on held-out pairs.

  Returns:
    {"step", "bleu", "bleu_signature", "state", "translator"}; BLEU is None when the
    data source has no held-out split.
  """
  # Read (and validate) the data before writing anything: bad input leaves no half-made workdir.
  pairs = data_sources.load_pairs(config.data)
  batch_rows = input_pipeline.rows_per_batch(config.train.batch_tokens, config.data.max_len,
                                             config.train.grad_accum_steps, jax.process_count())
  os.makedirs(workdir, exist_ok=True)
  tokenizer = load_or_train(workdir, pairs["train"], config.tokenizer)
  model_config = model_config_for(config, tokenizer)
  model = Transformer(model_config)
  tx, schedule = optimizer.make_optimizer(config.train, model_config.d_model)
  mesh = sharding.make_mesh(config.mesh)
  logging.info("Mesh %s over %d devices; %d training pairs; %d packed rows of %d tokens per step.",
               dict(mesh.shape), mesh.devices.size, len(pairs["train"]), batch_rows,
               config.data.max_len)

  batches, filter_counts = input_pipeline.training_batches(
      pairs["train"], tokenizer, batch_rows, config.train.grad_accum_steps, config.data.max_len,
      seed=config.train.seed, process_index=jax.process_index(),
      process_count=jax.process_count())

  manager = checkpointing.make_manager(workdir, keep=config.train.keep_checkpoints,
                                       save_every=config.train.checkpoint_every)
  shardings = train_step.state_shardings(model, tx, mesh)
  latest = manager.latest_step()
  if latest is not None:
    state, batches = checkpointing.restore_training(
        manager, latest, train_step.abstract_state(model, tx, mesh), batches)
    logging.info("Resumed from the checkpoint of step %d in %s.", latest, workdir)
  else:
    state = train_step.create_sharded_state(config.train.seed, model, tx, mesh)
  step_fn = train_step.jit_train_step(model, tx, schedule, config.train.label_smoothing, mesh,
                                      shardings)
  validate = _validation_fn(pairs.get("validation"), tokenizer, model, mesh, shardings, config)
  bleu_every = config.train.get("bleu_every", 0) if pairs.get("validation") else 0
  best_manager = checkpointing.make_best_manager(workdir) if bleu_every else None

  writer = metrics.MetricWriter(workdir)
  start = int(state.step)
  num_steps = config.train.num_steps
  bar = tqdm(total=num_steps, initial=start, desc="train", unit="step",
             disable=not progress or jax.process_index() != 0)
  pending, interval_start, interval_tokens = [], time.perf_counter(), 0.0
  for step in range(start + 1, num_steps + 1):
    batch = sharding.global_batch_from_local(next(batches), mesh, batch_dim=1)
    state, step_metrics = step_fn(state, batch)
    pending.append((step, step_metrics))
    if step % config.train.log_every == 0 or step == num_steps:
      fetched = jax.device_get([m for _, m in pending])  # one host sync per log interval
      elapsed = time.perf_counter() - interval_start
      interval_tokens = sum(float(m["num_tokens"]) for m in fetched)
      tokens_per_second = interval_tokens / max(elapsed, 1e-9)
      for (logged_step, _), values in zip(pending, fetched):
        writer.write(logged_step, dict(values, tokens_per_second=tokens_per_second))
      writer.write(step, {"data/pairs_seen": filter_counts.seen,
                          "data/dropped_empty": filter_counts.empty,
                          "data/dropped_too_long": filter_counts.too_long})
      writer.flush()
      last = fetched[-1]
      bar.set_postfix(loss=f"{last['loss']:.3f}", acc=f"{last['accuracy']:.3f}",
                      tok_s=f"{tokens_per_second:,.0f}")
      bar.update(len(pending))
      pending, interval_start = [], time.perf_counter()
    if validate and config.train.eval_every and (step % config.train.eval_every == 0
                                                 or step == num_steps):
      writer.write(step, validate(state.params))
      writer.flush()
    if bleu_every and (step % bleu_every == 0 or step == num_steps):
      bleu = _validation_bleu(state.params, model_config, tokenizer, mesh, config,
                              pairs["validation"])
      writer.write(step, {"validation/bleu": bleu})
      writer.flush()
      checkpointing.save_best(best_manager, step, state, config, tokenizer, bleu)
    checkpointing.save(manager, step, state, batches, config, tokenizer,
                       force=step == num_steps)
  bar.update(len(pending))
  bar.close()
  if filter_counts.empty or filter_counts.too_long:
    logging.info("Training pairs read by this process: %d; dropped %d empty and %d longer than "
                 "data.max_len=%d tokens.", filter_counts.seen, filter_counts.empty,
                 filter_counts.too_long, config.data.max_len)
  if latest is not None and latest >= num_steps:
    logging.info("Checkpoint step %d already reached train.num_steps=%d.", latest, num_steps)
  checkpointing.wait(manager)
  if best_manager:
    best_manager.wait_until_finished()
  writer.close()

  translator = Translator(params=state.params, model_config=model_config, tokenizer=tokenizer,
                          mesh=mesh, **decode_settings(config))
  result = {"step": int(state.step), "state": state, "translator": translator,
            "bleu": None, "bleu_signature": None}
  if pairs.get("test"):
    result.update(evaluate_held_out(translator, pairs["test"], config.get("num_samples", 3)))
  return result


def _validation_fn(pairs, tokenizer, model, mesh, shardings, config):
  """A function params -> validation metrics (loss, nll, accuracy), or None without pairs."""
  if not pairs:
    return None
  eval_step = train_step.jit_eval_step(model, mesh, shardings)
  rows = input_pipeline.bucket_length(config.decode.batch_size, mesh.devices.size)
  batches = list(input_pipeline.evaluation_batches(pairs, tokenizer, rows))

  def validate(params):
    totals = [eval_step(params, sharding.global_batch_from_local(b, mesh, batch_dim=1))
              for b in batches]
    sums = {k: sum(float(t[k]) for t in totals) for k in totals[0]}
    tokens = max(sums["num_tokens"], 1.0)
    return {"validation/loss": sums["nll"] / tokens, "validation/accuracy": sums["correct"] / tokens}

  return validate


def _validation_bleu(params, model_config, tokenizer, mesh, config, pairs) -> float:
  """sacreBLEU of the current parameters on (the first train.bleu_sentences of) validation."""
  limit = config.train.get("bleu_sentences", 0) or len(pairs)
  chosen = [pairs[i] for i in range(min(limit, len(pairs)))]
  translator = Translator(params=params, model_config=model_config, tokenizer=tokenizer, mesh=mesh,
                          **decode_settings(config))
  hypotheses = translator.translate([source for source, _ in chosen])
  return evaluation.corpus_bleu(hypotheses, [target for _, target in chosen])[0]


def evaluate_held_out(translator: Translator, pairs: list[tuple[str, str]],
                      num_samples: int) -> dict[str, Any]:
  """Greedy-translates the held-out sources and scores them with sacreBLEU."""
  start = time.perf_counter()
  hypotheses = translator.translate([source for source, _ in pairs])
  elapsed = time.perf_counter() - start
  references = [target for _, target in pairs]
  bleu, signature = evaluation.corpus_bleu(hypotheses, references)
  if jax.process_index() == 0:
    for source, reference, hypothesis in list(zip((s for s, _ in pairs), references,
                                                  hypotheses))[:num_samples]:
      print(f"  source:     {source}\n  reference:  {reference}\n  hypothesis: {hypothesis}\n")
    print(f"Held-out BLEU {bleu:.2f} on {len(pairs)} sentences "
          f"({len(pairs) / elapsed:.0f} sentences/s, beam {translator.beam_size})\n"
          f"  sacreBLEU signature: {signature}")
  exact = float(np.mean([h == r for h, r in zip(hypotheses, references)]))
  return {"bleu": bleu, "bleu_signature": signature, "exact_match": exact}

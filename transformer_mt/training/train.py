"""The training loop: data -> tokenizer -> sharded state -> steps -> checkpoints -> BLEU.

Running `train` into a workdir that already holds checkpoints resumes from the
latest one: parameters, optimizer state, step, dropout RNG and the data iterator
all continue exactly where they stopped, and so do the logged counters (pairs read and
dropped, saved with the iterator; non-finite steps skipped, the step minus the optimizer's
count). Rows of metrics.jsonl logged after that checkpoint are dropped first (see
metrics.py), so each step is logged once.

With `init.from=DIR` the run starts from an imported model's parameters, tokenizer and
model section instead (see `finetune`).
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

from transformer_mt.data import input_pipeline
from transformer_mt.data import sources as data_sources
from transformer_mt.data.tokenizer import load_or_train
from transformer_mt.decoding.settings import decode_settings
from transformer_mt.decoding.translator import Translator
from transformer_mt.evaluation import corpus_scores as evaluation
from transformer_mt.model import setup as run_setup
from transformer_mt.model.setup import model_config_for
from transformer_mt.model.transformer import Transformer
from transformer_mt.runtime import distributed, errors, sharding
from transformer_mt.training import finetune, optimizer, preemption, resume, train_step
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import lock as workdir_lock
from transformer_mt.workdir import metrics_log as metrics


def train(
  config: ml_collections.ConfigDict,
  workdir: str,
  progress: bool = True,
  force_unlock: bool = False,
) -> dict[str, Any]:
  """`_train` holding the workdir's writer lock (workdir_lock.py): a second run into the same
  workdir stops with one line naming this one before writing anything. Process 0 holds it
  for a multi-process job; `force_unlock` takes over a lock left by another host."""
  with workdir_lock.held_for_job(workdir, force_unlock):
    return _train(config, workdir, progress)


def _train(config: ml_collections.ConfigDict, workdir: str, progress: bool) -> dict[str, Any]:
  """Trains (or resumes) the experiment `config` in `workdir`, then evaluates on held-out pairs.

  Returns:
    {"step", "state", "translator", "bleu", "bleu_signature", "preempted",
    "nonfinite_steps_skipped"}; BLEU is None when the data source has no test split or
    the run was preempted (SIGTERM/SIGINT), in which case the final evaluation is skipped.
  """
  # Validate the config and read the data before writing anything: a bad config or bad
  # input leaves no half-made workdir behind.
  finetune.check_resume_source(workdir, config)
  imported, forced_first_id = None, None
  if finetune.source(config):
    imported = finetune.read_import(finetune.import_into_workdir(config, workdir))
    config = finetune.merged_config(config, imported)
    imported, forced_first_id = finetune.with_languages(imported, config)
  run_setup.check_learned_positions(config, model_config_for(config))
  data_shards, fsdp_shards, _ = sharding.mesh_shape(config.mesh, jax.device_count())
  profiler = _StepTrace(config.train.get("profile_steps", []), workdir)
  input_pipeline.check_num_workers(config.data.get("num_workers", 0))  # before writing anything
  optimizer.optimizer_name(config.train)
  policy = config.train.get("nonfinite", "stop")
  if policy not in ("stop", "skip"):
    raise errors.BadValue(f"train.nonfinite={policy!r} must be 'stop' or 'skip'.")
  batch_rows = input_pipeline.rows_per_batch(
    config.train.batch_tokens,
    config.data.max_len,
    config.train.grad_accum_steps,
    jax.process_count(),
    batch_shards=data_shards * fsdp_shards,
  )
  # The configured vocabulary size stands in for the tokenizer's, not trained yet; training_setup
  # checks again with the real one.
  mesh = sharding.make_mesh(config.mesh)
  run_setup.check_parameter_layout(config, Transformer(model_config_for(config)), mesh)
  pairs = data_sources.load_pairs(config.data)
  os.makedirs(workdir, exist_ok=True)
  tokenizer = imported.tokenizer if imported else _shared_tokenizer(workdir, pairs["train"], config)
  setup = run_setup.training_setup(config, tokenizer, mesh)
  model, model_config, shardings = setup.model, setup.model_config, setup.state_shardings
  logging.info(
    "Mesh %s over %d devices; %d training pairs; %d packed rows of %d tokens per step.",
    dict(mesh.shape),
    mesh.devices.size,
    len(pairs["train"]),
    batch_rows,
    config.data.max_len,
  )

  def make_batches():
    batches, counts = input_pipeline.training_batches(
      pairs["train"],
      tokenizer,
      batch_rows,
      config.train.grad_accum_steps,
      config.data.max_len,
      seed=config.train.seed,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      pad_id=model_config.pad_id,
      start_id=model_config.decoder_start_id,
      num_workers=config.data.get("num_workers", 0),
    )
    return sharding.DevicePrefetch(batches, mesh, batch_dim=1), counts

  manager = checkpointing.make_manager(
    workdir, keep=config.train.keep_checkpoints, save_every=config.train.checkpoint_every
  )
  restored = resume.restore_latest_readable(
    manager, workdir, setup.abstract_state, make_batches, config.train.num_steps
  )
  latest = restored[0] if restored else None
  if restored:
    _, state, batches, filter_counts = restored
  else:
    if imported:
      state = train_step.sharded_state_from_params(
        finetune.initial_params(imported, setup.abstract_params),
        config.train.seed,
        model,
        setup.tx,
        mesh,
      )
    else:
      state = train_step.create_sharded_state(config.train.seed, model, setup.tx, mesh)
    batches, filter_counts = make_batches()
  step_fn = train_step.jit_train_step(
    model,
    setup.tx,
    setup.schedule,
    config.train.label_smoothing,
    mesh,
    shardings,
    config.train.get("inject_nonfinite_at", 0),
  )
  validate = _validation_fn(pairs.get("validation"), tokenizer, model, mesh, shardings, config)
  bleu_every = config.train.get("bleu_every", 0) if pairs.get("validation") else 0
  best_manager = checkpointing.make_best_manager(workdir) if bleu_every else None

  writer = metrics.MetricWriter(workdir, resumed_from=int(state.step))
  start = int(state.step)
  num_steps = config.train.num_steps
  bar = tqdm(
    total=num_steps,
    initial=start,
    desc="train",
    unit="step",
    disable=not progress or jax.process_index() != 0,
  )
  pending, interval_start = [], time.perf_counter()
  # Non-finite steps skipped so far, this run's and those before a resume: a skipped step
  # advances the step but not the optimizer's count (train_step.train_step).
  skipped = start - int(optimizer.updates_applied(state.opt_state))
  preempted = False
  with preemption.StopOnSignal(start) as stop_signal:
    for step in range(start + 1, num_steps + 1):
      batch = next(batches)  # already on the mesh (DevicePrefetch)
      profiler.before(step)
      state, step_metrics = step_fn(state, batch)
      profiler.after(step, step_metrics)
      pending.append((step, step_metrics))
      log_step = step % config.train.log_every == 0
      preempted = stop_signal.stop_after(step, log_step)
      last_step = step == num_steps or preempted
      # Metrics are fetched (one host sync) at log steps and before every checkpoint, so a
      # non-finite step is seen before any checkpoint after it is written.
      if log_step or last_step or manager.should_save(step):
        fetched = jax.device_get([m for _, m in pending])
        elapsed = time.perf_counter() - interval_start
        tokens_per_second = sum(float(m["num_tokens"]) for m in fetched) / max(elapsed, 1e-9)
        for (logged_step, _), values in zip(pending, fetched):
          writer.write(logged_step, dict(values, tokens_per_second=tokens_per_second))
        bad_steps = [s for (s, _), m in zip(pending, fetched) if m["nonfinite"]]
        skipped += len(bad_steps)
        writer.write(
          step,
          {
            "data/pairs_seen": filter_counts.seen,
            "data/dropped_empty": filter_counts.empty,
            "data/dropped_too_long": filter_counts.too_long,
            "nonfinite_steps_skipped": skipped,
          },
        )
        writer.flush()
        if bad_steps and policy == "stop":
          checkpointing.wait(manager)
          bar.close()  # so the error prints on a line of its own
          raise train_step.NonFiniteError(
            f"Non-finite loss or gradient at step {bad_steps[0]}; its update was not applied "
            f"and the last checkpoint (step {manager.latest_step()}) is intact. Lower the "
            "learning rate or clip gradients (train.grad_clip_norm), or set "
            "train.nonfinite='skip' to skip such steps, then rerun to resume."
          )
        for bad in bad_steps:
          logging.warning("Skipped the update of step %d: non-finite loss or gradient.", bad)
        last = fetched[-1]
        bar.set_postfix(
          loss=f"{last['loss']:.3f}",
          acc=f"{last['accuracy']:.3f}",
          tok_s=f"{tokens_per_second:,.0f}",
        )
        bar.update(len(pending))
        pending, interval_start = [], time.perf_counter()
      if (
        validate
        and config.train.eval_every
        and (step % config.train.eval_every == 0 or step == num_steps)
      ):
        writer.write(step, validate(state.params))
        writer.flush()
      if bleu_every and (step % bleu_every == 0 or step == num_steps):
        scores = _validation_scores(
          state.params, model_config, tokenizer, mesh, config, pairs["validation"], forced_first_id
        )
        bleu = scores["validation/bleu"]
        writer.write(step, scores)
        writer.flush()
        # One save in flight at a time: Orbax coordinates the processes of a multi-process
        # run per save, and two managers saving at once can interleave those steps.
        manager.wait_until_finished()
        checkpointing.save_best(best_manager, step, state.params, config, tokenizer, bleu)
        best_manager.wait_until_finished()
      checkpointing.save(manager, step, state, batches, config, tokenizer, force=last_step)
      if preempted:
        logging.warning(
          "Stopped by %s after step %d; its checkpoint is saved. Run the same "
          "command again to resume.",
          stop_signal.describe(),
          step,
        )
        break
  profiler.stop()
  bar.update(len(pending))
  bar.close()
  if filter_counts.empty or filter_counts.too_long:
    logging.info(
      "Training pairs read by this process: %d; dropped %d empty and %d longer than "
      "data.max_len=%d tokens.",
      filter_counts.seen,
      filter_counts.empty,
      filter_counts.too_long,
      config.data.max_len,
    )
  if latest is not None and latest >= num_steps:
    logging.info("Checkpoint step %d already reached train.num_steps=%d.", latest, num_steps)
  checkpointing.wait(manager)
  if best_manager:
    best_manager.wait_until_finished()
  writer.close()

  translator = Translator(
    params=state.params,
    model_config=model_config,
    tokenizer=tokenizer,
    mesh=mesh,
    forced_first_id=forced_first_id,
    **decode_settings(config),
  )
  result = {
    "step": int(state.step),
    "state": state,
    "translator": translator,
    "bleu": None,
    "bleu_signature": None,
    "preempted": preempted,
    "nonfinite_steps_skipped": skipped,
  }
  if pairs.get("test") and not preempted:
    result.update(evaluate_held_out(translator, pairs["test"], config.get("num_samples", 3)))
  return result


def _shared_tokenizer(workdir: str, pairs, config):
  """Process 0 trains (or loads) the tokenizer into the workdir; the others then load it."""
  if distributed.is_primary():
    tokenizer = load_or_train(workdir, pairs, config.tokenizer)
  distributed.barrier("tokenizer")
  if not distributed.is_primary():
    tokenizer = load_or_train(workdir, pairs, config.tokenizer)
  return tokenizer


def _validation_fn(pairs, tokenizer, model, mesh, shardings, config):
  """A function params -> validation metrics (loss, nll, accuracy), or None without pairs."""
  if not pairs:
    return None
  eval_step = train_step.jit_eval_step(model, mesh, shardings)
  rows = input_pipeline.bucket_length(config.decode.batch_size, mesh.devices.size)
  batches = list(
    input_pipeline.evaluation_batches(
      pairs, tokenizer, rows, model.config.pad_id, model.config.decoder_start_id
    )
  )

  def validate(params):
    totals = [
      eval_step(params, sharding.global_batch_from_host(b, mesh, batch_dim=1)) for b in batches
    ]
    sums = {k: sum(float(t[k]) for t in totals) for k in totals[0]}
    tokens = max(sums["num_tokens"], 1.0)
    return {
      "validation/loss": sums["nll"] / tokens,
      "validation/accuracy": sums["correct"] / tokens,
    }

  return validate


class _StepTrace:
  """`train.profile_steps=[a, b]`: a JAX profiler trace of steps a..b (inclusive) in
  WORKDIR/tensorboard/plugins/profile/<run>/, where TensorBoard's profile tab finds it. The
  trace starts just before step a is dispatched and stops once step b's results are ready, so
  it holds whole steps: their XLA ops and the host work between them (input pipeline, logging).
  An empty list (the default) traces nothing; a resumed run traces what is left of the range."""

  def __init__(self, steps, workdir: str):
    steps = list(steps or [])
    if steps and (
      len(steps) != 2
      or not all(isinstance(s, int) and s >= 1 for s in steps)
      or steps[0] > steps[1]
    ):
      raise errors.BadValue(
        f"train.profile_steps={steps!r} must be [] or [first, last] with 1 <= first <= last, "
        "e.g. train.profile_steps=[10,12]."
      )
    self.first, self.last = steps if steps else (0, -1)
    self.directory = os.path.join(workdir, "tensorboard")
    self.active = False

  def before(self, step: int) -> None:
    if not self.active and self.first <= step <= self.last:
      jax.profiler.start_trace(self.directory)
      self.active = True

  def after(self, step: int, outputs) -> None:
    if self.active and step >= self.last:
      jax.block_until_ready(outputs)
      self.stop()

  def stop(self) -> None:
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
      logging.info(
        "Wrote a profiler trace of steps %d-%d to %s.", self.first, self.last, self.directory
      )


def _validation_scores(
  params, model_config, tokenizer, mesh, config, pairs, forced_first_id=None
) -> dict[str, float]:
  """sacreBLEU and chrF of the current parameters on (the first train.bleu_sentences of)
  validation, as metrics.jsonl records them. chrF rides along because it scores the same
  hypotheses (no second decode), so a sweep can be ranked by either."""
  limit = config.train.get("bleu_sentences", 0) or len(pairs)
  chosen = [pairs[i] for i in range(min(limit, len(pairs)))]
  translator = Translator(
    params=params,
    model_config=model_config,
    tokenizer=tokenizer,
    mesh=mesh,
    forced_first_id=forced_first_id,
    **decode_settings(config),
  )
  hypotheses = translator.translate([source for source, _ in chosen])
  references = [target for _, target in chosen]
  return {
    "validation/bleu": evaluation.corpus_bleu(hypotheses, references)[0],
    "validation/chrf": evaluation.corpus_chrf(hypotheses, references)[0],
  }


def evaluate_held_out(
  translator: Translator, pairs: list[tuple[str, str]], num_samples: int
) -> dict[str, Any]:
  """Greedy-translates the held-out sources and scores them with sacreBLEU."""
  start = time.perf_counter()
  hypotheses = translator.translate([source for source, _ in pairs])
  elapsed = time.perf_counter() - start
  references = [target for _, target in pairs]
  bleu, signature = evaluation.corpus_bleu(hypotheses, references)
  if jax.process_index() == 0:
    for source, reference, hypothesis in list(zip((s for s, _ in pairs), references, hypotheses))[
      :num_samples
    ]:
      print(f"  source:     {source}\n  reference:  {reference}\n  hypothesis: {hypothesis}\n")
    print(
      f"Held-out BLEU {bleu:.2f} on {len(pairs)} sentences "
      f"({len(pairs) / elapsed:.0f} sentences/s, beam {translator.beam_size})\n"
      f"  sacreBLEU signature: {signature}"
    )
  exact = float(np.mean([h == r for h, r in zip(hypotheses, references)]))
  return {"bleu": bleu, "bleu_signature": signature, "exact_match": exact}

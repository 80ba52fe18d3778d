"""Everything a training run needs before its first step, built by `setup_run`.

It checks the config, then reads (data, tokenizer, checkpoint), then writes: a bad config or
bad input leaves no half-made workdir behind. Resuming happens here: the state, the data
iterator and its counters come from the newest readable checkpoint when there is one
(resume.py), from an imported model with `init.from=DIR` (finetune.py), or fresh otherwise.
The loop (train.py) and its actions (actions.py) then only run steps.

`training_setup` is the model's layout with an optimizer, shared with the tests and the
benchmarks that build a train state without a run.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import ml_collections
import optax
from jax.sharding import Mesh

from transformer_mt.data import input_pipeline
from transformer_mt.data import sources as data_sources
from transformer_mt.data.tokenizer import AnyTokenizer, load_or_train
from transformer_mt.evaluation import corpus_scores
from transformer_mt.model import fused_kernels
from transformer_mt.model.setup import (
  ModelSetup,
  check_learned_positions,
  check_parameter_layout,
  model_config_for,
)
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import distributed, errors, sharding
from transformer_mt.training import (
  actions,
  auto_settings,
  chunked_loss,
  dropout_rng,
  finetune,
  optimizer,
  resume,
  train_step,
  validation,
)
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import metrics_log as metrics


@dataclasses.dataclass(frozen=True)
class TrainingSetup(ModelSetup):
  """The model plus the optimizer and the whole train state's layout."""

  tx: optax.GradientTransformation
  schedule: optax.Schedule
  state_shardings: Any  # a TrainState of NamedShardings.
  abstract_state: Any  # a TrainState of sharded ShapeDtypeStructs.
  # The dropout key's PRNG (train.prng_impl resolved, dropout_rng.py): the rng leaf's shape.
  prng_impl: str = dropout_rng.THREEFRY


def training_setup(
  config: ml_collections.ConfigDict,
  tokenizer: AnyTokenizer | None,
  mesh: Mesh,
  model_config: TransformerConfig | None = None,
  traced: tuple[Transformer, Any] | None = None,
) -> TrainingSetup:
  """Everything `model_setup` gives, plus Adam with the paper's schedule and the train state.

  Args:
    model_config: use this instead of the config's model section (benchmarks that vary it).
    traced: (a model, `_logical_state(config, model)`) traced already (setup_run's check
      before the tokenizer exists); used when that model is this one, so that its init is not
      traced again.
  """
  model_config = model_config or model_config_for(config, tokenizer)
  model = Transformer(model_config)
  if traced is not None and traced[0] == model:
    logical = traced[1]
  else:
    logical = _logical_state(config, model)
  check_parameter_layout(config, model, mesh, logical.params)
  tx, schedule = optimizer.make_optimizer(config.train, model_config.d_model)
  prng_impl = dropout_rng.resolve(config.train.prng_impl)
  state_shardings, abstract_state = train_step.state_layout(model, tx, mesh, prng_impl, logical)
  return TrainingSetup(
    model_config=model_config,
    model=model,
    mesh=mesh,
    param_shardings=state_shardings.params,
    abstract_params=abstract_state.params,
    tx=tx,
    schedule=schedule,
    state_shardings=state_shardings,
    abstract_state=abstract_state,
    prng_impl=prng_impl,
  )


def _logical_state(config: ml_collections.ConfigDict, model: Transformer):
  """`train_step.logical_state` of `model` under the config's optimizer and train.prng_impl:
  one trace of the model's init."""
  tx, _ = optimizer.make_optimizer(config.train, model.config.d_model)
  return train_step.logical_state(model, tx, dropout_rng.resolve(config.train.prng_impl))


@dataclasses.dataclass
class RunSetup:
  """Everything a training run needs before its first step (built by `setup_run`)."""

  config: ml_collections.ConfigDict  # the experiment's, merged with an imported model's section
  workdir: str
  mesh: Mesh
  tokenizer: AnyTokenizer
  # "train" (local text: a PreparedCorpus, read from disk), and "validation"/"test" when there are
  pairs: dict[str, Sequence[tuple[str, str]]]
  layout: TrainingSetup  # model, optimizer, schedule, shardings, abstract state
  forced_first_id: int | None  # a multilingual import's forced first target token
  manager: Any  # ocp.CheckpointManager of WORKDIR/checkpoints
  state: Any  # TrainState: restored, imported or fresh, born sharded; donated to the first step
  start: int  # its step: the loop runs start + 1 .. train.num_steps
  batches: Iterator  # DevicePrefetch over the Grain iterator
  filter_counts: input_pipeline.FilterCounts
  restored_step: int | None  # the checkpoint resumed from, if any
  step_fn: Callable  # train_step.jit_train_step(...), looked up on the module
  validate: Callable | None  # params -> validation loss and accuracy; None without validation
  bleu_every: int  # train.bleu_every, or 0 without validation pairs
  best_manager: Any  # ocp.CheckpointManager of WORKDIR/best, or None when bleu_every is 0
  writer: metrics.MetricWriter  # resumed_from=start: drops rows logged after the checkpoint


def setup_run(config: ml_collections.ConfigDict, workdir: str) -> RunSetup:
  """Everything the loop needs for `config` in `workdir`: resumed from the workdir's newest
  readable checkpoint, started from an import (`init.from`), or fresh.

  Checks, then reads, then writes: a bad config or bad input leaves no half-made workdir.

  Args:
    config: the experiment; with `init.from` it is merged with the import's model section
      (RunSetup.config is the merged one).
    workdir: created if missing; its tokenizer, checkpoints and metrics are reused.

  Raises:
    errors.UserError: a bad config, missing data, or checkpoints that do not match the config.
  """
  finetune.check_resume_source(workdir, config)
  # "auto" settings resolved for this host, or as the workdir's checkpoints recorded them.
  config = auto_settings.resolved(config, workdir)
  imported, forced_first_id = None, None
  if finetune.source(config):
    imported = finetune.read_import(finetune.import_into_workdir(config, workdir))
    config = finetune.merged_config(config, imported)
    imported, forced_first_id = finetune.with_languages(imported, config)
  batch_rows = _check_before_writing(config)
  mesh = sharding.make_mesh(config.mesh)
  # The configured vocabulary size stands in for the tokenizer's, not trained yet; the trace is
  # reused by training_setup when the tokenizer has that size (it usually has).
  model = Transformer(model_config_for(config))
  traced = (model, _logical_state(config, model))
  check_parameter_layout(config, model, mesh, traced[1].params)
  pairs = data_sources.load_pairs(config.data)
  if config.train.patience and not pairs.get("validation"):
    raise errors.BadValue(
      f"train.patience={config.train.patience} stops on the validation loss, but the data has "
      "no validation split: give one (e.g. data.validation_prefixes) or set train.patience=0."
    )
  os.makedirs(workdir, exist_ok=True)
  tokenizer = imported.tokenizer if imported else _shared_tokenizer(workdir, pairs["train"], config)
  layout = training_setup(config, tokenizer, mesh, traced=traced)
  logging.info(
    "Mesh %s over %d devices; %d training pairs; %d packed rows of %d tokens per step.",
    dict(mesh.shape),
    mesh.devices.size,
    len(pairs["train"]),
    batch_rows,
    config.data.max_len,
  )
  make_batches = functools.partial(
    _make_batches, config, pairs["train"], tokenizer, layout.model_config, mesh, batch_rows
  )
  manager = checkpointing.make_manager(
    workdir, keep=config.train.keep_checkpoints, save_every=config.train.checkpoint_every
  )
  restored = resume.restore_latest_readable(
    manager, workdir, layout.abstract_state, make_batches, config.train.num_steps
  )
  if restored:
    restored_step, state, batches, filter_counts = restored
  else:
    restored_step, state = None, _initial_state(config, imported, layout, mesh)
    batches, filter_counts = make_batches()
  step_fn = train_step.jit_train_step(
    layout.model,
    layout.tx,
    layout.schedule,
    config.train.label_smoothing,
    mesh,
    layout.state_shardings,
    config.train.inject_nonfinite_at,
    loss_chunk_tokens=config.train.loss_chunk_tokens,
    prng_impl=layout.prng_impl,
    optimizer_for=functools.partial(
      optimizer.make_optimizer, config.train, layout.model_config.d_model
    ),
    schedule_inputs=optimizer.schedule_inputs(config.train),
  )
  validate = validation.validation_fn(
    pairs.get("validation"), tokenizer, layout.model, mesh, layout.state_shardings, config
  )
  bleu_every = config.train.bleu_every if pairs.get("validation") else 0
  best_manager = checkpointing.make_best_manager(workdir) if bleu_every else None
  writer = metrics.MetricWriter(workdir, resumed_from=int(state.step))
  return RunSetup(
    config=config,
    workdir=workdir,
    mesh=mesh,
    tokenizer=tokenizer,
    pairs=pairs,
    layout=layout,
    forced_first_id=forced_first_id,
    manager=manager,
    state=state,
    start=int(state.step),
    batches=batches,
    filter_counts=filter_counts,
    restored_step=restored_step,
    step_fn=step_fn,
    validate=validate,
    bleu_every=bleu_every,
    best_manager=best_manager,
    writer=writer,
  )


def _check_before_writing(config: ml_collections.ConfigDict) -> int:
  """Raises on a config the run cannot use, and warns (one line) where it would quietly run
  something else than it asks; returns the packed rows per step."""
  # Before the model is traced: with attention dropout, training's trace never reaches the
  # kernel, and the first validation would be the first to refuse it.
  fused_kernels.require(config.model.attention_implementation)
  note = fused_kernels.attention_dropout_note(
    config.model.attention_implementation, config.model.attention_dropout_rate
  )
  if note:
    logging.warning(note)
  check_learned_positions(config, model_config_for(config))
  data_shards, fsdp_shards, _ = sharding.mesh_shape(config.mesh, jax.device_count())
  actions.profile_range(config.train.profile_steps)
  input_pipeline.check_num_workers(config.data.num_workers)
  optimizer.optimizer_name(config.train)
  actions.nonfinite_policy(config.train.nonfinite)
  chunked_loss.check_chunk_tokens(config.train.loss_chunk_tokens)
  actions.patience_of(config.train)
  for key in ("checkpoint_every", "keep_checkpoints"):
    if config.train[key] < 1:
      raise errors.BadValue(f"train.{key}={config.train[key]}: it must be 1 or more.")
  last_n = config.evaluate.average_last
  if last_n > 1 and config.train.keep_checkpoints < last_n:
    raise errors.BadValue(
      f"evaluate.average_last={last_n} averages the last {last_n} checkpoints into the run's "
      f"final model, but train.keep_checkpoints={config.train.keep_checkpoints} keeps fewer: "
      f"set train.keep_checkpoints={last_n} (or more), or lower evaluate.average_last."
    )
  corpus_scores.check_bleu_kind(config.evaluate.bleu)
  # The configured vocabulary size stands in for the tokenizer's, not trained yet;
  # training_setup checks again with the real one.
  return input_pipeline.rows_per_batch(
    config.train.batch_tokens,
    config.data.max_len,
    config.train.grad_accum_steps,
    jax.process_count(),
    batch_shards=data_shards * fsdp_shards,
  )


def _shared_tokenizer(workdir: str, pairs, config):
  """Process 0 trains (or loads) the tokenizer into the workdir; the others then load it."""
  if distributed.is_primary():
    tokenizer = load_or_train(workdir, pairs, config.tokenizer)
  distributed.barrier("tokenizer")
  if not distributed.is_primary():
    tokenizer = load_or_train(workdir, pairs, config.tokenizer)
  return tokenizer


def _make_batches(config, pairs, tokenizer, model_config, mesh, batch_rows):
  """(training batches on the mesh, their filter counts), from the start of the data."""
  batches, counts = input_pipeline.training_batches(
    pairs,
    tokenizer,
    batch_rows,
    config.train.grad_accum_steps,
    config.data.max_len,
    seed=config.train.seed,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    pad_id=model_config.pad_id,
    start_id=model_config.decoder_start_id,
    num_workers=config.data.num_workers,
    allow_changed_corpus=config.data.allow_changed_corpus,
  )
  return sharding.DevicePrefetch(batches, mesh, batch_dim=1), counts


def _initial_state(config, imported, layout: TrainingSetup, mesh):
  """A fresh train state, or one holding an imported model's parameters (`init.from`)."""
  if imported:
    return train_step.sharded_state_from_params(
      finetune.initial_params(imported, layout.abstract_params),
      config.train.seed,
      layout.model,
      layout.tx,
      mesh,
      layout.prng_impl,
      layout.state_shardings,
    )
  return train_step.create_sharded_state(
    config.train.seed, layout.model, layout.tx, mesh, layout.prng_impl, layout.state_shardings
  )

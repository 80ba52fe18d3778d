"""What a run needs, built in one place from (config, tokenizer, mesh).

Training, translation, averaging and the benchmarks all take their model config, model,
shardings and abstract (restore-target) trees from here, so they cannot drift apart.
Inference uses `model_setup`, which builds no optimizer: a checkpoint's parameters are
restored alone, without the Adam moments that would triple the memory.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import ml_collections
from jax.sharding import Mesh

from transformer_mt.data.tokenizer import AnyTokenizer
from transformer_mt.model import fused_kernels, layout
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors, sharding


def model_config_for(
  config: ml_collections.ConfigDict, tokenizer: AnyTokenizer | None = None
) -> TransformerConfig:
  """The experiment's model section with the vocabulary size of its tokenizer (before one is
  trained: the configured `tokenizer.vocab_size`).

  An imported model's section (`run.py import`) has its own `vocab_size`, kept as it is: its
  embedding table may have more rows than its tokenizer has pieces.
  """
  if "vocab_size" in config.model:
    return TransformerConfig.from_mapping(config.model.to_dict())
  vocab_size = tokenizer.vocab_size if tokenizer else config.tokenizer.vocab_size
  return TransformerConfig.from_mapping(config.model.to_dict(), vocab_size=vocab_size)


def runnable_here(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A checkpoint's config for inference in this process: itself, or a copy whose
  model.attention_implementation is "auto" where the kernel it names cannot run here
  ("cudnn_packed" or "pallas" trained on a GPU, read on a CPU or a GPU before Hopper). The
  kernels compute the same attention from the same parameters as JAX's dense-mask path; one
  log line says which runs. Training keeps refusing such a process (fused_kernels.require):
  there the kernel is what the run asked for."""
  implementation = config.model.attention_implementation
  problem = fused_kernels.platform_problem(implementation)
  if problem is None:
    return config
  logging.info(
    "model.attention_implementation=%r %s: running 'auto' (JAX's attention with a dense mask, "
    "the same parameters) instead.",
    implementation,
    problem,
  )
  config = config.copy_and_resolve_references()
  config.model.attention_implementation = "auto"
  return config


@dataclasses.dataclass(frozen=True)
class ModelSetup:
  """The model on a mesh: enough to restore parameters and decode."""

  model_config: TransformerConfig
  model: Transformer
  mesh: Mesh
  param_shardings: Any  # NamedSharding per parameter, from its logical axis names.
  abstract_params: Any  # ShapeDtypeStructs with those shardings: the `params` restore target.


def model_setup(
  config: ml_collections.ConfigDict, tokenizer: AnyTokenizer | None, mesh: Mesh
) -> ModelSetup:
  """Model config, model and parameter layout on `mesh`; no optimizer is built and no array
  is allocated (translation and averaging restore into `abstract_params`).

  Args:
    config: an experiment or checkpoint config; only its model and tokenizer sections count.
    tokenizer: gives the vocabulary size (`model_config_for`); None before one is trained.
    mesh: the devices the parameters will live on (e.g. sharding.inference_mesh_config()'s).
  """
  model_config = model_config_for(config, tokenizer)
  model = Transformer(model_config)
  param_shardings, abstract_params = layout.param_layout(model, mesh)
  return ModelSetup(
    model_config=model_config,
    model=model,
    mesh=mesh,
    param_shardings=param_shardings,
    abstract_params=abstract_params,
  )


def check_learned_positions(config: ml_collections.ConfigDict, model_config: TransformerConfig):
  """Raises if training rows (data.max_len tokens) would reach past the learned position table
  (model.max_len rows): those positions have no embedding to learn or to use."""
  if model_config.position_encoding == "learned" and config.data.max_len > model_config.max_len:
    raise errors.BadValue(
      f"data.max_len={config.data.max_len} exceeds model.max_len={model_config.max_len}, the "
      "rows of the learned position table: lower data.max_len or raise model.max_len."
    )


def check_parameter_layout(
  config: ml_collections.ConfigDict, model: Transformer, mesh: Mesh, logical: Any = None
):
  """Raises a one-line error naming each parameter dimension `mesh` cannot shard evenly (e.g.
  6 heads over tensor=4), unless the config opts in to replicating those dimensions with
  mesh.allow_replicated_fallback=True. A replicated dimension costs memory and speed that a
  larger mesh axis was asked to save; training should not quietly pay for it.

  `logical`: the model's boxed abstract parameters (`layout.logical_params(model)`) when the
  caller has traced them already."""
  if config.mesh.allow_replicated_fallback:
    return
  logical = layout.logical_params(model) if logical is None else logical
  problems = sharding.undivided_dimensions(logical, mesh)
  if problems:
    shown = "; ".join(problems[:4]) + (
      f"; ... ({len(problems)} in all)" if len(problems) > 4 else ""
    )
    raise errors.BadValue(
      f"mesh {dict(mesh.shape)} cannot shard these parameters evenly: {shown}. Choose mesh "
      "sizes that divide them (or model sizes the mesh divides), or set "
      "mesh.allow_replicated_fallback=True to replicate those dimensions instead."
    )

"""Where the model's parameters live on a device mesh, computed without making any of them.

`jax.eval_shape(init)` gives each parameter's shape and logical axis names; `sharding` turns the
names into NamedShardings on a mesh. Both inference (model/setup.py, restoring parameters alone)
and training (training/train_step.py, which adds the optimizer state) build on these, so the
layout of a parameter is decided once, in the model stage.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from transformer_mt.model.transformer import Transformer
from transformer_mt.runtime import sharding


def init_params(key: jax.Array, model: Transformer) -> Any:
  dummy = jnp.ones((1, 2), jnp.int32)
  return model.init(key, dummy, dummy)["params"]  # boxed with logical axis names


def logical_params(model: Transformer) -> Any:
  """The parameters' abstract arrays, boxed with their logical axis names (nothing computed)."""
  return jax.eval_shape(functools.partial(init_params, model=model), jax.random.key(0))


def param_layout(model: Transformer, mesh: Mesh) -> tuple[Any, Any]:
  """(NamedShardings, sharded ShapeDtypeStructs) of the parameters, from one trace of the
  model's init (each trace costs ~0.2 s for the tiny demo model, seconds for Transformer Big)."""
  boxed = logical_params(model)
  shardings = sharding.logical_shardings(boxed, mesh)
  abstract = jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), nn.unbox(boxed), shardings
  )
  return shardings, abstract


def param_shardings(model: Transformer, mesh: Mesh) -> Any:
  """NamedShardings of the parameters alone (the same as `state_shardings(...).params`)."""
  return param_layout(model, mesh)[0]


def abstract_params(model: Transformer, mesh: Mesh) -> Any:
  """Sharded ShapeDtypeStructs of the parameters: the target for restoring them without
  building an optimizer (inference, averaging)."""
  return param_layout(model, mesh)[1]

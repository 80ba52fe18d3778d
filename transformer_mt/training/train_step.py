"""The train state, born sharded, and the jitted train step over a device mesh.

State creation follows big_vision: `jax.eval_shape(init)` gives the shapes and the
logical axis names, `sharding.logical_shardings` turns those into NamedShardings,
and `jax.jit(init, out_shardings=...)` materializes every parameter and optimizer
slot directly on its shard (no full copy on one device first).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

# The parameter layout lives in the model stage; train_step.param_shardings etc. still name it.
from transformer_mt.model.layout import (  # noqa: F401
  abstract_params,
  init_params,
  logical_params,
  param_shardings,
)
from transformer_mt.model.transformer import Transformer
from transformer_mt.runtime import errors, sharding
from transformer_mt.training import chunked_loss, dropout_rng, losses, optimizer


class NonFiniteError(errors.UserError, RuntimeError):
  """Training stopped on a NaN/Inf loss or gradient (policy train.nonfinite='stop')."""


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []: steps taken, skipped non-finite ones included (see train_step).
  params: Any  # the model's parameters (unboxed).
  opt_state: Any  # optax state, sharded like the params.
  # uint32 [2] (threefry2x32) or [4] (rbg, unsafe_rbg): the dropout key's data under
  # train.prng_impl (dropout_rng.py); step k's dropout key is fold_in(key, k).
  rng: jax.Array


def _create_state(
  key: jax.Array,
  model: Transformer,
  tx: optax.GradientTransformation,
  boxed: bool,
  prng_impl: str = dropout_rng.THREEFRY,
) -> TrainState:
  """Step 0 from the seed's threefry `key`: the parameters from its first half whatever
  `prng_impl` is, the dropout key (of `prng_impl`) from its second."""
  param_key, dropout_key = jax.random.split(key)
  state = _state_around(init_params(param_key, model), dropout_key, tx, prng_impl)
  return state if boxed else nn.unbox(state)


def _state_around(
  params: Any,
  dropout_key: jax.Array,
  tx: optax.GradientTransformation,
  prng_impl: str = dropout_rng.THREEFRY,
):
  """Step 0 of training `params`: a fresh optimizer state and the dropout RNG."""
  return TrainState(
    step=jnp.array(0, jnp.int32),
    params=params,
    opt_state=tx.init(params),
    rng=dropout_rng.initial_key_data(dropout_key, prng_impl),
  )


def logical_state(
  model: Transformer,
  tx: optax.GradientTransformation,
  prng_impl: str = dropout_rng.THREEFRY,
) -> TrainState:
  """The train state's abstract arrays, its parameters boxed with their logical axis names,
  from one trace of its creation (each trace runs the model's init: ~0.2 s for the tiny demo
  model, seconds for Transformer Big). Its `params` are `logical_params(model)`."""
  return jax.eval_shape(
    functools.partial(_create_state, model=model, tx=tx, boxed=True, prng_impl=prng_impl),
    jax.random.key(0),
  )


def state_layout(
  model: Transformer,
  tx: optax.GradientTransformation,
  mesh: Mesh,
  prng_impl: str = dropout_rng.THREEFRY,
  logical: Any = None,
) -> tuple[Any, Any]:
  """(NamedShardings, sharded ShapeDtypeStructs) of every leaf of the train state, from
  `logical_state(model, tx, prng_impl)`: `logical` when the caller has it, else traced here."""
  boxed = logical_state(model, tx, prng_impl) if logical is None else logical
  shardings = sharding.logical_shardings(boxed, mesh)
  abstract = jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), nn.unbox(boxed), shardings
  )
  return shardings, abstract


def state_shardings(
  model: Transformer,
  tx: optax.GradientTransformation,
  mesh: Mesh,
  prng_impl: str = dropout_rng.THREEFRY,
) -> Any:
  """NamedShardings for every leaf of the train state, from its logical axis names."""
  return state_layout(model, tx, mesh, prng_impl)[0]


def create_sharded_state(
  seed: int,
  model: Transformer,
  tx: optax.GradientTransformation,
  mesh: Mesh,
  prng_impl: str = dropout_rng.THREEFRY,
  shardings: Any = None,
) -> TrainState:
  """Initializes the train state directly in its sharded layout; `prng_impl` (a resolved
  train.prng_impl, dropout_rng.py) is the dropout key's implementation. `shardings`: the
  state's (`state_layout`), when the caller has them (otherwise traced again)."""
  init = jax.jit(
    functools.partial(_create_state, model=model, tx=tx, boxed=False, prng_impl=prng_impl),
    out_shardings=state_shardings(model, tx, mesh, prng_impl) if shardings is None else shardings,
  )
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
    return init(jax.random.key(seed))


def sharded_state_from_params(
  params: Any,
  seed: int,
  model: Transformer,
  tx: optax.GradientTransformation,
  mesh: Mesh,
  prng_impl: str = dropout_rng.THREEFRY,
  shardings: Any = None,
) -> TrainState:
  """Step 0 of training given (already sharded) parameters, e.g. an imported model's.

  The same state as `create_sharded_state(seed, ...)` with `params` in place of the random
  ones (the optimizer state and dropout RNG do not depend on the parameter values), but no
  random parameters are ever made: fine-tuning a large model needs no second copy of it.
  `shardings` as in `create_sharded_state`.
  """
  _, dropout_key = jax.random.split(jax.random.key(seed))
  init = jax.jit(
    functools.partial(_state_around, tx=tx, prng_impl=prng_impl),
    out_shardings=state_shardings(model, tx, mesh, prng_impl) if shardings is None else shardings,
  )
  with jax.set_mesh(mesh):
    return init(params, dropout_key)


def _hidden_and_output_layer(module: Transformer, *args, **kwargs):
  """The decoder's final states and the output layer (W, bias): the chunked loss's inputs."""
  return module.hidden_states(*args, **kwargs), module.output_layer()


def _micro_batch_sums(
  params, micro_batch, dropout_key, model, label_smoothing, loss_chunk_tokens=0
):
  """(summed loss, all sums) of one micro-batch: from the model's full float32 logits, or with
  `loss_chunk_tokens` > 0 from its final states, chunk by chunk (training/chunked_loss.py)."""
  outputs = model.apply(
    {"params": params},
    micro_batch["inputs"],
    micro_batch["targets_in"],
    inputs_positions=micro_batch.get("inputs_positions"),
    targets_positions=micro_batch.get("targets_positions"),
    inputs_segmentation=micro_batch.get("inputs_segment_ids"),
    targets_segmentation=micro_batch.get("targets_segment_ids"),
    rngs=None if dropout_key is None else {"dropout": dropout_key},
    method=_hidden_and_output_layer if loss_chunk_tokens else None,
  )
  # Not `> 0`: an imported Marian vocabulary numbers EOS 0 and pads with its last id.
  weights = (micro_batch["targets"] != model.config.pad_id).astype(jnp.float32)
  if loss_chunk_tokens:
    hidden, (weight, bias) = outputs
    sums = chunked_loss.cross_entropy_sums(
      hidden,
      weight,
      bias,
      micro_batch["targets"],
      weights,
      label_smoothing=label_smoothing,
      vocab_size=model.config.output_vocab_size,
      chunk_tokens=loss_chunk_tokens,
      compute_dtype=model.config.compute_dtype,
      row_shards=sharding.batch_shards(),  # the chunk's tokens are each device's
    )
  else:
    sums = losses.cross_entropy_sums(outputs, micro_batch["targets"], weights, label_smoothing)
  return sums["loss"], sums


def train_step(
  state: TrainState,
  batch: dict[str, jax.Array],
  schedule_inputs: dict[str, jax.Array] | None = None,
  *,
  model: Transformer,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  label_smoothing: float,
  inject_nonfinite_at: int = 0,
  loss_chunk_tokens: int = 0,
  prng_impl: str = dropout_rng.THREEFRY,
  optimizer_for: Callable | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update from a batch of [accum_steps, micro_batch, len] arrays.

  Gradients of the summed loss are accumulated over the micro-batches with
  `lax.scan` and divided once by the batch's total number of target tokens, so
  k micro-batches give exactly the gradient of one k-times larger batch.

  A non-finite loss or gradient never reaches the parameters, with the semantics of
  `optax.apply_if_finite`: the step is as if its batch had never been seen by the optimizer.
  Params and the whole optimizer state (Adam's moments, and its and the schedule's counts)
  stay bit-identical, and `metrics["nonfinite"]` is 1; only `state.step` advances, since it
  numbers the batches (checkpoints, logs, the data iterator) and keys the dropout RNG. The
  host then applies the policy (skip and count, or stop). So after k skipped steps the
  optimizer has applied `state.step - k` updates, and the learning rate, both applied and
  logged, is the schedule at that count (`optimizer.updates_applied`), not at `state.step`.
  `inject_nonfinite_at` (> 0) poisons that step's loss with NaN: a fault-injection hook
  for tests and drills. `loss_chunk_tokens` > 0 computes the loss without the full float32
  logits (`train.loss_chunk_tokens`, training/chunked_loss.py); 0 from them. `prng_impl` is
  the implementation `state.rng` was made for (`train.prng_impl`, training/dropout_rng.py).
  `optimizer_for(schedule_inputs)`, when given, makes the (tx, schedule) this step uses in place
  of `tx` and `schedule`, from float32 scalars the step takes as inputs (optimizer.py's
  `schedule_inputs`: trials differing only in them share the compiled step).
  """
  if optimizer_for is not None:
    tx, schedule = optimizer_for(schedule_inputs)
  step_key = dropout_rng.step_key(state.rng, state.step, prng_impl)
  grad_fn = jax.grad(_micro_batch_sums, has_aux=True)

  def accumulate(carry, micro):
    grads_sum, sums_total = carry
    micro_batch, index = micro
    grads, sums = grad_fn(
      state.params,
      micro_batch,
      jax.random.fold_in(step_key, index),
      model,
      label_smoothing,
      loss_chunk_tokens,
    )
    return (jax.tree.map(jnp.add, grads_sum, grads), jax.tree.map(jnp.add, sums_total, sums)), None

  zero_sums = {k: jnp.zeros((), jnp.float32) for k in ("loss", "nll", "correct", "num_tokens")}
  zero_grads = jax.tree.map(jnp.zeros_like, state.params)
  num_micro = jax.tree.leaves(batch)[0].shape[0]
  (grads, sums), _ = jax.lax.scan(
    accumulate, (zero_grads, zero_sums), (batch, jnp.arange(num_micro))
  )
  num_tokens = jnp.maximum(sums["num_tokens"], 1.0)
  if inject_nonfinite_at:
    poison = jnp.where(state.step + 1 == inject_nonfinite_at, jnp.nan, 1.0)
    grads = jax.tree.map(lambda g: g * poison, grads)
    sums = dict(sums, loss=sums["loss"] * poison)
  grads = jax.tree.map(lambda g: g / num_tokens, grads)
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  keep_if_finite = lambda new, old: jax.tree.map(  # noqa: E731
    lambda n, o: jnp.where(finite, n, o), new, old
  )
  params = keep_if_finite(params, state.params)
  opt_state = keep_if_finite(opt_state, state.opt_state)
  metrics = {
    "loss": sums["loss"] / num_tokens,
    "nll": sums["nll"] / num_tokens,
    "accuracy": sums["correct"] / num_tokens,
    "num_tokens": sums["num_tokens"],
    "grad_norm": grad_norm,
    "param_norm": optax.global_norm(params),
    # The rate this update used (the schedule at the optimizer's own count), which is not
    # schedule(state.step) once a non-finite step has been skipped.
    "learning_rate": schedule(optimizer.updates_applied(state.opt_state)),
    "nonfinite": 1.0 - finite.astype(jnp.float32),
  }
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def jit_train_step(
  model: Transformer,
  tx: optax.GradientTransformation,
  schedule: optax.Schedule,
  label_smoothing: float,
  mesh: Mesh,
  shardings: Any,
  inject_nonfinite_at: int = 0,
  loss_chunk_tokens: int = 0,
  prng_impl: str = dropout_rng.THREEFRY,
  optimizer_for: Callable | None = None,
  schedule_inputs: dict[str, Any] | None = None,
) -> Callable:
  """`train_step` compiled with sharded inputs/outputs and the state buffers donated.

  With `optimizer_for` (a function of `schedule_inputs`, as `optimizer.make_optimizer` with
  the train config and d_model bound) the step builds its optimizer from `schedule_inputs`,
  given to the compiled program on every call rather than folded into it; `tx` and `schedule`
  then only describe the state's structure. The returned function takes (state, batch) either
  way."""
  step = functools.partial(
    train_step,
    model=model,
    tx=tx,
    schedule=schedule,
    label_smoothing=label_smoothing,
    inject_nonfinite_at=inject_nonfinite_at,
    loss_chunk_tokens=loss_chunk_tokens,
    prng_impl=prng_impl,
    optimizer_for=optimizer_for,
  )
  batch_sharding = sharding.batch_sharding(mesh, ndim=3, batch_dim=1)
  replicated = sharding.replicated(mesh)
  compiled = jax.jit(
    step,
    in_shardings=(shardings, batch_sharding, replicated),
    out_shardings=(shardings, replicated),
    donate_argnums=0,
  )
  inputs = None
  if optimizer_for is not None:
    inputs = jax.device_put({k: np.float32(v) for k, v in schedule_inputs.items()}, replicated)

  def run(state, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
      return compiled(state, batch, inputs)

  def lower(state, batch):
    """The program `run` compiles for these arguments (jax.stages.Lowered)."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
      return compiled.lower(state, batch, inputs)

  run.lower = lower
  return run


def jit_eval_step(
  model: Transformer, mesh: Mesh, shardings: Any, loss_chunk_tokens: int = 0
) -> Callable:
  """Summed loss/accuracy of a padded [1, batch, len] batch, dropout off.

  Sums (not means) so that batches of different fill add up exactly; the caller
  divides by the total token count. `loss_chunk_tokens` as in `train_step`.
  """
  eval_model = model.clone(config=model.config.replace(deterministic=True))

  def eval_step(params, batch):
    micro = jax.tree.map(lambda x: x[0], batch)
    _, sums = _micro_batch_sums(params, micro, None, eval_model, 0.0, loss_chunk_tokens)
    return sums

  compiled = jax.jit(
    eval_step,
    in_shardings=(shardings.params, sharding.batch_sharding(mesh, ndim=3, batch_dim=1)),
    out_shardings=sharding.replicated(mesh),
  )

  def run(params, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
      return compiled(params, batch)

  def lower(params, batch):
    """The program `run` compiles for these arguments (jax.stages.Lowered)."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
      return compiled.lower(params, batch)

  run.lower = lower
  return run

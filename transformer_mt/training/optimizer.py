"""The paper's optimizer: Adam(0.9, 0.98, 1e-9) with inverse-square-root warmup (eq. 3).

`train.schedule='cosine'` keeps the warm-up and its peak but then decays the learning rate
along a cosine to zero at `train.num_steps`, instead of as step^-0.5. A run of a few hundred
steps (tatoeba_deen on 2 CPU cores) ends on the inverse square root at ~70% of its peak; the
decay ends it near zero, which is what averaging checkpoints approximates on long runs.

Plain SGD (`train.optimizer='sgd'`) takes the same schedule. Its update is linear in the
gradient, so a wrong gradient scale (a missing 1/N, a shard counted twice) shows in the
parameters at once, where Adam's normalisation would hide it: the equivalence tests
(1 vs 8 devices, 2 processes vs 1) train with it for that reason.

The schedule's scale and warm-up (`train.lr_scale`, `train.warmup_steps`: what a sweep varies
most, experiments/demo.py's grid) reach the compiled train step as inputs (`schedule_inputs`),
not as constants folded into it: the trials of such a sweep compile one train step, the first
trial's, and the others read it from the persistent compilation cache. The cosine schedule's
warm-up and length stay constants (optax builds its pieces from Python numbers).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from transformer_mt.runtime import errors

OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("rsqrt", "cosine")


def paper_learning_rate(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

  Optax passes the number of updates already applied (0 for the first update), so
  the schedule evaluates the formula at count + 1: the first update uses step 1.
  """
  _check_warmup(warmup_steps)
  return _rsqrt(d_model, np.float32(warmup_steps), np.float32(scale))


def _check_warmup(warmup_steps: int) -> None:
  if warmup_steps <= 0:
    raise errors.BadValue(f"warmup_steps must be positive, got {warmup_steps}")


def _rsqrt(d_model: int, warmup_steps: jax.typing.ArrayLike, scale: jax.typing.ArrayLike):
  """The paper's formula on float32 `warmup_steps` and `scale`, Python or traced (the same
  operations either way, so the step's rate and the host's agree to the bit)."""

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    warmup = jnp.asarray(warmup_steps, jnp.float32)
    rate = jnp.minimum(step**-0.5, step * warmup**-1.5)
    return jnp.asarray(scale, jnp.float32) * (d_model**-0.5 * rate)

  return schedule


def cosine_learning_rate(
  d_model: int, warmup_steps: int, num_steps: int, scale: jax.typing.ArrayLike = 1.0
) -> optax.Schedule:
  """The paper's linear warm-up to the same peak, scale * d_model^-0.5 * warmup^-0.5 at
  `warmup_steps`, then a half cosine down to 0 after step `num_steps` (optax's
  warmup_cosine_decay_schedule); step counted from 1, as in `paper_learning_rate`, so the last
  update still moves the parameters."""
  _check_warmup(warmup_steps)
  if num_steps <= warmup_steps:
    raise errors.BadValue(
      f"train.schedule='cosine' decays after the warm-up, so train.num_steps ({num_steps}) must "
      f"be larger than train.warmup_steps ({warmup_steps}); lower warmup_steps or use 'rsqrt'."
    )
  unit_peak = d_model**-0.5 * warmup_steps**-0.5  # the peak at scale 1
  # optax's schedule is `warmup_steps` long from count 0 = step 0 (value 0) and reaches 0 again
  # at count num_steps + 1; evaluated at count + 1, step s gets peak * s / warmup in the warm-up.
  cosine = optax.warmup_cosine_decay_schedule(0.0, unit_peak, warmup_steps, num_steps + 1, 0.0)
  # `scale` (Python or traced) multiplies the unit-peak curve: optax's own schedule compares
  # its peak with 0 in Python, which a traced peak cannot do.
  return lambda count: jnp.asarray(scale, jnp.float32) * cosine(jnp.asarray(count) + 1)


def schedule_inputs(train_config: ml_collections.ConfigDict) -> dict[str, np.float32]:
  """The settings the compiled train step takes as inputs (see the module docstring)."""
  return {
    "lr_scale": np.float32(train_config.lr_scale),
    "warmup_steps": np.float32(train_config.warmup_steps),
  }


def learning_rate(
  train_config: ml_collections.ConfigDict,
  d_model: int,
  inputs: dict[str, jax.typing.ArrayLike] | None = None,
) -> optax.Schedule:
  """`train.schedule`'s learning rate: "rsqrt" (the paper's) or "cosine". `inputs` (as
  `schedule_inputs` makes them, traced inside the train step) replace the config's values."""
  if train_config.schedule not in SCHEDULES:
    raise errors.BadValue(
      f"train.schedule={train_config.schedule!r} is not one of "
      f"{', '.join(map(repr, SCHEDULES))}; set train.schedule='rsqrt' (the paper's) or 'cosine'."
    )
  inputs = schedule_inputs(train_config) if inputs is None else inputs
  if train_config.schedule == "cosine":
    return cosine_learning_rate(
      d_model, train_config.warmup_steps, train_config.num_steps, inputs["lr_scale"]
    )
  _check_warmup(train_config.warmup_steps)  # the config's: `inputs` may be traced
  return _rsqrt(d_model, inputs["warmup_steps"], inputs["lr_scale"])


def optimizer_name(train_config: ml_collections.ConfigDict) -> str:
  """`train.optimizer`, checked (a config saved before the field existed reads back with its
  default, "adam": `checkpointing.read_config` completes it)."""
  name = train_config.optimizer
  if name not in OPTIMIZERS:
    raise errors.BadValue(
      f"train.optimizer={name!r} is not one of {', '.join(map(repr, OPTIMIZERS))}; "
      "set train.optimizer='adam' (the paper's) or 'sgd' (plain gradient descent)."
    )
  return name


def make_optimizer(
  train_config: ml_collections.ConfigDict,
  d_model: int,
  inputs: dict[str, jax.typing.ArrayLike] | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Adam (or plain SGD) with `train.schedule`'s learning rate, optionally after global-norm
  clipping. `inputs`: as in `learning_rate`; the optimizer state's structure does not depend on
  them, so a state made with one optimizer is updated by the other."""
  schedule = learning_rate(train_config, d_model, inputs)
  if optimizer_name(train_config) == "sgd":
    update = optax.sgd(schedule)  # params -= lr(step) * grad: no momentum, no normalisation
  else:
    update = optax.adam(
      schedule, b1=train_config.adam_b1, b2=train_config.adam_b2, eps=train_config.adam_eps
    )
  if train_config.grad_clip_norm and train_config.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(train_config.grad_clip_norm), update), schedule
  return update, schedule


def updates_applied(opt_state: Any) -> jax.Array:
  """int32 []: the updates the optimizer has applied, i.e. the count its schedule is at.

  It is the count of the schedule inside `make_optimizer`'s Adam or SGD (optax's
  ScaleByScheduleState; Adam's bias-correction count advances with it). It equals the
  train state's step unless a non-finite step was skipped (train.nonfinite='skip'): a skipped
  step advances the step but not this count, so the learning rate applied, and logged, is
  `schedule(updates_applied(opt_state))`.
  """
  found = [
    leaf.count
    for leaf in jax.tree.leaves(
      opt_state, is_leaf=lambda node: isinstance(node, optax.ScaleByScheduleState)
    )
    if isinstance(leaf, optax.ScaleByScheduleState)
  ]
  if len(found) != 1:
    raise ValueError(f"Expected one schedule count in the optimizer state, found {len(found)}.")
  return found[0]

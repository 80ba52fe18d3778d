"""The search of a hyperparameter sweep: the space (a grid of values and distributions per config
key), how Optuna searches it (the sampler), when it stops a trial early (the pruner), the trial
budget and the metric.

Experiment files (the config stage) declare their sweep with these, in a `get_sweep()`:

    def get_sweep():
      return Sweep(random={"train.lr_scale": log_uniform(0.1, 2.0)}, sampler="tpe",
                   pruner="asha", num_trials=12, seed=0)

so they live below training, which builds Optuna's sampler and pruner from them
(training/sweep_study.py) and runs the trials (training/sweep.py).

`sampler="grid"` and `"random"` keep the sweeps of before Optuna, trial for trial: the grid's
points, each crossed with `num_random` seeded draws of the random keys, in that order. Trial i
of the study takes the i-th of that list; the budget is its length.
Every other sampler is Optuna's own, seeded with `seed`, over the grid keys as categorical
choices and the distributions as ranges, for `num_trials` trials.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np

from transformer_mt.runtime import errors

# --metric / Sweep.metric -> the direction Optuna optimizes it in.
METRIC_DIRECTIONS = {"bleu": "maximize", "chrf": "maximize", "loss": "minimize"}
FIXED_SAMPLERS = ("grid", "random")
OPTUNA_SAMPLERS = ("tpe", "qmc")
PRUNERS = ("none", "median", "asha", "hyperband")


@dataclasses.dataclass(frozen=True)
class Distribution:
  """A random-search distribution: uniform, log-uniform, a random integer or a choice."""

  kind: str
  low: float = 0.0
  high: float = 1.0
  choices: tuple = ()

  def sample(self, rng: np.random.Generator):
    if self.kind == "uniform":
      return float(rng.uniform(self.low, self.high))
    if self.kind == "log_uniform":
      return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
    if self.kind == "int":
      return int(rng.integers(self.low, self.high + 1))
    if self.kind == "choice":
      return self.choices[int(rng.integers(len(self.choices)))]
    raise errors.BadValue(
      f"Unknown distribution {self.kind!r}: use uniform, log_uniform, int or choice."
    )


def uniform(low: float, high: float) -> Distribution:
  return Distribution("uniform", low, high)


def log_uniform(low: float, high: float) -> Distribution:
  if low <= 0:
    raise errors.BadValue(f"log_uniform({low}, {high}) needs low > 0.")
  return Distribution("log_uniform", low, high)


def randint(low: int, high: int) -> Distribution:
  """An integer in [low, high], both included."""
  return Distribution("int", low, high)


def choice(*choices) -> Distribution:
  return Distribution("choice", choices=tuple(choices))


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A sweep's space, search, budget and metric.

  Attributes:
    grid: key -> list of values (categorical choices for Optuna's samplers).
    random: key -> Distribution.
    num_random: draws per grid point, for sampler "random" (the random search of before).
    seed: the draws' seed, and the Optuna sampler's.
    sampler: "grid" or "random" (the fixed list of `trials()`), "tpe" or "qmc" (Optuna's);
      by default "random" when there are random keys, else "grid". `sampler_settings` go to
      Optuna's sampler. TPE's random start-up trials default to a third of the budget (2 to
      10): Optuna's 10 would leave a budget of 10 or fewer trials all random.
    pruner: "none", "median", "asha" (successive halving) or "hyperband", with
      `pruner_settings` passed to Optuna's pruner (e.g. {"min_resource": 100}, in steps).
    num_trials: the trial budget of an Optuna sampler (grid/random: the list's length).
    metric: what a trial is judged by, at each validation and at its end: "bleu", "chrf"
      (validation BLEU/chrF, every train.bleu_every steps) or "loss" (validation loss, every
      train.eval_every steps).
  """

  grid: dict[str, list] = dataclasses.field(default_factory=dict)
  random: dict[str, Distribution] = dataclasses.field(default_factory=dict)
  num_random: int = 0
  seed: int = 0
  sampler: str = ""
  sampler_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
  pruner: str = "none"
  pruner_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
  num_trials: int = 0
  metric: str = "bleu"

  @property
  def sampler_name(self) -> str:
    return self.sampler or ("random" if self.random else "grid")

  @property
  def direction(self) -> str:
    return METRIC_DIRECTIONS[self.metric]

  def check(self) -> None:
    """One line naming what is wrong, before any trial runs."""
    name = self.sampler_name
    if name not in FIXED_SAMPLERS + OPTUNA_SAMPLERS:
      raise errors.BadValue(
        f"Sweep sampler {name!r} is not known: use one of "
        f"{', '.join(FIXED_SAMPLERS + OPTUNA_SAMPLERS)}."
      )
    if self.pruner not in PRUNERS:
      raise errors.BadValue(
        f"Sweep pruner {self.pruner!r} is not known: use one of {', '.join(PRUNERS)}."
      )
    if self.metric not in METRIC_DIRECTIONS:
      raise errors.BadValue(
        f"Sweep metric {self.metric!r} is not known: use one of {', '.join(METRIC_DIRECTIONS)}."
      )
    if not self.grid and not self.random:
      raise errors.BadValue("A sweep needs at least one key in grid or random.")
    if name in OPTUNA_SAMPLERS and self.num_trials < 1:
      raise errors.BadValue(f"Sweep sampler {name!r} needs a budget: num_trials >= 1.")
    if name in FIXED_SAMPLERS and self.num_trials:
      raise errors.BadValue(
        f"Sweep sampler {name!r} runs the {len(self.trials())} trials of its list: leave "
        "num_trials at 0."
      )

  def budget(self) -> int:
    return len(self.trials()) if self.sampler_name in FIXED_SAMPLERS else self.num_trials

  def trials(self) -> list[dict[str, Any]]:
    """Each trial's {key: value}, in a fixed order: grid points, each with its random draws."""
    if self.random and self.num_random < 1:
      raise errors.BadValue("A sweep with random keys needs num_random >= 1 draws.")
    keys = list(self.grid)
    points = [dict(zip(keys, values)) for values in itertools.product(*self.grid.values())]
    rng = np.random.default_rng(self.seed)
    trials = []
    for point in points:
      for _ in range(self.num_random if self.random else 1):
        trials.append(dict(point, **{k: d.sample(rng) for k, d in self.random.items()}))
    return trials

  def describe(self) -> dict[str, Any]:
    """The sweep as JSON, recorded in ROOT/sweep.json: a changed sweep is refused there."""
    return {
      "grid": {k: list(v) for k, v in self.grid.items()},
      "random": {
        k: dict(dataclasses.asdict(d), choices=list(d.choices)) for k, d in self.random.items()
      },
      "num_random": self.num_random,
      "seed": self.seed,
      "sampler": self.sampler_name,
      "sampler_settings": dict(self.sampler_settings),
      "pruner": self.pruner,
      "pruner_settings": dict(self.pruner_settings),
      "num_trials": self.budget(),
      "metric": self.metric,
    }

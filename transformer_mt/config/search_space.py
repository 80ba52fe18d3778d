"""The search space of a hyperparameter sweep: a grid of values and random distributions per
config key, expanded into a fixed list of trials.

Experiment files (the config stage) declare their sweep with these, in a `get_sweep()`:

    def get_sweep():
      return Sweep(grid={"train.lr_scale": [0.5, 1.0], "train.warmup_steps": [250, 500]},
                   random={"model.dropout_rate": uniform(0.0, 0.3)}, num_random=2, seed=0)

so they live below training, which runs the trials (training/sweep.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np

from transformer_mt.runtime import errors


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
  """A grid (key -> list of values) and/or random search (key -> Distribution) with a seed."""

  grid: dict[str, list] = dataclasses.field(default_factory=dict)
  random: dict[str, Distribution] = dataclasses.field(default_factory=dict)
  num_random: int = 0
  seed: int = 0

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

"""Timing helpers shared by the benchmarks: wall time of jitted calls, and the matmul peak.

JAX dispatches asynchronously, so every timed call ends in `jax.block_until_ready`;
the first calls (compilation, allocator warm-up) are run but not timed. On a shared
machine the best of several repetitions is the least noisy estimate of what the
code can do, the median of what it did; both are returned. The process's CPU time per
call (all threads) is returned too: other processes on the machine stretch wall time
but hardly the CPU time of the work itself, so ratios of CPU-time rates stay meaningful
when the machine is busy.
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Timing:
  """Seconds per call over the timed repetitions."""

  best: float
  median: float
  cpu: float  # least CPU seconds (user + system, all threads) of one call
  reps: int

  def rate(self, amount: float) -> float:
    """`amount` per second at the best time (e.g. tokens/s, FLOP/s)."""
    return amount / self.best

  def cpu_rate(self, amount: float) -> float:
    """`amount` per CPU-second of this process."""
    return amount / self.cpu


def _cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def time_calls(call: Callable[[], Any], warmup: int = 1, reps: int = 5) -> Timing:
  """Times `call()` (which must return the arrays it computed) after `warmup` untimed calls.

  `call` may carry state between calls itself (e.g. a train step closing over its state).
  """
  for _ in range(warmup):
    jax.block_until_ready(call())
  seconds, cpu_seconds = [], []
  for _ in range(reps):
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    jax.block_until_ready(call())
    seconds.append(time.perf_counter() - start)
    cpu_seconds.append(_cpu_seconds() - cpu_start)
  return Timing(
    best=min(seconds), median=statistics.median(seconds), cpu=min(cpu_seconds), reps=reps
  )


def matmul_peak(size: int = 2048, dtype: Any = jnp.float32, reps: int = 5) -> tuple[float, float]:
  """(FLOP/s, FLOP per CPU-second) of one jitted [size, size] x [size, size] matmul, best
  of `reps`.

  The denominator of "fraction of peak": what this machine's XLA backend achieves on
  the most favourable kernel it has, not a datasheet number.
  """
  a = jax.random.normal(jax.random.key(0), (size, size), dtype)
  b = jax.random.normal(jax.random.key(1), (size, size), dtype)
  matmul = jax.jit(jnp.matmul)
  timing = time_calls(lambda: matmul(a, b), warmup=2, reps=reps)
  return timing.rate(2.0 * size**3), timing.cpu_rate(2.0 * size**3)


def hardware_has_bf16() -> bool:
  """bf16 matmuls are worth timing: accelerators, and CPUs with AVX512-BF16 / AMX."""
  if jax.default_backend() != "cpu":
    return True
  try:
    with open("/proc/cpuinfo") as f:
      flags = f.read()
  except OSError:
    return False
  return "avx512_bf16" in flags or "amx_bf16" in flags

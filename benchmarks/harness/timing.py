"""Timing shared by every benchmark: wall and CPU time of jitted calls, the matmul peak, and
the machine's description (CPU model, load) printed beside the figures.

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
import os
import pathlib
import platform
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


def cpu_seconds() -> float:
  """User + system seconds of this process so far, all threads."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def time_calls(call: Callable[[], Any], warmup: int = 1, reps: int = 5) -> Timing:
  """Times `call()` (which must return the arrays it computed) after `warmup` untimed calls.

  `call` may carry state between calls itself (e.g. a train step closing over its state).
  """
  for _ in range(warmup):
    jax.block_until_ready(call())
  seconds, cpu_used = [], []
  for _ in range(reps):
    start, cpu_start = time.perf_counter(), cpu_seconds()
    jax.block_until_ready(call())
    seconds.append(time.perf_counter() - start)
    cpu_used.append(cpu_seconds() - cpu_start)
  return Timing(best=min(seconds), median=statistics.median(seconds), cpu=min(cpu_used), reps=reps)


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


def cpu_name() -> str:
  """The CPU model, as /proc/cpuinfo names it."""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def machine_line() -> str:
  """One line for the head of a benchmark's output: CPU, cores, 1-minute load, JAX's device."""
  device = jax.devices()[0]
  return (
    f"machine: {cpu_name()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
    f"jax {jax.__version__} on {device.device_kind} ({device.platform})"
  )

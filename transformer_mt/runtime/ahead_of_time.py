"""Every program of a run compiled once, ahead of time, in threads beside the run.

A JAX run pays for each new program (a jitted function at new shapes) once, at its first call.
Paid at the call, the loop stops there: on a GPU the first validation of the Multi30k row
stopped for over a minute while `ptxas` compiled its eval and decode programs one after the
other. A command that knows which programs it will run lists them up front instead
(`Programs.add`, a name and how to lower the program from abstract arguments), and they compile
in threads: `jax.jit(f).lower(...).compile()` fills the same in-memory caches a call would, so
the later calls of those shapes (same avals, same shardings) find the executable and do not
compile again. Tracing holds the GIL, XLA's compilation does not, so compilations overlap
each other and the steps.

The train step is compiled first (the loop's first step needs it); the others start when it is
done, `workers` at a time, while the first steps run. A caller that is about to run a program
calls `wait(name)` first, so it never starts a second compilation of a program already under
way; the seconds it waits there after the loop's first step are what this module exists to
drive to zero, and `summary()` reports them with each program's compile seconds.

A program that fails to compile raises in the caller that waits for it, with its traceback.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

# Returns a jax.stages.Lowered (e.g. `lambda: jitted.lower(*abstract_args)`).
Lowering = Callable[[], Any]


def default_workers() -> int:
  """Compilations at once after the first: half the host's cores (the other half runs the
  steps), at least one."""
  return max(1, (os.cpu_count() or 2) // 2)


class Programs:
  """Named programs compiled ahead, each once; `wait(name)` blocks until one is ready.

  Use as a context manager (or call `close`) so the threads end with the run."""

  def __init__(self, workers: int | None = None):
    self._workers = workers or default_workers()
    self._first: Future | None = None  # the program the others start after
    self._queued: list[tuple[str, Lowering]] = []
    self._futures: dict[str, Future] = {}
    self._seconds: dict[str, float] = {}
    self._lock = threading.Lock()
    self._pool: ThreadPoolExecutor | None = None
    self._started = False
    self._closed = False
    self.waited_s = 0.0  # seconds `wait` blocked after `loop_started`
    self._loop_started = False
    self.late: list[str] = []  # programs first listed after `loop_started`: missed ahead

  def __enter__(self) -> Programs:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def add(self, name: str, lower: Lowering, first: bool = False) -> None:
    """Lists the program `name` (a second `add` of a name is ignored: one program, one
    compilation). `first`: compile it now, on a thread of its own, and start the others only
    when it is done; otherwise it waits for `start`."""
    if name in self._futures:
      return
    if self._loop_started:
      self.late.append(name)
    future: Future = Future()
    self._futures[name] = future
    if first:
      self._first = future
      threading.Thread(
        target=self._compile, args=(name, lower, future), name=f"compile {name}", daemon=True
      ).start()
    elif self._started:
      self._submit(name, lower, future)
    else:
      self._queued.append((name, lower))

  def start(self) -> None:
    """Starts compiling the listed programs (after the `first` one, if any)."""
    self._started = True
    queued, self._queued = self._queued, []

    def submit_all(_=None):
      for name, lower in queued:
        self._submit(name, lower, self._futures[name])

    if self._first is not None and not self._first.done():
      self._first.add_done_callback(submit_all)
    else:
      submit_all()

  def _submit(self, name: str, lower: Lowering, future: Future) -> None:
    with self._lock:
      if self._closed:  # the run ended before this program was needed
        future.cancel()
        return
      if self._pool is None:
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="compile")
      self._pool.submit(self._compile, name, lower, future)

  def _compile(self, name: str, lower: Lowering, future: Future) -> None:
    start = time.perf_counter()
    try:
      lower().compile()
    except BaseException as error:  # re-raised in the caller that waits for it
      future.set_exception(error)
      return
    self._seconds[name] = time.perf_counter() - start
    future.set_result(None)

  def wait(self, name: str) -> bool:
    """Blocks until the program `name` is compiled; False if it was never listed (the call
    then compiles it itself, on the caller's path)."""
    future = self._futures.get(name)
    if future is None:
      logging.debug("Program %s was not compiled ahead.", name)
      return False
    if not self._started:
      self.start()
    start = time.perf_counter()
    try:
      future.result()  # raises a failed compilation here
    finally:
      if self._loop_started:
        self.waited_s += time.perf_counter() - start
    return True

  def loop_started(self) -> None:
    """From now on the seconds `wait` blocks are counted (the loop's first step is done)."""
    self._loop_started = True

  def summary(self) -> dict[str, Any]:
    """{"programs": {name: compile seconds} of those done, "compile_s": their sum,
    "waited_after_first_step_s": `waited_s`, "late": the programs listed only after the
    loop's first step (a run's list missed them)}."""
    seconds = {n: self._seconds[n] for n in self._futures if n in self._seconds}
    return {
      "programs": seconds,
      "compile_s": sum(seconds.values()),
      "waited_after_first_step_s": self.waited_s,
      "late": list(self.late),
    }

  def describe(self) -> str:
    """One line: the programs, their compile seconds and the loop's wait after step 1."""
    summary = self.summary()
    each = ", ".join(f"{n} {s:.1f} s" for n, s in summary["programs"].items())
    late = f"; listed late: {', '.join(summary['late'])}" if summary["late"] else ""
    return (
      f"Compiled ahead {len(summary['programs'])} programs in {summary['compile_s']:.1f} s "
      f"({each}); the loop waited {summary['waited_after_first_step_s']:.1f} s for "
      f"compilation after its first step{late}."
    )

  def close(self) -> None:
    """Drops the compilations not started and lets the threads end after those under way,
    without waiting for them: a run that stopped early (preempted, pruned) needs none of
    them."""
    with self._lock:
      self._closed = True
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)

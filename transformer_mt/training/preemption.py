"""Stopping training on SIGTERM/SIGINT (preemption, Ctrl-C): after a step that every process
agrees on, which is then checkpointed before the process exits with status 0."""

from __future__ import annotations

import signal
import threading

import jax

from transformer_mt.runtime import distributed


class StopOnSignal:
  """Turns SIGTERM/SIGINT (preemption, Ctrl-C) into a stop after a step, which is then
  checkpointed before the process exits with status 0 (`stop_after`, asked after each step).

  One process: a Python handler sets a flag, and the loop stops after the current step.

  Several processes must all stop at the same step (each saves its shards of that step's
  checkpoint), and soon: SLURM sends SIGKILL ~120 s after SIGTERM, to one task or to all, while
  a log step may be 100 steps away. They agree through JAX's preemption sync point
  (`multihost_utils.reached_preemption_sync_point`): `jax.distributed.initialize` starts a
  notifier that catches SIGTERM itself (a C handler), the coordination service tells every
  process, and they settle in the background on the furthest step any has reached, plus one. The
  loop asks it at every step, and asking is a local check, not a host sync: an all-gather of the
  flag at every step would stall JAX's asynchronous dispatch once per step. So wherever that
  notifier runs (also in a one-process `jax.distributed` run) no Python SIGTERM handler is
  installed, here or by the writer lock (workdir/lock.py), since it would replace JAX's: a
  SIGTERM to any process, process 0 included, and to all at once, goes to JAX. SIGINT is
  re-raised as SIGTERM for JAX's notifier. The steps JAX is told are counted from this run's
  first step: its count starts at 0 and the sync point must be met exactly, so a notice during
  setup (count 0) is met at the first step, where a resumed run's own step numbers would run
  past it. A SIGTERM before the loop therefore stops the run after its first step, and after the
  loop JAX's handler stays: a SIGTERM during the final evaluation is ignored (SIGKILL follows),
  and the writer lock is released by the normal exit. With the preemption service off
  (`jax_enable_preemption_service=False`) the processes agree at log steps, by an all-gather of
  their flags.
  """

  def __init__(self, first_step: int = 0):
    self.received, self.name, self._previous = False, None, {}
    self._first_step = first_step  # the step this run resumed from
    self._jax_sync = distributed.preemption_sync_available()

  def _handle(self, signum, frame):
    self.received, self.name = True, signal.Signals(signum).name

  def _forward_to_jax(self, signum, frame):
    self._handle(signum, frame)
    signal.raise_signal(signal.SIGTERM)  # caught by JAX's preemption notifier

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      if self._jax_sync:
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._forward_to_jax)
      else:
        for signum in (signal.SIGTERM, signal.SIGINT):
          self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def stop_after(self, step: int, log_step: bool) -> bool:
    """Whether to checkpoint `step` and stop; the same answer on every process."""
    if self._jax_sync:
      return distributed.reached_preemption_sync_point(step - self._first_step)
    if jax.process_count() == 1:
      return self.received
    return log_step and distributed.any_process(self.received)

  def describe(self) -> str:
    if self._jax_sync:
      return "a preemption notice (SIGTERM or SIGINT to one of the processes)"
    return self.name or "a signal to another process"

  def __exit__(self, *exc):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

"""Process entry of `run.py` and the `transformer-mt` script: host allocator settings, then the CLI.

Why the allocator: XLA's CPU runtime allocates each step's temporaries as one block and frees
it when the step ends. glibc hands a block that large to `mmap`, and worker threads allocate
from per-thread arenas that give their memory back after every free, so every step faults its
buffers in afresh (for the demo, a third of a step's CPU time went to system time). With one
arena that keeps what it frees and serves large blocks from the heap, steps take no such faults
and give bit-identical results (allocation never changes the arithmetic); CHANGELOG.md gives
what the settings did to the page faults (0.16-0.28x those of glibc's defaults).

Those settings are glibc tunables, read only when a process starts, so the command re-executes
itself once with `GLIBC_TUNABLES` set (the same pid, so `timeout`, SLURM and signals see one
process). A `GLIBC_TUNABLES` already in the environment, even empty, is left as it is and
nothing is re-executed: `GLIBC_TUNABLES= python run.py ...` runs with glibc's defaults. Non-glibc
systems (macOS, musl) are left alone too. The cost is host memory the process keeps until it
exits instead of returning between steps.

Python's cyclic garbage collector is also set here to run less often (`collect_less_often`).
"""

from __future__ import annotations

import gc
import os
import sys

# One arena; never trim the heap; serve blocks of up to 4 GiB from it instead of from mmap.
GLIBC_TUNABLES = (
  "glibc.malloc.arena_max=1:glibc.malloc.trim_threshold=4294967295"
  ":glibc.malloc.mmap_threshold=4294967295"
)


def uses_glibc() -> bool:
  try:
    return bool(os.confstr("CS_GNU_LIBC_VERSION"))
  except (ValueError, OSError, AttributeError):
    return False


def reexec_with_allocator_settings() -> None:
  """Replaces this process by the same command with GLIBC_TUNABLES set, once; else returns."""
  if "GLIBC_TUNABLES" in os.environ or not sys.platform.startswith("linux") or not uses_glibc():
    return
  env = dict(os.environ, GLIBC_TUNABLES=GLIBC_TUNABLES)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, env)


# Python's default gen-0 threshold is 700 allocations. Tracing a model for jax.jit allocates
# millions of short-lived objects, so the collector ran thousands of times per command and
# took ~7% of a tiny `run.py train` (1.3 of 19 s, AMD EPYC); at 10,000 (the older generations'
# ratios kept) it ran 38 times in 0.4 s. Reference cycles then live a little longer.
GC_THRESHOLDS = (10_000, 10, 10)


def collect_less_often() -> None:
  """Raises the cyclic garbage collector's thresholds to GC_THRESHOLDS."""
  gc.set_threshold(*GC_THRESHOLDS)

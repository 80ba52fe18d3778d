"""A persistent JAX compilation cache for every `run.py` command.

Each translate/evaluate process compiles each decoder program once (ahead_of_time.py; seconds
each on CPU), and without a cache every new process pays that again. With the cache, a later process
loads the compiled programs from disk instead (docs/performance.md, "Compilation cache", has the
figures).

Where the cache lives:
  - `JAX_COMPILATION_CACHE_DIR`, when set, is JAX's own setting and wins: JAX reads it at import
    and this module leaves it (and every other JAX cache setting) alone. Set it to the empty
    string to run without a cache.
  - otherwise `$XDG_CACHE_HOME/transformer_mt/jax`, by default `~/.cache/transformer_mt/jax`.
  - `JAX_ENABLE_COMPILATION_CACHE=false` (JAX's own switch) turns the cache off too.
A directory that cannot be created or written is reported with one warning and the command runs
without a cache.

Several processes and hosts may share the directory (e.g. a home on NFS): an entry is one file
named by a hash of the program, its compile options, the XLA flags, the jax/XLA versions and the
device topology (on CPU this includes the instruction set), so machines with different hardware
never load each other's programs; JAX writes entries only from process 0 of a multi-process run,
so a job's processes never write the same file at once (the other hosts read what process 0
wrote where the directory is shared, and recompile as before where it is not). A file that fails
to load (e.g. one read while another job writes it) is a warning and a recompile, not an error.
The cache grows without bound unless `JAX_COMPILATION_CACHE_MAX_SIZE` (bytes) caps it; deleting
the directory is always safe.
"""

from __future__ import annotations

import logging
import os
import tempfile

# The smallest compile time worth an entry (unless JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS is
# set). JAX's default, 1 s, would miss decode programs that compile in just under that on a fast
# machine; tiny programs (seeding, staging) load no faster than they compile.
MIN_COMPILE_TIME_SECS = 0.2


def default_cache_dir() -> str:
  """`$XDG_CACHE_HOME/transformer_mt/jax`; a relative XDG_CACHE_HOME is ignored, as the XDG spec
  asks."""
  base = os.environ.get("XDG_CACHE_HOME", "")
  if not os.path.isabs(base):
    base = os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "transformer_mt", "jax")


def _writable(path: str) -> bool:
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError:
    return False
  return True


def enable() -> str | None:
  """Points JAX's persistent compilation cache at the user's cache directory, before any
  compilation; returns the directory in use, or None when there is no cache."""
  import jax

  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return os.environ["JAX_COMPILATION_CACHE_DIR"] or None
  if not jax.config.jax_enable_compilation_cache:
    return None
  path = default_cache_dir()
  if not _writable(path):
    logging.warning(
      "Compilation cache directory %s is not writable; running without a compilation cache.",
      path,
    )
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_SECS)
  return path

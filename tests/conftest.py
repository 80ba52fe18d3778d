"""Test setup: 8 simulated CPU devices (unless XLA_FLAGS already asks for a count), no
compilation cache in the user's cache directory, and the repository root on sys.path, so the
tests also run from a checkout that is not installed."""

import os
import pathlib
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()

# Tests never write the user's compilation cache (compile_cache.py): an empty directory turns the
# cache off, in this process and in the run.py processes tests start. CI sets a temporary one.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "")

_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

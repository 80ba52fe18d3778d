"""The launcher's allocator settings: re-executed once with GLIBC_TUNABLES, never over a user's
own. That they remove the page faults of XLA's large per-call temporaries depends on the load
and is not asserted here (CHANGELOG.md: benchmarks/page_faults.py measured it)."""

import os
import subprocess
import sys

import pytest

from transformer_mt.runtime import allocator as launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(
  not (sys.platform.startswith("linux") and launch.uses_glibc()), reason="glibc tunables only"
)

# Prints its pid and the GLIBC_TUNABLES it runs with, re-executed first in "launch" mode.
CHILD = """
import os, sys
from transformer_mt.runtime import allocator as launch
if sys.argv[1] == "launch":
  launch.reexec_with_allocator_settings()
print(os.getpid(), os.environ.get("GLIBC_TUNABLES"))
"""


def run_child(mode, **env_changes):
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  env.update(env_changes, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  child = subprocess.Popen(
    [sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT
  )
  out, _ = child.communicate(timeout=300)
  assert child.returncode == 0
  pid, tunables = out.split()
  return int(pid), child.pid, tunables


def test_reexec_sets_tunables_in_the_same_process():
  pid, child_pid, tunables = run_child("launch")
  assert tunables == launch.GLIBC_TUNABLES
  assert pid == child_pid  # exec, not a new process: signals and exit codes go to one pid
  _, _, plain_tunables = run_child("plain")
  assert plain_tunables == "None"


def test_a_users_own_tunables_are_kept():
  _, _, tunables = run_child("launch", GLIBC_TUNABLES="glibc.malloc.arena_max=2")
  assert tunables == "glibc.malloc.arena_max=2"


def test_the_entry_point_collects_garbage_less_often(monkeypatch):
  """run.py raises the cyclic collector's thresholds before the command runs."""
  import gc

  from transformer_mt import __main__ as entry
  from transformer_mt import cli

  before = gc.get_threshold()
  seen = []
  monkeypatch.setattr(entry, "reexec_with_allocator_settings", lambda: None)
  monkeypatch.setattr(cli, "main", lambda: seen.append(gc.get_threshold()) or 0)
  gc.set_threshold(700, 10, 10)  # Python's defaults (the test process may have raised them)
  try:
    assert entry.main() == 0
  finally:
    gc.set_threshold(*before)
  assert seen == [launch.GC_THRESHOLDS]

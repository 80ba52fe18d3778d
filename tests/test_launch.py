"""The launcher's allocator settings: re-executed once with GLIBC_TUNABLES, never over a user's
own, and they remove the page faults of XLA's large per-call temporaries."""

import os
import subprocess
import sys

import pytest

from transformer_mt import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(
  not (sys.platform.startswith("linux") and launch.uses_glibc()), reason="glibc tunables only"
)

# Jits a function whose temporaries are 16 MiB each and counts minor page faults per call.
FAULTS = """
import os, resource, sys
from transformer_mt import launch
if sys.argv[1] == "launch":
  launch.reexec_with_allocator_settings()
import jax, jax.numpy as jnp
@jax.jit
def f(x):
  y = jnp.tanh(x @ x.T) + jnp.sin(x)
  return (jnp.exp(y) @ jnp.cos(y)).sum()

x = jnp.ones((2048, 2048))
f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
  f(x).block_until_ready()
print(os.getpid(), os.environ.get("GLIBC_TUNABLES"),
      (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def run_child(mode, **env_changes):
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  env.update(env_changes, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  child = subprocess.Popen(
    [sys.executable, "-c", FAULTS, mode], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT
  )
  out, _ = child.communicate(timeout=300)
  assert child.returncode == 0
  pid, tunables, faults = out.split()
  return int(pid), child.pid, tunables, float(faults)


def test_reexec_sets_tunables_in_the_same_process_and_cuts_page_faults():
  pid, child_pid, tunables, faults = run_child("launch")
  assert tunables == launch.GLIBC_TUNABLES
  assert pid == child_pid  # exec, not a new process: signals and exit codes go to one pid
  _, _, plain_tunables, plain_faults = run_child("plain")
  assert plain_tunables == "None"
  assert faults < plain_faults / 3, (faults, plain_faults)


def test_a_users_own_tunables_are_kept():
  _, _, tunables, _ = run_child("launch", GLIBC_TUNABLES="glibc.malloc.arena_max=2")
  assert tunables == "glibc.malloc.arena_max=2"

"""Do the launcher's allocator settings remove the page faults of XLA's per-call temporaries?

One jitted function whose temporaries are 16 MiB each runs in child processes started two
ways, alternately: through `launch.reexec_with_allocator_settings()` (GLIBC_TUNABLES set by
the re-exec, as `run.py` does) and plain (glibc's defaults). Each child counts its minor page
faults per call (`getrusage`) after a warm-up call; the plain children are the reference, in
the same run. Printed: faults per call of each, and the launched / plain ratio.

    python benchmarks/page_faults.py [--rounds 3] [--calls 10] [--size 2048]

Expected on Linux with glibc: the launched children fault a small fraction of what the plain
ones do (glibc returns large freed blocks to the kernel by default, so every call faults them
in afresh; docs/performance.md, "Where a small model's time went"). How small depends on the
machine's load and memory pressure, which is why no test asserts it (tests/test_launch.py checks
only that the re-exec sets the tunables in the same process).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_mt.runtime import allocator as launch  # noqa: E402

# argv: mode ("launch" or "plain"), calls, size. Prints the tunables seen and faults per call.
CHILD = """
import os, resource, sys
from transformer_mt.runtime import allocator as launch
if sys.argv[1] == "launch":
  launch.reexec_with_allocator_settings()
import jax, jax.numpy as jnp
calls, size = int(sys.argv[2]), int(sys.argv[3])

@jax.jit
def f(x):
  y = jnp.tanh(x @ x.T) + jnp.sin(x)
  return (jnp.exp(y) @ jnp.cos(y)).sum()

x = jnp.ones((size, size))
f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(calls):
  f(x).block_until_ready()
print(os.environ.get("GLIBC_TUNABLES"),
      (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls)
"""


def faults_per_call(mode: str, calls: int, size: int) -> tuple[str, float]:
  """(GLIBC_TUNABLES the child saw, its minor page faults per call)."""
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "XLA_FLAGS")}
  env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  out = subprocess.run(
    [sys.executable, "-c", CHILD, mode, str(calls), str(size)],
    env=env,
    cwd=ROOT,
    check=True,
    capture_output=True,
    text=True,
  ).stdout
  tunables, faults = out.split()
  return tunables, float(faults)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3, help="child processes of each kind")
  parser.add_argument("--calls", type=int, default=10, help="timed calls per child")
  parser.add_argument("--size", type=int, default=2048, help="side of the [size, size] input")
  args = parser.parse_args()
  if not (sys.platform.startswith("linux") and launch.uses_glibc()):
    sys.exit("error: the allocator settings are glibc tunables: Linux with glibc only")
  faults = {"launch": [], "plain": []}
  print(f"{'round':>5}{'launched':>12}{'plain':>12}  (minor page faults per call)")
  for round_ in range(args.rounds):
    for mode in faults:  # alternated, so both kinds see the same drift in load
      tunables, value = faults_per_call(mode, args.calls, args.size)
      expected = launch.GLIBC_TUNABLES if mode == "launch" else "None"
      assert tunables == expected, (mode, tunables)
      faults[mode].append(value)
    print(f"{round_:5d}{faults['launch'][-1]:12.1f}{faults['plain'][-1]:12.1f}", flush=True)
  launched, plain = (statistics.median(faults[m]) for m in ("launch", "plain"))
  ratio = launched / plain if plain else float("nan")
  print(f"median: launched {launched:.1f}, plain {plain:.1f} faults/call; ratio {ratio:.3f}")
  record = {"size": args.size, "calls": args.calls, "faults": faults, "ratio": ratio}
  print(json.dumps(record))


if __name__ == "__main__":
  main()

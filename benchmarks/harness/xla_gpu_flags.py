"""accelerator.py's "xla_flags" section: XLA's GPU flags and model.fuse_qkv, A/B, the Base train
step under each variant, each in its own process, as a ratio to the defaults measured in the
same call (`python benchmarks/accelerator.py --sections xla_flags`).

XLA reads XLA_FLAGS once, when its backend starts, so each variant is a fresh process
(`python -m benchmarks.harness.xla_gpu_flags --child ...`) that compiles and times the step and
prints one JSON line. Variants (VARIANTS): XLA's defaults; `model.fuse_qkv=True`; Triton GEMMs
off (`--xla_gpu_enable_triton_gemm=false`: cuBLAS for every matmul); command buffers off
(`--xla_gpu_enable_command_buffer=`: every kernel launched on its own instead of as CUDA
graphs). The flags only mean something to XLA's GPU backend: on another device one line says
so and nothing runs, unless `tiny` asks for the machinery to run anyway.

The children share the GPU with the caller, so they run with XLA_PYTHON_CLIENT_PREALLOCATE=false;
a caller that has already started JAX on the GPU holds 75% of its memory by default, and should
run this section first or start with XLA_PYTHON_CLIENT_PREALLOCATE=false itself.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# name: (extra XLA_FLAGS, model overrides)
VARIANTS = {
  "default": ("", {}),
  "fuse_qkv": ("", {"fuse_qkv": True}),
  "triton_gemm_off": ("--xla_gpu_enable_triton_gemm=false", {}),
  "command_buffers_off": ("--xla_gpu_enable_command_buffer=", {}),
}
CHILD_TIMEOUT_S = 300


def _child(size_name: str, tiny: bool, reps: int, overrides: dict) -> None:
  """In the variant's own process: one JSON line with the backend and the step's figures."""
  sys.path.insert(0, str(ROOT))
  import jax
  import numpy as np

  from benchmarks.harness import steps

  size = (steps.TINY if tiny else steps.SIZES)[size_name]
  config = steps.model_config(size, "auto").replace(**overrides)
  rows, max_len = size[5], size[6]
  bench = steps.TrainStepBench(config)
  batch = steps.full_rows_batch(rows, max_len, config.vocab_size, seed=0)
  timing = bench.time(batch, warmup=2, reps=reps)
  loss = float(np.asarray(bench.step(bench.put(batch))["loss"]))
  print(
    json.dumps(
      dict(
        backend=jax.default_backend(),
        ms=timing.best * 1e3,
        median_ms=timing.median * 1e3,
        tokens_per_s=rows * max_len / timing.best,
        loss=loss,
      )
    )
  )


def _run_child(variant: str, size: str, tiny: bool, reps: int) -> dict:
  flags, overrides = VARIANTS[variant]
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  env["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), flags) if f)
  command = [sys.executable, "-m", "benchmarks.harness.xla_gpu_flags", "--child"]
  command += ["--size", size, "--reps", str(reps)]
  command += ["--overrides", json.dumps(overrides)] + (["--tiny"] if tiny else [])
  result = subprocess.run(
    command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
  )
  if result.returncode:
    tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise RuntimeError(f"variant {variant} failed (exit {result.returncode}): {tail}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def _backend() -> str:
  """JAX's default backend, asked of a child process: starting JAX here would take the GPU's
  memory from the variants."""
  probe = "import jax; print(jax.default_backend())"
  result = subprocess.run(
    [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
  )
  return result.stdout.strip().splitlines()[-1]


def ab_lines(
  variants=tuple(VARIANTS),
  size: str = "Base",
  tiny: bool = False,
  reps: int | None = None,
  backend: str | None = None,
) -> list[str]:
  """One line per variant: step time, tokens/s and the ratio of its tokens/s to the first
  variant's (the defaults), each measured in its own process in this call. `backend`: JAX's
  default backend when the caller knows it (else a child process is asked)."""
  backend = backend or _backend()
  if backend != "gpu" and not tiny:
    return [f"XLA GPU flags: GPU-only, and this device is {backend}: nothing run"]
  reps = reps or (2 if tiny else 10)
  lines = [f"XLA GPU flags and fuse_qkv, {size}{' (tiny)' if tiny else ''}, on {backend}:"]
  reference = None
  for variant in variants:
    try:
      figures = _run_child(variant, size, tiny, reps)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
      lines.append(f"  {variant}: {error}")
      continue
    reference = reference or figures
    flags, overrides = VARIANTS[variant]
    what = flags or ", ".join(f"model.{k}={v}" for k, v in overrides.items()) or "as XLA ships"
    ratio = figures["tokens_per_s"] / reference["tokens_per_s"]
    lines.append(
      f"  {variant} ({what}): {figures['ms']:.1f} ms (median {figures['median_ms']:.1f}), "
      f"{figures['tokens_per_s']:,.0f} tokens/s, {ratio:.3f}x the defaults, "
      f"loss {figures['loss']:.5f}"
    )
  return lines


def _child_main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--child", action="store_true", required=True)
  parser.add_argument("--tiny", action="store_true")
  parser.add_argument("--reps", type=int, default=2)
  parser.add_argument("--size", default="Base", choices=("Base", "Big"))
  parser.add_argument("--overrides", default="{}")
  args = parser.parse_args(argv)
  _child(args.size, args.tiny, args.reps, json.loads(args.overrides))
  return 0


if __name__ == "__main__":
  sys.exit(_child_main())

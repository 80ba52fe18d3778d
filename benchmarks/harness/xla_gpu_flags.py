"""XLA's GPU flags and model.fuse_qkv, A/B: the Base train step under each variant, each in its
own process, as a ratio to the defaults measured in the same call.

    python benchmarks/_xla_gpu_flags.py            # on a GPU: every variant, ~1 min each
    python benchmarks/_xla_gpu_flags.py --tiny     # the same machinery at toy sizes (CPU too)
    python benchmarks/_xla_gpu_flags.py --variants default fuse_qkv

XLA reads XLA_FLAGS once, when its backend starts, so each variant is a fresh process (this
file again, with `--child`) that compiles and times the step and prints one JSON line.
Variants (VARIANTS): XLA's defaults; `model.fuse_qkv=True`; Triton GEMMs off
(`--xla_gpu_enable_triton_gemm=false`: cuBLAS for every matmul); command buffers off
(`--xla_gpu_enable_command_buffer=`: every kernel launched on its own instead of as CUDA
graphs). The flags only mean something to XLA's GPU backend: on another device the script
says so and runs nothing, unless `--tiny` asks for the machinery to run anyway (CI).

benchmarks/accelerator.py can call `ab_lines()`. The children share the GPU with the caller,
so they run with XLA_PYTHON_CLIENT_PREALLOCATE=false; a caller that has already started JAX
on the GPU holds 75% of its memory by default, and should call this first or start with
XLA_PYTHON_CLIENT_PREALLOCATE=false itself.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

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
  from flax import linen as nn

  from benchmarks import _timing, accelerator
  from benchmarks.memory import compile_train_step
  from benchmarks.train_step import full_rows_batch
  from transformer_mt.config import defaults
  from transformer_mt.runtime import sharding
  from transformer_mt.training import train_step
  from transformer_mt.training.setup import training_setup

  size = (accelerator.TINY if tiny else accelerator.SIZES)[size_name]
  config = accelerator.model_config(size, "auto").replace(**overrides)
  rows, max_len = size[5], size[6]
  mesh = accelerator.one_device_mesh()
  setup = training_setup(defaults.base_config(), None, mesh, model_config=config)
  holder = {"state": train_step.create_sharded_state(0, setup.model, setup.tx, mesh)}
  batch = full_rows_batch(rows, max_len, config.vocab_size, seed=0)
  device_batch = sharding.global_batch_from_local(batch, mesh, batch_dim=1)
  step = compile_train_step(setup, mesh, device_batch, 0.1)

  def call():
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
      holder["state"], metrics = step(holder["state"], device_batch)
    return metrics

  timing = _timing.time_calls(call, warmup=2, reps=reps)
  loss = float(np.asarray(call()["loss"]))
  tokens = rows * max_len
  print(
    json.dumps(
      dict(
        backend=jax.default_backend(),
        ms=timing.best * 1e3,
        median_ms=timing.median * 1e3,
        tokens_per_s=tokens / timing.best,
        loss=loss,
      )
    )
  )


def _run_child(variant: str, size: str, tiny: bool, reps: int) -> dict:
  flags, overrides = VARIANTS[variant]
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  env["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), flags) if f)
  command = [sys.executable, __file__, "--child", "--size", size, "--reps", str(reps)]
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
  variants=tuple(VARIANTS), size: str = "Base", tiny: bool = False, reps: int | None = None
) -> list[str]:
  """One line per variant: step time, tokens/s and the ratio of its tokens/s to the first
  variant's (the defaults), each measured in its own process in this call."""
  backend = _backend()
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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tiny", action="store_true", help="toy sizes; runs off a GPU too")
  parser.add_argument("--reps", type=int, default=None, help="timed steps (default 10, tiny 2)")
  parser.add_argument("--size", default="Base", choices=("Base", "Big"))
  parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    _child(args.size, args.tiny, args.reps or 2, json.loads(args.overrides))
    return 0
  print("\n".join(ab_lines(args.variants, args.size, args.tiny, args.reps)))
  return 0


if __name__ == "__main__":
  sys.exit(main())

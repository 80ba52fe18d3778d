"""How much memory does one train step need? XLA's own accounting for Transformer Base and
Big at the paper's per-device batch, with and without rematerialization (model.remat); and how
much does translating with NLLB-200 3.3B need, in float32 and bfloat16 (`--inference`)?

    python benchmarks/memory.py [--experiments transformer_base_wmt14_ende ...] [--rows 12]
    python benchmarks/memory.py --inference [--beam 4 --batch 16 --src_len 64]
    python benchmarks/memory.py --tiny [--inference]     # toy shapes, seconds (CI)

Nothing large is allocated: the step is lowered and compiled for abstract inputs
(`train_step.state_layout`, `jax.ShapeDtypeStruct` batches), as `jit_train_step` compiles
it (state donated), and `compiled.memory_analysis()` reports the buffers XLA assigned:
  state       arguments: params + Adam's two moments + step + RNG, and the batch
  temporaries activations kept for the backward pass, gradients, workspace
  peak        arguments + outputs - aliased (the donated state is reused) + temporaries
and, independently of any backend,
  residuals   what jax keeps from the forward pass for the backward pass (the leaves of
              `jax.vjp`'s closure over one micro-batch's loss, under `jax.eval_shape`):
              the activations that remat trades for recomputation, plus the parameters.

Batch: the paper trained on ~25,000 target tokens per step over 8 P100 GPUs, i.e. ~3,072 per
device per step; here 12 packed rows of 256 tokens (data.max_len of the WMT14 rows) =
3,072 target-token slots (and as many source slots) per device, in one micro-batch.

Read the XLA columns for the backend this runs on. On CPU (jax 0.10 / XLA of this venv), the
compiled step does recompute (cost analysis: ~1/3 more FLOPs with remat) but the optimization
barriers are gone after compilation and the recomputation is scheduled early, beside the
original forward pass, so the compiled memory does not drop there; the residuals column is
what remat removes from memory where the scheduler places the recomputation in the backward
pass, as accelerator backends are meant to.

Inference (`--inference`): beam search with NLLB-200 3.3B (its config.json, written out in
`NLLB_200_3_3B` below; no weights are needed), lowered and compiled for abstract parameters
and a batch of `--batch` sources of `--src_len` tokens, as `translate` runs it: parameters
only (no optimizer state: the checkpoint's params item alone is restored), the KV cache for
`--beam` beams and source length + 50 target positions. Reported: the parameters' bytes and
XLA's peak (arguments + outputs - aliased + temporaries) for the whole beam search. On CPU,
XLA computes bfloat16 matmuls in float32 and converts the weights where they are used, so the
bfloat16 temporaries there include float32 copies of the weights and its peak is no lower than
float32's; the parameter bytes are what bfloat16 halves on every backend.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.harness import models, timing  # noqa: E402
from benchmarks.harness.steps import compile_train_step, one_device_mesh, peak_bytes  # noqa: E402
from transformer_mt.config import registry  # noqa: E402
from transformer_mt.decoding import beam_decode  # noqa: E402
from transformer_mt.interop import hf_convert  # noqa: E402
from transformer_mt.model import setup as run_setup  # noqa: E402
from transformer_mt.model.transformer import Transformer, count_parameters  # noqa: E402
from transformer_mt.runtime import sharding  # noqa: E402
from transformer_mt.training import train_step  # noqa: E402
from transformer_mt.training.setup import training_setup  # noqa: E402

BATCH_KEYS = (
  "inputs",
  "targets",
  "targets_in",
  "inputs_positions",
  "targets_positions",
  "inputs_segment_ids",
  "targets_segment_ids",
)
GIB = 2.0**30
# config.json of facebook/nllb-200-3.3B (the fields hf_convert reads).
NLLB_200_3_3B = {
  "model_type": "m2m_100",
  "activation_function": "relu",
  "d_model": 2048,
  "encoder_layers": 24,
  "decoder_layers": 24,
  "encoder_attention_heads": 16,
  "decoder_attention_heads": 16,
  "encoder_ffn_dim": 8192,
  "decoder_ffn_dim": 8192,
  "vocab_size": 256206,
  "max_position_embeddings": 1024,
  "scale_embedding": True,
  "pad_token_id": 1,
  "eos_token_id": 2,
  "decoder_start_token_id": 2,
  "dropout": 0.1,
  "attention_dropout": 0.1,
  "activation_dropout": 0.0,
}


# --tiny: the same programs at toy shapes (the train step of each experiment, and the beam
# search of a shrunk NLLB-200), seconds on a CPU.
TINY_MODEL = (*models.TINY_MODEL, "data.max_len=16")
TINY_NLLB = dict(
  d_model=32,
  encoder_layers=1,
  decoder_layers=1,
  encoder_attention_heads=2,
  decoder_attention_heads=2,
  encoder_ffn_dim=64,
  decoder_ffn_dim=64,
  vocab_size=256,
)


def step_memory(
  experiment: str, remat: bool, rows: int, accum: int, overrides=()
) -> dict[str, float]:
  """Bytes XLA assigns to one train step of `experiment` (with `overrides`) on one device, and
  the bytes of the residuals jax saves for its backward pass."""
  config = registry.load_experiment(experiment, list(overrides))
  mesh = one_device_mesh()
  model_config = run_setup.model_config_for(config).replace(remat=remat)
  setup = training_setup(config, None, mesh, model_config=model_config)
  model, state = setup.model, setup.abstract_state
  batch = {
    k: jax.ShapeDtypeStruct((accum, rows // accum, config.data.max_len), jnp.int32)
    for k in BATCH_KEYS
  }
  start = time.perf_counter()
  stats = compile_train_step(setup, mesh, batch, config.train.label_smoothing).memory_analysis()
  compile_seconds = time.perf_counter() - start

  # What jax keeps for the backward pass: the arrays `jax.vjp`'s closure holds.
  micro = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in batch.items()}
  loss = lambda params, micro: train_step._micro_batch_sums(  # noqa: E731
    params, micro, jax.random.key(0), model, config.train.label_smoothing
  )[0]
  closure = jax.eval_shape(lambda p, m: jax.vjp(lambda p: loss(p, m), p)[1], state.params, micro)
  residuals = sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(closure))
  return {
    "parameters": count_parameters(model_config),
    "residuals": residuals,
    "arguments": stats.argument_size_in_bytes,
    "outputs": stats.output_size_in_bytes,
    "aliased": stats.alias_size_in_bytes,
    "temporaries": stats.temp_size_in_bytes,
    "peak": peak_bytes(stats),
    "target_slots": rows * config.data.max_len,
    "compile_seconds": compile_seconds,
  }


def inference_memory(
  dtype: str, batch: int, beam: int, src_len: int, tiny: bool = False
) -> dict[str, float]:
  """Bytes XLA assigns to beam search with NLLB-200 3.3B (`tiny`: TINY_NLLB's shape) in
  `dtype` on one device."""
  hf_config = {**NLLB_200_3_3B, **(TINY_NLLB if tiny else {})}
  model_config = hf_convert.config_from_hf(hf_config).replace(dtype=dtype, param_dtype=dtype)
  mesh = one_device_mesh()
  params = train_step.abstract_params(Transformer(model_config), mesh)
  max_len = src_len + 50
  inputs = jax.ShapeDtypeStruct((batch, src_len), jnp.int32)
  start = time.perf_counter()
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
    compiled = beam_decode.beam_decode.lower(params, inputs, model_config, beam, max_len).compile()
  stats = compiled.memory_analysis()
  param_bytes = sum(math.prod(p.shape) * p.dtype.itemsize for p in jax.tree.leaves(params))
  return {
    "parameters": count_parameters(model_config),
    "param_bytes": param_bytes,
    "arguments": stats.argument_size_in_bytes,
    "temporaries": stats.temp_size_in_bytes,
    "peak": peak_bytes(stats),
    "compile_seconds": time.perf_counter() - start,
  }


def main_inference(args) -> None:
  results = {}
  print(f"{'NLLB-200 3.3B':16}{'params':>9}{'params GiB':>12}{'temp GiB':>10}{'peak GiB':>10}")
  for dtype in ("float32", "bfloat16"):
    m = inference_memory(dtype, args.batch, args.beam, args.src_len, args.tiny)
    results[dtype] = m
    print(
      f"{dtype:16}{m['parameters'] / 1e9:8.2f}B{m['param_bytes'] / GIB:12.2f}"
      f"{m['temporaries'] / GIB:10.2f}{m['peak'] / GIB:10.2f}",
      flush=True,
    )
  print(
    json.dumps(
      {
        "benchmark": "inference_memory",
        "model": "nllb-200-3.3B" + (" (tiny shape)" if args.tiny else ""),
        "backend": jax.default_backend(),
        "batch": args.batch,
        "beam": args.beam,
        "src_len": args.src_len,
        "results": results,
      }
    )
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--experiments",
    nargs="+",
    default=["transformer_base_wmt14_ende", "transformer_big_wmt14_ende"],
  )
  parser.add_argument(
    "--rows",
    type=int,
    default=12,
    help="packed rows per device per step (12 x 256 = 3,072 target tokens)",
  )
  parser.add_argument("--accum", type=int, default=1, help="gradient-accumulation micro-batches")
  parser.add_argument(
    "--inference", action="store_true", help="NLLB-200 3.3B beam search instead of train steps"
  )
  parser.add_argument("--batch", type=int, default=16, help="--inference: sentences per batch")
  parser.add_argument("--beam", type=int, default=4, help="--inference: beam size")
  parser.add_argument("--src_len", type=int, default=64, help="--inference: source tokens")
  parser.add_argument("--tiny", action="store_true", help="toy shapes, seconds on a CPU (CI)")
  args = parser.parse_args(argv)
  print(timing.machine_line())
  overrides = ()
  if args.tiny:
    # 4 rows of 16: accelerator.py's --tiny Base step (harness.steps.TINY), the same program
    # without remat, so a process that runs both with a compilation cache (the tests) compiles
    # it once.
    args.rows, args.batch, args.src_len, args.beam = 4, 2, 8, 2
    args.experiments = args.experiments[:1]
    overrides = TINY_MODEL
  if args.inference:
    main_inference(args)
    return

  results = {}
  print(
    f"{'experiment':30}{'remat':>6}{'params':>9}{'state GiB':>10}{'temp GiB':>10}"
    f"{'peak GiB':>10}{'residuals GiB':>15}"
  )
  for experiment in args.experiments:
    for remat in (False, True):
      m = step_memory(experiment, remat, args.rows, args.accum, overrides)
      results[f"{experiment}{'+remat' if remat else ''}"] = m
      print(
        f"{experiment:30}{remat!s:>6}{m['parameters'] / 1e6:8.1f}M"
        f"{m['arguments'] / GIB:10.2f}{m['temporaries'] / GIB:10.2f}{m['peak'] / GIB:10.2f}"
        f"{m['residuals'] / GIB:15.2f}",
        flush=True,
      )
    plain, remat = results[experiment], results[f"{experiment}+remat"]
    print(
      f"  remat: XLA {jax.default_backend()} peak {plain['peak'] / GIB:.2f} -> "
      f"{remat['peak'] / GIB:.2f} GiB; residuals {plain['residuals'] / GIB:.2f} -> "
      f"{remat['residuals'] / GIB:.2f} GiB (saves "
      f"{(plain['residuals'] - remat['residuals']) / GIB:.2f} GiB)"
    )
  print(
    json.dumps(
      {
        "benchmark": "memory",
        "backend": jax.default_backend(),
        "rows_per_device": args.rows,
        "accum": args.accum,
        "results": results,
      }
    )
  )


if __name__ == "__main__":
  main()

"""accelerator.py's packed-attention section: the Base train step on packed rows (several
sentence pairs per row, trailing padding) under each `model.attention_implementation`.

Per implementation, one line: step time and target tokens/s (real tokens, padding excluded),
XLA's peak for the step, how many fused attention kernels the compiled step calls (18 of each
direction where every attention of a 6+6-layer model is fused: "pallas" fuses the 12
self-attentions only), and the first step's loss and gradient norm relative to "auto" from
the same parameters, batch and dropout key (bf16 steps: a few 1e-3 is rounding, more is a
bug). Then what "auto" picks here and why, which is what decides whether
`fused_kernels.AUTO_PICKS_CUDNN_PACKED_ON_GPU` can be switched on: the fused kernel must
be faster than "auto" with the same loss.

On a CPU only "auto" runs ("cudnn*" and "pallas" refuse, one line each), so CI's `--tiny`
run exercises the section.
"""

from __future__ import annotations

import jax

from benchmarks.harness.steps import TrainStepBench, packed_rows_batch, peak_bytes
from transformer_mt.model import fused_kernels
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors

# "xla" is measured too when "auto" stands for something else here (fused_kernels.resolve).
IMPLEMENTATIONS = ("auto", "cudnn", "cudnn_packed", "pallas")


def fused_kernel_calls(compiled_text: str) -> tuple[int, int]:
  """(forward, backward) fused attention kernels in a compiled program's text: cuDNN's
  fmha custom calls, or Pallas' Triton calls (named after its kernels)."""
  lines = [
    line for line in compiled_text.splitlines() if "custom-call" in line or "custom_call" in line
  ]
  cudnn = [line for line in lines if "__cudnn$fmha" in line]
  forward = sum("Backward" not in line for line in cudnn)
  backward = len(cudnn) - forward
  forward += sum("mha_forward" in line for line in lines)
  backward += sum("mha_backward" in line for line in lines)
  return forward, backward


def _measure(config: TransformerConfig, batch, reps: int):
  """The compiled train step of `config` on `batch`: its first step's metrics (from seed 0's
  parameters), the timing of the following ones, and the compiled program."""
  bench = TrainStepBench(config)
  device_batch = bench.put(batch)
  first = jax.device_get(bench.step(device_batch))
  return first, bench.time(batch, warmup=1, reps=reps), bench.compiled(device_batch)


def comparison_lines(
  base_config: TransformerConfig, rows: int, max_len: int, reps: int
) -> list[str]:
  """The section's lines for `base_config` (any attention_implementation; each of
  IMPLEMENTATIONS replaces it) on `rows` packed rows of `max_len` tokens."""
  batch = packed_rows_batch(rows, max_len, base_config.vocab_size, seed=2)
  real = int((batch["targets_segment_ids"] > 0).sum())
  sentences = int(batch["targets_segment_ids"].max(axis=-1).sum())
  lines = [
    f"packed attention, Base {base_config.dtype}, {rows} x {max_len} slots, {sentences} sentence "
    f"pairs, {real} real target tokens ({real / (rows * max_len):.0%})"
  ]
  reference = None
  auto = fused_kernels.resolve("auto", base_config.compute_dtype)
  for implementation in IMPLEMENTATIONS + (("xla",) if auto != "auto" else ()):
    try:
      config = base_config.replace(attention_implementation=implementation)
      first, timing, step = _measure(config, batch, reps)
    except errors.BadValue as refused:  # this backend or dtype cannot run it
      lines.append(f"  {implementation}: not run here ({refused})")
      continue
    except Exception as error:  # noqa: BLE001 (one kernel failing must not hide the others)
      first_line = str(error).splitlines()[0] if str(error) else ""
      lines.append(f"  {implementation}: FAILED ({type(error).__name__}: {first_line})")
      continue
    figures = (float(first["loss"]), float(first["grad_norm"]))
    reference = reference or figures
    forward, backward = fused_kernel_calls(step.as_text())
    lines.append(
      f"  {implementation}: {timing.best * 1e3:.1f} ms (median {timing.median * 1e3:.1f}), "
      f"{real / timing.best:,.0f} real target tokens/s, XLA's peak "
      f"{peak_bytes(step.memory_analysis()) / 2**30:.2f} GiB, fused attention kernels "
      f"{forward} forward + {backward} backward; loss {figures[0]:.5f} "
      f"({figures[0] / reference[0] - 1:+.1e} vs auto), grad norm {figures[1]:.4f} "
      f"({figures[1] / reference[1] - 1:+.1e})"
    )
  problem = fused_kernels.cudnn_packed_problem()
  lines.append(
    f"  auto here: {auto} (AUTO_PICKS_CUDNN_PACKED_ON_GPU="
    f"{fused_kernels.AUTO_PICKS_CUDNN_PACKED_ON_GPU}; cudnn_packed "
    f"{'can run here' if problem is None else problem})"
  )
  return lines

"""Does the input pipeline keep up with accelerators? Tokens/s per worker count vs a Base step.

The pipeline (read + tokenize (SentencePiece) + filter + first-fit pack + batch) runs on the
~28k EN-DE news pairs of ../shared/data with `data.num_workers` = 0 (in this process), 1, 2,
...; its rate is the non-pad target tokens of the batches the training process receives per
second, after the first batch (worker start-up is not throughput).

The demand is computed, not measured: the Base WMT14 EN-DE row (transformer_base_wmt14_ende)
on 8 A100s at the model FLOP utilization estimates.py assumes (its UTILIZATION and its
bf16/TF32 peak), with the attention scores included (they are real work on full packed rows),
so one update of train.batch_tokens target slots takes FLOPs / (8 x peak x MFU) seconds (also
printed for bf16, twice the peak). The pipeline must deliver that many target tokens per second
on the host feeding the 8 GPUs.

    python benchmarks/input_pipeline.py [--workers 0 1 2] [--batches 60] [--max_len 128]
                                        [--batch_tokens 4096] [--devices 8] [--data_root DIR]

Workers help only up to the host's free cores: each runs the whole pipeline on 1/N of the
pairs, and the training process itself needs a core.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_mt.config import registry  # noqa: E402
from transformer_mt.data import input_pipeline  # noqa: E402
from transformer_mt.data import sources as data_sources  # noqa: E402
from transformer_mt.data.tokenizer import PAD_ID, train_tokenizer  # noqa: E402
from transformer_mt.model import estimates  # noqa: E402

news_ende_small = registry.experiment_module("news_ende_small")
transformer_base_wmt14_ende = registry.experiment_module("transformer_base_wmt14_ende")


def base_demand(devices: int, dtype: str = "") -> tuple[float, str]:
  """Target tokens/s a Base step consumes on `devices` A100s at estimates.UTILIZATION, for
  the row's model.dtype or `dtype`."""
  config = transformer_base_wmt14_ende.get_config()
  config.model.dtype = dtype or config.model.dtype
  row = estimates.estimate(config, devices=devices)
  flops = row.flops_per_step + row.attention_flops_per_step
  seconds = flops / (devices * row.peak_flops * estimates.UTILIZATION)
  tokens = row.target_tokens
  dtype_name = "auto: bfloat16 on the GPU" if config.model.dtype == "auto" else config.model.dtype
  note = (
    f"Base WMT14 EN-DE ({row.total_params / 1e6:.0f}M params, {tokens:,} target slots/update, "
    f"{dtype_name}): {flops / 1e12:.1f} TFLOP/update incl. attention scores, on "
    f"{devices}x {estimates.DEVICE} at {estimates.UTILIZATION:.0%} of "
    f"{row.peak_flops / 1e12:.0f} TFLOP/s -> {seconds * 1e3:.1f} ms/update"
  )
  return tokens / seconds, note


def pipeline_rate(pairs, tokenizer, rows, max_len, workers, batches) -> tuple[float, float]:
  """(non-pad target tokens/s, non-pad fraction) of `batches` batches after the first."""
  iterator, _ = input_pipeline.training_batches(
    pairs, tokenizer, rows, 1, max_len, seed=0, num_workers=workers
  )
  next(iterator)  # start-up: worker processes, the first packing round
  start = time.perf_counter()
  real = 0
  for _ in range(batches):
    real += int((next(iterator)["targets"] != PAD_ID).sum())
  seconds = time.perf_counter() - start
  iterator.close()
  return real / seconds, real / (batches * rows * max_len)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--batches", type=int, default=60, help="batches timed per worker count")
  parser.add_argument("--batch_tokens", type=int, default=4096, help="rows x max_len per batch")
  parser.add_argument("--max_len", type=int, default=128)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--devices", type=int, default=8, help="A100s the demand is computed for")
  parser.add_argument(
    "--data_root",
    default="",
    help="folder holding news_ende_small's news/en-de/* files (default: ../shared/data beside "
    "the repository)",
  )
  args = parser.parse_args()

  need, note = base_demand(args.devices)
  print(f"demand: {need:12,.0f} target tokens/s  [{note}]")
  f32, f32_note = base_demand(args.devices, "float32")
  print(f"        {f32:12,.0f} target tokens/s with model.dtype=float32  [{f32_note}]")
  data_config = news_ende_small.get_config().data
  data_config.root = args.data_root and os.path.abspath(os.path.expanduser(args.data_root))
  pairs = data_sources.load_pairs(data_config)["train"]
  tokenizer = train_tokenizer(pairs, args.vocab_size, "unigram", sample_size=60_000)
  rows = input_pipeline.rows_per_batch(args.batch_tokens, args.max_len, 1, 1)
  print(
    f"{len(pairs)} news pairs, SentencePiece {args.vocab_size}, batches of {rows}x{args.max_len}; "
    f"{os.cpu_count()} CPU cores on this host"
  )
  for workers in args.workers:
    rate, filled = pipeline_rate(pairs, tokenizer, rows, args.max_len, workers, args.batches)
    print(
      f"num_workers={workers}: {rate:12,.0f} target tokens/s ({filled:.1%} non-pad) = "
      f"{rate / need:.2f}x the demand"
    )


if __name__ == "__main__":
  main()

"""Is the input pipeline fast enough? Packed tokens/s it produces vs tokens/s the train step eats.

Both are measured in this process on the same machine, on the ~28k EN-DE news pairs of
../shared/data (the news_ende_small training sets):

  pipeline    read + tokenize (SentencePiece) + filter + first-fit pack + batch, alone
  train step  the jitted train step of a base-width model (d_model 512, 8 heads, d_ff 2048)
              on batches of the same shape, after compilation

The pipeline must produce more target tokens per second than the step consumes.

    python benchmarks/input_pipeline.py [--layers 6] [--batch_tokens 4096] [--max_len 128]
                                        [--data_root DIR]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import ml_collections  # noqa: E402

from experiments import _defaults, news_ende_small  # noqa: E402
from transformer_mt import (
  data_sources,
  input_pipeline,
  run_setup,
  sharding,  # noqa: E402
  train_step,
)
from transformer_mt.config import TransformerConfig  # noqa: E402
from transformer_mt.tokenizer import PAD_ID, train_tokenizer  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers")
  parser.add_argument("--batch_tokens", type=int, default=4096)
  parser.add_argument("--max_len", type=int, default=128)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--pipeline_batches", type=int, default=100)
  parser.add_argument("--train_steps", type=int, default=3)
  parser.add_argument(
    "--data_root",
    default="",
    help="folder holding news_ende_small's news/en-de/* files (default: ../shared/data beside "
    "the repository)",
  )
  args = parser.parse_args()

  data_config = news_ende_small.get_config().data
  data_config.root = args.data_root and os.path.abspath(os.path.expanduser(args.data_root))
  pairs = data_sources.load_pairs(data_config)["train"]
  start = time.perf_counter()
  tokenizer = train_tokenizer(pairs, args.vocab_size, "unigram", sample_size=60_000)
  print(
    f"{len(pairs)} training pairs; SentencePiece {args.vocab_size} trained in "
    f"{time.perf_counter() - start:.1f}s"
  )
  rows = input_pipeline.rows_per_batch(args.batch_tokens, args.max_len, 1, 1)

  batches, _ = input_pipeline.training_batches(pairs, tokenizer, rows, 1, args.max_len, seed=0)
  next(batches)  # start-up (thread pool, first packing round) is not throughput
  start = time.perf_counter()
  real_tokens = 0
  for _ in range(args.pipeline_batches):
    batch = next(batches)
    real_tokens += int((batch["targets"] != PAD_ID).sum())
  pipeline_seconds = time.perf_counter() - start
  slots = args.pipeline_batches * rows * args.max_len
  pipeline_rate = real_tokens / pipeline_seconds
  print(
    f"pipeline:   {pipeline_rate:12,.0f} target tokens/s ({slots / pipeline_seconds:,.0f} "
    f"slots/s, {real_tokens / slots:.1%} non-pad)"
  )

  model_config = TransformerConfig(
    vocab_size=tokenizer.vocab_size,
    d_model=512,
    num_heads=8,
    d_ff=2048,
    num_encoder_layers=args.layers,
    num_decoder_layers=args.layers,
  )
  mesh = sharding.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}))
  setup = run_setup.training_setup(
    _defaults.base_config(), tokenizer, mesh, model_config=model_config
  )
  state = train_step.create_sharded_state(0, setup.model, setup.tx, mesh)
  step = train_step.jit_train_step(
    setup.model, setup.tx, setup.schedule, 0.1, mesh, setup.state_shardings
  )
  device_batch = sharding.global_batch_from_local(batch, mesh, batch_dim=1)
  state, metrics = step(state, device_batch)  # compile
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  consumed = 0
  for _ in range(args.train_steps):
    state, metrics = step(state, device_batch)
    consumed += float(metrics["num_tokens"])
  jax.block_until_ready(state)
  step_rate = consumed / (time.perf_counter() - start)
  print(
    f"train step: {step_rate:12,.0f} target tokens/s (base width, {args.layers}+{args.layers} "
    f"layers, {rows}x{args.max_len} rows, {jax.device_count()} device(s))"
  )
  print(
    f"pipeline / train step = {pipeline_rate / step_rate:.1f}x "
    f"({'OK: the pipeline is not the bottleneck' if pipeline_rate > step_rate else 'TOO SLOW'})"
  )
  return 0 if pipeline_rate > step_rate else 1


if __name__ == "__main__":
  sys.exit(main())

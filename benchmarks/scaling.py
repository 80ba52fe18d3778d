"""How does our train step's time scale? Against sequence length at a fixed token budget, and
against the token budget at a fixed length, with log-log fitted exponents.

    python benchmarks/scaling.py [--d_model 256 --heads 4 --d_ff 1024 --layers 2] [--reps 5]

Model (default, small so all eight shapes compile and run in a few minutes on 2 CPU cores):
d_model 256, 4 heads, d_ff 1024, 2+2 layers, 8k vocabulary, dropout 0.1; the train step is
`train_step.jit_train_step` on a 1-device mesh, as in benchmarks/train_step.py.

Batches are full rows: one sentence of exactly `length` source and target tokens per row
(no padding), `tokens / length` rows, so every shape does the same per-token work except
attention, whose cost per token grows with the length.
  length sweep   length 64, 128, 256, 512 at --tokens (4,096) target tokens per step
  tokens sweep   1,024 ... 8,192 target tokens per step at --length (128)
Exponent b of step_seconds ~ a * x^b (least squares on log-log): ~0 for length if
attention is a small share of the work, ~1 for tokens if the step is throughput-bound
(below 1 when small batches leave the cores partly idle).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.train_step import ours_timer  # noqa: E402
from transformer_mt.data import input_pipeline  # noqa: E402
from transformer_mt.model.transformer_config import TransformerConfig  # noqa: E402


def full_rows(
  rows: int, length: int, vocab: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
  """[1, rows, length] packed-format batch with one unpadded sentence per row."""
  tokens = lambda: rng.integers(4, vocab, size=(rows, length)).astype(np.int32)  # noqa: E731
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
  segments = np.ones((rows, length), np.int32)
  batch = {
    "inputs": tokens(),
    "targets": tokens(),
    "inputs_positions": positions,
    "targets_positions": positions.copy(),
    "inputs_segment_ids": segments,
    "targets_segment_ids": segments.copy(),
  }
  batch = input_pipeline.shift_right_per_segment(batch)
  return {k: v[None] for k, v in batch.items()}


def fitted_exponent(x: list[float], seconds: list[float]) -> float:
  """b of seconds = a * x^b by least squares on (log x, log seconds)."""
  return float(np.polyfit(np.log(x), np.log(seconds), 1)[0])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--d_ff", type=int, default=1024)
  parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers")
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512])
  parser.add_argument("--tokens", type=int, default=4096, help="target tokens/step, length sweep")
  parser.add_argument("--token_budgets", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
  parser.add_argument("--length", type=int, default=128, help="sequence length, tokens sweep")
  parser.add_argument("--reps", type=int, default=5)
  args = parser.parse_args()

  config = TransformerConfig(
    vocab_size=args.vocab_size,
    d_model=args.d_model,
    num_heads=args.heads,
    d_ff=args.d_ff,
    num_encoder_layers=args.layers,
    num_decoder_layers=args.layers,
    dropout_rate=0.1,
  )
  rng = np.random.default_rng(0)
  sweeps = {
    "length": [(length, args.tokens) for length in args.lengths],
    "tokens": [(args.length, tokens) for tokens in args.token_budgets],
  }
  record = {"benchmark": "scaling", "config": vars(args)}
  print(
    f"{'sweep':8}{'length':>8}{'rows':>6}{'tokens':>8}{'step s (best)':>15}{'median':>9}"
    f"{'tokens/s':>10}"
  )
  time_batch = ours_timer(config, 0.1, args.reps)  # one state and jitted step, every shape
  for sweep, shapes in sweeps.items():
    rows_out = []
    for length, tokens in shapes:
      rows = tokens // length
      timing = time_batch(full_rows(rows, length, args.vocab_size, rng))
      rows_out.append(
        {
          "length": length,
          "rows": rows,
          "tokens": rows * length,
          "step_seconds": timing.best,
          "step_seconds_median": timing.median,
        }
      )
      print(
        f"{sweep:8}{length:8d}{rows:6d}{rows * length:8d}{timing.best:15.3f}"
        f"{timing.median:9.3f}{rows * length / timing.best:10,.0f}",
        flush=True,
      )
    x = [r[sweep] for r in rows_out]
    exponent = fitted_exponent(x, [r["step_seconds"] for r in rows_out])
    print(f"  step time ~ {sweep}^{exponent:.2f}")
    record[sweep] = {"points": rows_out, "exponent": exponent}
  print(json.dumps(record))


if __name__ == "__main__":
  main()

"""Do XLA:CPU's own switches speed up a small model's train step? Each flag set runs
benchmarks/train_step.py (full rows, our step only) in a process of its own, since XLA reads
XLA_FLAGS once, when the backend starts; the sets take turns for --rounds rounds, so a change
of load hits them alike. Prints each set's best step time and its ratio to no flags.

    python benchmarks/xla_cpu_flags.py [--rounds 2] [--flag_sets none xnnpack ...]
        [train_step.py's shape flags]

The default shape is multi30k_ende's step (Transformer-tiny: 4 + 4 layers, d_model 128, FFN
256, 4 heads, 9,712 pieces, 4,096 target slots in rows of 64), where the laptop row needs a
faster step (docs/multi30k.md). The flags: the legacy (non-thunk) runtime, oneDNN's matmuls,
XNNPACK's fusions and fast math.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

FLAG_SETS = {
  "none": "",
  "legacy_runtime": "--xla_cpu_use_thunk_runtime=false",
  "onednn": "--xla_cpu_use_onednn=true",
  "xnnpack": "--xla_cpu_use_xnnpack=true",
  "fast_math": "--xla_cpu_enable_fast_math=true",
}
# multi30k_ende's step, full rows (train_step.py's flags).
MULTI30K_SHAPE = (
  "--layers 4 --d_model 128 --d_ff 256 --heads 4 --vocab_size 9712 --batch_tokens 4096 "
  "--max_len 64 --reps 5 --matmul_size 256"
).split()
TRAIN_STEP = pathlib.Path(__file__).with_name("train_step.py")


def step_seconds(flags: str, shape: list[str]) -> float:
  """The best step time of train_step.py's full-rows run under XLA_FLAGS=flags."""
  env = {**os.environ, "XLA_FLAGS": flags}
  argv = [sys.executable, str(TRAIN_STEP), "--mode", "full_rows", "--skip_reference", *shape]
  result = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
  record = json.loads(result.stdout.strip().splitlines()[-1])  # train_step.py's last line
  return record["full_rows"]["ours"]["step_seconds"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2, help="turns each flag set takes")
  parser.add_argument("--flag_sets", nargs="+", default=list(FLAG_SETS), choices=FLAG_SETS)
  args, shape = parser.parse_known_args()
  shape = shape or MULTI30K_SHAPE
  best = {name: float("inf") for name in args.flag_sets}
  load_before = os.getloadavg()[0]
  for round_index in range(args.rounds):
    for name in args.flag_sets:
      seconds = step_seconds(FLAG_SETS[name], shape)
      best[name] = min(best[name], seconds)
      print(f"round {round_index + 1} {name:15s} {seconds:.3f} s", flush=True)
  reference = best[args.flag_sets[0]]
  print(f"\n{'flag set':15s} {'XLA_FLAGS':35s} best step s   x {args.flag_sets[0]}")
  for name, seconds in best.items():
    print(f"{name:15s} {FLAG_SETS[name]:35s} {seconds:11.3f}   {reference / seconds:.2f}x")
  print(f"1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
  print(json.dumps({"benchmark": "xla_cpu_flags", "shape": shape, "best_step_seconds": best}))


if __name__ == "__main__":
  main()

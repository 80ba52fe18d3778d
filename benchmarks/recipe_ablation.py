"""Which recipe choices raise an experiment's validation BLEU at equal wall time? Runs variants
of the experiment (tatoeba_deen, or --experiment multi30k_ende) side by side, each pinned to
its own CPU core, and prints their validation BLEU.

    python benchmarks/recipe_ablation.py --variants NAME [NAME ...] [--experiment E] [--steps N]
                                         [--warmup-fraction F] [--parallel P] [--root DIR]
                                         [--report-only]

Each variant is `run.py train --experiment E` with the overrides of its choices (CHOICES),
plus `train.num_steps` (scaled by the variant's steps factor where its steps cost more or
less time), a warm-up of --warmup-fraction of the steps (0: the experiment's own; or what a
choice sets), validation BLEU every --bleu-every steps and `evaluate.test_after_training=False`:
validation decides, and the held-out test split is read once, by the final run of the recipe
kept. Up to --parallel variants run at a
time, each under `taskset` on one core of its own, so each has the same compute whatever the
others do; a variant is compared with the others at the same minutes of its own training loop
(`plots.training_minutes`, from its metrics.jsonl), not at the same step.

Prints, per variant: its overrides, steps, training-loop minutes and whole-command minutes, and
the validation BLEU (beam 4, the 500 validation sentences) at each evaluation with its minute;
then one JSON line per variant. Workdirs stay under --root (a variant whose workdir has a
finished run is not run again, only reported), so rounds can add variants one at a time.
Nothing is asserted: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_mt.evaluation import plots  # noqa: E402
from transformer_mt.workdir import metrics_log  # noqa: E402

# choice -> (overrides on top of the experiment, factor on the steps for equal wall time). A
# variant is one choice or several joined by "+" (their overrides in order, factors multiplied).
# Every variant warms up for WARMUP_FRACTION of its steps, as the experiment does (400 of 800),
# unless a choice sets another fraction ("warm20") or train.warmup_steps itself.
WARMUP_FRACTION = 0.5
CHOICES: dict[str, tuple[list[str], float]] = {
  "today": ([], 1.0),
  "cosine": (["train.schedule='cosine'"], 1.0),
  # A fifth of the steps to warm up, to the same peak: the peak is
  # lr_scale * d_model^-0.5 * warmup^-0.5, so lr_scale 0.7 * sqrt(0.2 / 0.5).
  "warm20": (["WARMUP_FRACTION=0.2", "train.lr_scale=0.4427"], 1.0),
  "vocab4k": (["tokenizer.vocab_size=4000"], 1.0),
  "vocab2k": (["tokenizer.vocab_size=2000"], 1.0),
  "batch2k": (["train.batch_tokens=2048"], 2.0),
  "batch1k": (["train.batch_tokens=1024"], 4.0),
  "dropout": (
    ["model.dropout_rate=0.2", "model.attention_dropout_rate=0.1", "model.relu_dropout_rate=0.1"],
    1.0,
  ),
  "dropout03": (
    ["model.dropout_rate=0.3", "model.attention_dropout_rate=0.1", "model.relu_dropout_rate=0.1"],
    1.0,
  ),
  "dropout0": (["model.dropout_rate=0.0"], 1.0),
  # The 35,579 WMT news test-set pairs of news/en-de (DE->EN) as more training data
  # (data.extra_train_prefixes; none shares a sentence with a held-out pair).
  "news": (["data.extra_train_prefixes=['news/en-de/*']", "data.extra_train_langs='de,en'"], 1.0),
  # The 12,681 Tatoeba English-French pairs as FR->EN training pairs: more in-domain English
  # for the decoder (a many-to-one model; no language tag is needed with one target language).
  "fra": (
    ["data.extra_train_prefixes=['tatoeba/eng-fra']", "data.extra_train_langs='fra,eng'"],
    1.0,
  ),
  "smooth02": (["train.label_smoothing=0.2"], 1.0),
  # LayerNorm before each sub-layer (and after each stack), which tolerates a short warm-up.
  "preln": (["model.layer_norm_position='pre'"], 1.0),
  "lr1": (["train.lr_scale=1.0"], 1.0),
  # The final run's own warm-up (400 steps), for variants run at its full budget (--steps 1800
  # on top of the experiment's 2048 slots) instead of half the steps.
  "warm400": (["train.warmup_steps=400"], 1.0),
  # multi30k_ende's choices (its own warm-up: --warmup-fraction 0).
  "seed1": (["train.seed=1"], 1.0),
  "drop02": (["model.dropout_rate=0.2"], 1.0),
  "vocab6k": (["tokenizer.vocab_size=6000"], 1.0),
  # The published batch (7,296 slots): 0.56x the steps of 4,096 slots in the same time.
  "batch7k": (["train.batch_tokens=7296"], 0.56),
  # Peak 5e-3 (the published one) at warm-up 800: lr_scale = 5e-3 * sqrt(128 * 800).
  "lr5e3": (["train.lr_scale=1.6"], 1.0),
  # The published row's fairseq details (config/multi30k.py), which multi30k_ende leaves out:
  # positions from 2, sines then cosines; LayerNorm eps 1e-5; Q/K/V init gain 1/sqrt(2); clip
  # 25. At equal tokens the published row's validation BLEU is ~1 above the laptop recipe's.
  "fairseq": (
    [
      "model.position_encoding='sinusoidal_fairseq'",
      "model.position_offset=2",
      "model.layer_norm_epsilon=1e-5",
      f"model.qkv_init_gain={2**-0.5!r}",
      "train.grad_clip_norm=25.0",
    ],
    1.0,
  ),
}


def variant(name: str) -> tuple[list[str], float]:
  """The overrides and the steps factor of `name` ("cosine+vocab4k": both choices)."""
  overrides, factor = [], 1.0
  for choice in name.split("+"):
    if choice not in CHOICES:
      raise ValueError(f"unknown choice {choice!r} in {name!r}; choices: {', '.join(CHOICES)}")
    overrides += CHOICES[choice][0]
    factor *= CHOICES[choice][1]
  return overrides, factor


def command(
  name: str,
  steps: int,
  root: str,
  bleu_every: int = 100,
  experiment: str = "tatoeba_deen",
  warmup_fraction: float = WARMUP_FRACTION,
) -> list[str]:
  overrides, factor = variant(name)
  num_steps = round(steps * factor)
  fraction = warmup_fraction
  for override in overrides:
    if override.startswith("WARMUP_FRACTION="):
      fraction = float(override.split("=", 1)[1])
  keys = [o for o in overrides if not o.startswith("WARMUP_FRACTION=")]
  if fraction and not any(o.startswith("train.warmup_steps=") for o in keys):
    keys.insert(0, f"train.warmup_steps={round(num_steps * fraction)}")
  return [
    sys.executable,
    "run.py",
    "train",
    "--experiment",
    experiment,
    "--workdir",
    os.path.join(root, name),
    f"train.num_steps={num_steps}",
    "evaluate.test_after_training=False",
    f"train.bleu_every={bleu_every}",
    *keys,
  ]


def finished(workdir: str) -> bool:
  return os.path.exists(os.path.join(workdir, "done.json"))


def run_all(names: list[str], steps: int, root: str, parallel: int, bleu_every: int, **kw) -> None:
  """Runs the variants not finished yet, `parallel` at a time, each on its own core."""
  pending = [name for name in names if not finished(os.path.join(root, name))]
  running: dict[int, tuple[str, subprocess.Popen, float]] = {}
  while pending or running:
    free = [core for core in range(parallel) if core not in running]
    while pending and free:
      name, core = pending.pop(0), free.pop(0)
      workdir = os.path.join(root, name)
      log = open(workdir + ".log", "w")  # noqa: SIM115 - closed with the process
      argv = [
        "taskset",
        "-c",
        str(core % os.cpu_count()),
        *command(name, steps, root, bleu_every, **kw),
      ]
      print(f"start {name} on core {core}: {' '.join(argv[3:])}", flush=True)
      process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
      running[core] = (name, process, time.perf_counter())
    time.sleep(2)
    for core, (name, process, start) in list(running.items()):
      if process.poll() is None:
        continue
      del running[core]
      seconds = time.perf_counter() - start
      print(f"done {name}: exit {process.returncode}, {seconds / 60:.1f} min", flush=True)
      if process.returncode == 0:
        with open(os.path.join(root, name, "done.json"), "w") as f:
          json.dump({"command_minutes": round(seconds / 60, 2)}, f)


def report(name: str, steps: int, root: str) -> dict | None:
  workdir = os.path.join(root, name)
  if not finished(workdir):
    return None
  records = metrics_log.read_metrics(workdir)
  step_list, minutes = plots.training_minutes(records)
  minute_at = dict(zip(step_list, minutes))
  bleu = [
    (int(r["step"]), round(minute_at.get(int(r["step"]), float("nan")), 1), r["validation/bleu"])
    for r in records
    if "validation/bleu" in r
  ]
  with open(os.path.join(workdir, "done.json")) as f:
    command_minutes = json.load(f)["command_minutes"]
  overrides, factor = variant(name)
  return {
    "variant": name,
    "overrides": overrides,
    "steps": round(steps * factor),
    "loop_minutes": round(minutes[-1], 1) if minutes else None,
    "command_minutes": command_minutes,
    "validation_bleu": bleu,  # (step, loop minute, BLEU)
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", nargs="+", default=["today", "cosine"], help="e.g. a+b")
  parser.add_argument("--steps", type=int, default=400, help="train.num_steps at factor 1")
  parser.add_argument("--parallel", type=int, default=2, help="variants run at a time")
  parser.add_argument("--bleu-every", type=int, default=100, help="validation BLEU every N")
  parser.add_argument("--root", default="workdirs/recipe_ablation", help="workdirs go here")
  parser.add_argument("--experiment", default="tatoeba_deen", help="the experiment varied")
  parser.add_argument(
    "--warmup-fraction",
    type=float,
    default=WARMUP_FRACTION,
    help="warm-up as a fraction of the steps (0: the experiment's own)",
  )
  parser.add_argument("--report-only", action="store_true", help="run nothing, report")
  args = parser.parse_args()
  for name in args.variants:
    try:
      variant(name)  # an unknown choice stops here, before anything runs
    except ValueError as e:
      parser.error(str(e))
  root = os.path.abspath(args.root)
  os.makedirs(root, exist_ok=True)
  if not args.report_only:
    run_all(
      args.variants,
      args.steps,
      root,
      args.parallel,
      args.bleu_every,
      experiment=args.experiment,
      warmup_fraction=args.warmup_fraction,
    )
  rows = [row for name in args.variants if (row := report(name, args.steps, root))]
  for row in rows:
    curve = "  ".join(f"{bleu:.2f}@{minute}m" for _, minute, bleu in row["validation_bleu"])
    print(
      f"{row['variant']:<10} steps {row['steps']:>5}  loop {row['loop_minutes']} min  "
      f"command {row['command_minutes']} min  validation BLEU {curve}"
    )
  for row in rows:
    print(json.dumps(row))


if __name__ == "__main__":
  main()

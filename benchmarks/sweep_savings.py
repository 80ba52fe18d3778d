"""Does a sweep with TPE and ASHA pruning find random search's best validation BLEU in fewer
training steps? The same space and trial budget searched twice per seed, on a real task on CPU.

    python benchmarks/sweep_savings.py [--budget 6] [--seeds 2] [--steps 400] [--root DIR]
                                       [--reduction_factor 3] [--min_resource STEPS/5]
                                       [--bleu_sentences 200]
    python benchmarks/sweep_savings.py --tiny     # the demo's synthetic pair, ~1 min (CI)

The searches, each a `run.py sweep` worker in this process (training/sweep.py `run`) on an
experiment file this script writes to ROOT/experiments/:
  random    sampler "random", no pruning: `--budget` draws (num_random), every trial trained to
            --steps
  TPE+ASHA  sampler "tpe", pruner "asha" (Optuna's SuccessiveHalvingPruner: min_resource
            --min_resource steps, reduction factor --reduction_factor), num_trials --budget
over the same space: train.lr_scale log-uniform in [0.1, 3], train.warmup_steps an integer in
[steps/25, steps/2], model.dropout_rate uniform in [0, 0.4] and train.label_smoothing uniform
in [0, 0.3]. Seed s (0 .. --seeds - 1) is the sweep's seed: the random draws, and TPE's.
TPE draws its first trials at random: a third of the budget, 2 to 10
(training/sweep_study.py `tpe_startup_trials`; printed under the table).

The task: tatoeba_deen (DE->EN, 15,915 training pairs of real sentences, ../shared/data) at a
trial of 1-2.5 minutes on 2 CPU cores: a pre-LayerNorm Transformer of d_model 128, 4 heads,
d_ff 512, 2+2 layers, a 4,000-piece vocabulary, 1,024 target slots a step, --steps steps
(cosine decay to 0 at the last), validation BLEU (greedy, the first --bleu_sentences of the
500 validation sentences) every --steps/5 steps and at the last, which the pruner hears, and
the 1,000 test sentences translated greedily at a finished trial's end. A pilot (500 steps,
lr_scale 0.6, warm-up 100, dropout 0.1; commit a9c4162, load 4 on 2 AMD EPYC cores) took
163 s and gave validation BLEU 0.3, 1.1, 2.8, 3.4, 4.1 at steps 100..500; post-LayerNorm
and the Multi30k tiny shape were at BLEU 2-4 after 400-500 steps in as long or longer.
--tiny: the demo experiment's synthetic pair with a 1+1-layer d_model-32 model on 2,000 pairs
(tests/helpers.py's tiny run), 20 steps, validation every 4 on 8 pairs, budget 3, one seed.

Figures, per search and seed (from the study's trials in the order they ran, each trial's
training steps from its trial.json, its wall time from the study's start and end times):
  steps spent, wall s     over all the search's trials
  best valid. BLEU        the study's best value: the best validation BLEU at a finished
                          trial's last step (the trial a search hands over)
  steps / wall s to       the training steps (and wall seconds) the search had spent when a
  random's best           validation BLEU at least random search's best value was first
                          reported: the steps of the trials before it plus the step within the
                          trial (the study's intermediate values); the wall seconds are the
                          earlier trials' plus that trial's share pro rata by steps (an
                          estimate). A search that never reached it shows "not reached".
  test BLEU               the held-out test BLEU of the best trial, so that a search that
                          picked a trial by validation noise shows
Then the ratio steps(TPE+ASHA) / steps(random) to random's best, of the means over seeds, and
whether the project's goal holds: TPE+ASHA reaches random's best in at most 1/3 of random's
steps and ends at least as high (means over seeds). Prints the machine, a markdown table, the
ratio, the goal, then one JSON line.

ROOT is --root (kept; a sweep already there with the same settings is picked up where it
stopped, a finished one only read again), or a temporary folder deleted at the end. Figures
depend on the machine and its load (the load average is printed); nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.timing import cpu_name  # noqa: E402

SEARCHES = {"random": "random", "tpe_asha": "TPE+ASHA"}
GOAL_RATIO = 1 / 3

# The task: tatoeba_deen shrunk to a trial of 1-2.5 minutes on 2 CPU cores (the module docstring).
TASK = "tatoeba_deen"
TASK_OVERRIDES = [
  "model.layer_norm_position='pre'",
  "model.d_model=128",
  "model.num_heads=4",
  "model.d_ff=512",
  "model.num_encoder_layers=2",
  "model.num_decoder_layers=2",
  "tokenizer.vocab_size=4000",
  "tokenizer.sample_size=20000",
  "train.batch_tokens=1024",
  "train.eval_every=0",
  "train.log_every=50",
  "train.keep_checkpoints=1",
  "decode.beam_size=1",
  "decode.max_len=64",
]
# --tiny: the demo with tests/helpers.py's tiny run (a 1+1-layer d_model-32 model, 2000 pairs).
TINY_TASK = "demo"
TINY_OVERRIDES = [
  "model.d_model=32",
  "model.num_heads=2",
  "model.d_ff=64",
  "model.num_encoder_layers=1",
  "model.num_decoder_layers=1",
  "data.num_train=2000",
  "data.num_eval=8",
  "data.num_validation=8",
  "tokenizer.vocab_size=300",
  "tokenizer.sample_size=2000",
  "train.batch_tokens=256",
  "train.log_every=5",
  "train.keep_checkpoints=1",
  "decode.max_len=24",
  "decode.beam_size=1",
]


def space(steps: int) -> dict[str, str]:
  """key -> its distribution, as the experiment file's source (config/search_space.py)."""
  return {
    "train.lr_scale": "log_uniform(0.1, 3.0)",
    "train.warmup_steps": f"randint({max(1, steps // 25)}, {max(2, steps // 2)})",
    "model.dropout_rate": "uniform(0.0, 0.4)",
    "train.label_smoothing": "uniform(0.0, 0.3)",
  }


def sweep_source(search: str, args, seed: int) -> str:
  """The `Sweep(...)` of one search, as source."""
  random = "{" + ", ".join(f"{k!r}: {v}" for k, v in space(args.steps).items()) + "}"
  if search == "random":
    return f"Sweep(random={random}, sampler='random', num_random={args.budget}, seed={seed})"
  settings = {"min_resource": args.min_resource, "reduction_factor": args.reduction_factor}
  return (
    f"Sweep(random={random}, sampler='tpe', pruner='asha', pruner_settings={settings!r}, "
    f"num_trials={args.budget}, seed={seed})"
  )


def write_experiment(folder: str, task: str, search: str, args, seed: int) -> str:
  """An experiment file: `task`'s config with the search's sweep. One file per search and seed:
  the registry loads a file once per process."""
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, f"{search}_seed{seed}.py")
  text = (
    "from transformer_mt.config import registry\n"
    "from transformer_mt.config.search_space import Sweep, log_uniform, randint, uniform\n\n\n"
    f"def get_config():\n  return registry.experiment_module({task!r}).get_config()\n\n\n"
    f"def get_sweep():\n  return {sweep_source(search, args, seed)}\n"
  )
  if not os.path.exists(path) or pathlib.Path(path).read_text() != text:
    pathlib.Path(path).write_text(text)
  return path


def overrides(args) -> list[str]:
  """Every trial's settings: the task's, the trial length and its validations."""
  every = max(1, args.steps // 5)
  return [
    *(TINY_OVERRIDES if args.tiny else TASK_OVERRIDES),
    f"train.num_steps={args.steps}",
    f"train.bleu_every={every}",
    f"train.bleu_sentences={args.bleu_sentences}",
    f"train.checkpoint_every={args.steps}",
  ]


# --- the figures ---------------------------------------------------------------------------------


def summarize(study, root: str) -> dict:
  """A search's figures (module docstring) and its validation points: (steps spent so far,
  wall s so far, BLEU) for every reported value, in the order the trials ran."""
  from transformer_mt.evaluation import reports
  from transformer_mt.training import sweep

  counts = {"finished": 0, "pruned": 0, "failed": 0}
  points, steps_spent, wall_spent = [], 0, 0.0
  for trial in sorted(study.trials, key=lambda t: t.number):
    status = reports.trial_status(sweep.trial_dir(root, trial.number)) or {}
    counts[status.get("status", "failed")] += 1
    steps = status.get("steps") or max(trial.intermediate_values, default=0)
    wall = 0.0
    if trial.datetime_start and trial.datetime_complete:
      wall = (trial.datetime_complete - trial.datetime_start).total_seconds()
    for step, value in sorted(trial.intermediate_values.items()):
      points.append((steps_spent + step, wall_spent + wall * step / max(steps, 1), value))
    steps_spent += steps
    wall_spent += wall
  finished = [t for t in study.trials if t.value is not None]
  best = max(finished, key=lambda t: t.value) if finished else None
  best_status = reports.trial_status(sweep.trial_dir(root, best.number)) if best else None
  return {
    "trials": counts,
    "steps": steps_spent,
    "wall_s": wall_spent,
    "best_validation_bleu": best.value if best else None,
    "best_trial": best.number if best else None,
    "best_params": dict(best.params) if best else None,
    "test_bleu": (best_status or {}).get("test_bleu"),
    "points": points,
  }


def reach(summary: dict, target: float | None) -> tuple[int | None, float | None]:
  """(steps, wall s) the search had spent when a validation BLEU >= target was first reported."""
  if target is None:
    return None, None
  for steps, wall, value in summary["points"]:
    if value >= target:
      return steps, wall
  return None, None


def mean(values):
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else None


def fmt(value, spec: str = ".2f", missing: str = "–") -> str:
  return missing if value is None else format(value, spec)


def report(results: dict, seeds: list[int], budget: int) -> dict:
  """Prints the table, the ratio and the goal; returns them for the JSON line."""
  for seed in seeds:
    target = results["random"][seed]["best_validation_bleu"]
    for search in SEARCHES:
      summary = results[search][seed]
      summary["target"] = target
      summary["steps_to_target"], summary["wall_to_target"] = reach(summary, target)
  print(
    "| search | seed | trials finished / pruned / failed | steps spent | wall s "
    "| best valid. BLEU (trial) | steps to random's best | wall s to it | its test BLEU |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  averages = {}
  for search, label in SEARCHES.items():
    for seed in seeds:
      s = results[search][seed]
      trials = " / ".join(str(s["trials"][k]) for k in ("finished", "pruned", "failed"))
      best = fmt(s["best_validation_bleu"])
      if s["best_trial"] is not None:
        best += f" (trial_{s['best_trial']:03d})"
      reached = fmt(s["steps_to_target"], "d", "not reached")
      print(
        f"| {label} | {seed} | {trials} | {s['steps']} | {s['wall_s']:.0f} | {best} | {reached} "
        f"| {fmt(s['wall_to_target'], '.0f')} | {fmt(s['test_bleu'])} |"
      )
  for search, label in SEARCHES.items():
    rows = [results[search][seed] for seed in seeds]
    all_reached = all(r["steps_to_target"] is not None for r in rows)
    averages[search] = {
      key: mean(r[key] for r in rows)
      for key in ("steps", "wall_s", "best_validation_bleu", "test_bleu")
    }
    for key in ("steps_to_target", "wall_to_target"):
      averages[search][key] = mean(r[key] for r in rows) if all_reached else None
    a = averages[search]
    print(
      f"| {label} | mean | | {a['steps']:.0f} | {a['wall_s']:.0f} "
      f"| {fmt(a['best_validation_bleu'])} | {fmt(a['steps_to_target'], '.0f', 'not reached')} "
      f"| {fmt(a['wall_to_target'], '.0f')} | {fmt(a['test_bleu'])} |"
    )
  random, tpe = averages["random"], averages["tpe_asha"]
  per_seed = []
  for seed in seeds:
    ours, theirs = results["tpe_asha"][seed], results["random"][seed]
    if ours["steps_to_target"] is None or not theirs["steps_to_target"]:
      per_seed.append(None)
    else:
      per_seed.append(ours["steps_to_target"] / theirs["steps_to_target"])
  ratio = None
  if tpe["steps_to_target"] is not None and random["steps_to_target"]:
    ratio = tpe["steps_to_target"] / random["steps_to_target"]
  shown = ", ".join(fmt(r, ".2f", "not reached") for r in per_seed)
  if ratio is None:
    bound = ""
    if random["steps_to_target"]:
      # Not reached in some seed: at least the steps it spent there.
      lower = mean(
        r["steps_to_target"] if r["steps_to_target"] is not None else r["steps"]
        for r in (results["tpe_asha"][seed] for seed in seeds)
      )
      bound = f" (> {lower / random['steps_to_target']:.2f})"
    ratio_text = f"not reached in every seed{bound}"
  else:
    ratio_text = f"{ratio:.2f}"
  print(
    f"ratio steps(TPE+ASHA) / steps(random) to random's best validation BLEU: {ratio_text} "
    f"(means over {len(seeds)} seed(s); per seed: {shown}); goal <= {GOAL_RATIO:.2f}"
  )
  reasons = []
  if ratio is None:
    reasons.append("TPE+ASHA did not reach random's best in every seed")
  elif ratio > GOAL_RATIO:
    reasons.append(f"it took {ratio:.2f} of random's steps, more than 1/3")
  ours_best, theirs_best = tpe["best_validation_bleu"], random["best_validation_bleu"]
  if ours_best is None or theirs_best is None or ours_best < theirs_best:
    reasons.append(
      f"it ended lower ({fmt(ours_best)} against random's {fmt(theirs_best)} validation BLEU)"
    )
  met = not reasons
  print(
    "goal (TPE+ASHA reaches random's best in <= 1/3 of its steps and ends at least as high): "
    + ("met" if met else "not met: " + "; ".join(reasons))
  )
  from transformer_mt.training.sweep_study import tpe_startup_trials

  print(
    f"note: TPE drew its first {tpe_startup_trials(budget)} of {budget} trials at random "
    "(n_startup_trials), then from its model of the trials before."
  )
  return {"averages": averages, "ratio": ratio, "ratio_per_seed": per_seed, "goal_met": met}


# --- the command ---------------------------------------------------------------------------------


def run_searches(args, root: str) -> dict:
  """{search: {seed: summary}}: each search of each seed run (or picked up) in ROOT."""
  from transformer_mt.training import sweep

  task = TINY_TASK if args.tiny else TASK
  results = {search: {} for search in SEARCHES}
  for seed in range(args.seeds):
    for search, label in SEARCHES.items():
      experiment = write_experiment(os.path.join(root, "experiments"), task, search, args, seed)
      folder = os.path.join(root, f"{search}_seed{seed}")
      start = time.perf_counter()
      study = sweep.run(experiment, folder, overrides(args))
      results[search][seed] = summary = summarize(study, folder)
      print(
        f"{label}, seed {seed}: {sum(summary['trials'].values())} trials, {summary['steps']} "
        f"steps, best validation BLEU {fmt(summary['best_validation_bleu'])} "
        f"({time.perf_counter() - start:.0f} s in this process; {folder})",
        flush=True,
      )
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--budget", type=int, default=6, help="trials per search (default 6)")
  parser.add_argument("--seeds", type=int, default=2, help="seeds 0 .. N-1 per search")
  parser.add_argument("--steps", type=int, default=400, help="training steps of a whole trial")
  parser.add_argument(
    "--min_resource", type=int, default=0, help="ASHA's first rung, in steps (0: steps / 5)"
  )
  parser.add_argument("--reduction_factor", type=int, default=3, help="ASHA's reduction factor")
  parser.add_argument(
    "--bleu_sentences", type=int, default=200, help="validation sentences per BLEU (0: all)"
  )
  parser.add_argument("--root", default="", help="where the sweeps go (kept); default: temporary")
  parser.add_argument(
    "--tiny", action="store_true", help="the demo's synthetic pair, toy model, ~1 min (CI)"
  )
  args = parser.parse_args(argv)
  if args.tiny:
    args.budget, args.seeds, args.steps, args.bleu_sentences = 3, 1, 20, 0
  args.min_resource = args.min_resource or max(1, args.steps // 5)
  if not args.tiny:  # (a --tiny run in a test process leaves JAX's configuration alone)
    from transformer_mt.runtime import compile_cache

    compile_cache.enable()
  import jax

  device = jax.devices()[0]
  print(
    f"machine: {cpu_name()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
    f"jax {jax.__version__} on {device.device_kind} ({device.platform})"
  )
  task = TINY_TASK if args.tiny else TASK
  print(
    f"task: {task}, {args.steps} steps a trial, validation BLEU every {max(1, args.steps // 5)}; "
    f"budget {args.budget} trials per search, seeds 0..{args.seeds - 1}; ASHA min_resource "
    f"{args.min_resource}, reduction factor {args.reduction_factor}",
    flush=True,
  )
  root = args.root or tempfile.mkdtemp(prefix="sweep_savings_")
  start = time.perf_counter()
  try:
    results = run_searches(args, root)
  finally:
    if not args.root:
      shutil.rmtree(root, ignore_errors=True)
  seeds = list(range(args.seeds))
  print()
  outcome = report(results, seeds, args.budget)
  print(f"wall {time.perf_counter() - start:.0f} s; load average after: {os.getloadavg()[0]:.2f}")
  for by_seed in results.values():
    for summary in by_seed.values():
      summary.pop("points")
  record = {
    "benchmark": "sweep_savings",
    "cpu": cpu_name(),
    "task": task,
    "overrides": overrides(args),
    "space": space(args.steps),
    "budget": args.budget,
    "seeds": seeds,
    "steps": args.steps,
    "asha": {"min_resource": args.min_resource, "reduction_factor": args.reduction_factor},
    "results": {search: {str(k): v for k, v in r.items()} for search, r in results.items()},
    **outcome,
  }
  print(json.dumps(record))
  return 0


if __name__ == "__main__":
  sys.exit(main())

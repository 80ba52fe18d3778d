"""`run.py list`: the experiments, with parameter counts and training-time estimates.

Named list_experiments because a module `list.py` would shadow the builtin inside the package.
"""

from __future__ import annotations


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "list", help="list experiments with parameter counts and training-time estimates"
  )
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.config import registry
  from transformer_mt.model import estimates

  rows = []
  for name in registry.experiment_names():
    config = registry.load_experiment(name)
    # A published model's size is its own, known once imported (the description gives it).
    reason = estimates.not_estimated(config)
    estimate = None if reason else estimates.estimate(config)
    rows.append((name, estimate, config.description))
  width = max(len(r[0]) for r in rows)
  print(f"{'experiment':<{width}}  {'params':>8}  {'A100 h':>8}  description")
  for name, estimate, description in rows:
    size = f"{estimate.total_params / 1e6:>7.2f}M" if estimate else f"{'import':>8}"
    hours = f"{estimate.hours:>8.3g}" if estimate else f"{'-':>8}"
    print(f"{name:<{width}}  {size}  {hours}  {description}")
  print(
    "Parameter counts include the embeddings; a tied (shared) embedding matrix is counted once. "
    "'import': a published model, imported by `reproduce`.\n"
    f"A100 h: training hours on one {estimates.DEVICE} at {estimates.UTILIZATION:.0%} of the "
    "peak of the dtype the row computes in on the GPU (float32: TF32; bfloat16, and 'auto' "
    "as the paper rows set it: bf16; see "
    "transformer_mt/model/estimates.py); `reproduce --dry-run` shows the formula and its numbers."
  )

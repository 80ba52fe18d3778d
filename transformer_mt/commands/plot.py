"""`run.py plot`: a PNG of a workdir's loss, learning-rate and BLEU curves."""

from __future__ import annotations

import os


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("plot", help="PNG of loss / learning-rate / BLEU curves of a workdir")
  p.add_argument("workdir")
  p.add_argument("--output", default=None, help="PNG path (default: WORKDIR/curves.png)")
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.evaluation import plots

  output = args.output or os.path.join(args.workdir, "curves.png")
  series = plots.training_curves(args.workdir, output)
  print(f"wrote {output} ({', '.join(series)})")

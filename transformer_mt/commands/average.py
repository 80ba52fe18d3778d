"""`run.py average`: the mean of the parameters of a workdir's last N checkpoints, as the paper
averages (5 for the base model, 20 for the big one)."""

from __future__ import annotations


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("average", help="average the parameters of the last N checkpoints")
  p.add_argument("--workdir", required=True)
  p.add_argument(
    "--last", type=int, required=True, help="number of checkpoints (paper: 5 base, 20 big)"
  )
  p.add_argument(
    "--output", default=None, help="output directory (default: WORKDIR/averaged_lastN)"
  )
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.workdir import averaging

  output, steps = averaging.average_last(args.workdir, args.last, args.output)
  print(f"Averaged steps {steps} into {output} (use it as --workdir for translate/evaluate).")

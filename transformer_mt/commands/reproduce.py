"""`run.py reproduce`: train -> average -> evaluate one row of the paper's tables, writing
WORKDIR/results.json; `--dry-run` prints the plan and the accelerator-time estimate."""

from __future__ import annotations

import os

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "reproduce",
    help="train -> average -> evaluate a table row, writing WORKDIR/results.json",
    parents=[flags.force_unlock_flag()],
  )
  p.add_argument(
    "--experiment", required=True, help="experiment name, e.g. transformer_base_wmt14_ende"
  )
  p.add_argument("--workdir", required=True)
  p.add_argument(
    "--dry-run",
    action="store_true",
    help="print the plan (steps, averaging, evaluation) and the accelerator-time estimate; "
    "train and write nothing",
  )
  p.add_argument("overrides", nargs="*", metavar="key=value")
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.evaluation import reports
  from transformer_mt.training import reproduce

  if args.dry_run:
    print(reproduce.plan(args.experiment, args.workdir, args.overrides))
    return
  results = reproduce.reproduce(
    args.experiment, args.workdir, args.overrides, force_unlock=args.force_unlock
  )
  print(reports.markdown_table([results]))
  print(f"results: {os.path.join(args.workdir, reports.RESULTS_FILENAME)}")

"""`run.py sweep`: an experiment's hyperparameter sweep, one workdir per trial.

Resumes what is already done; `--dry-run` prints one command per trial (for a SLURM job
array), and `--trial i` runs only that one.
"""

from __future__ import annotations

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "sweep",
    help="run an experiment's hyperparameter sweep, one workdir "
    "per trial (resumes; --dry-run prints the commands)",
    parents=[flags.force_unlock_flag()],
  )
  p.add_argument("--experiment", required=True, help="experiment declaring get_sweep(), e.g. demo")
  p.add_argument("--workdir", required=True, help="sweep root: ROOT/trial_000, ROOT/trial_001...")
  p.add_argument(
    "--parallel",
    type=int,
    default=1,
    help="trials at once, each on its own 1/K of the local devices (default 1)",
  )
  p.add_argument(
    "--trial", type=int, default=None, help="run only trial i (e.g. $SLURM_ARRAY_TASK_ID)"
  )
  p.add_argument(
    "--dry-run",
    action="store_true",
    help="print one command per trial (for a SLURM job array) and exit",
  )
  p.add_argument("--metric", default="bleu", help=flags.METRIC_HELP)
  p.add_argument(
    "overrides",
    nargs="*",
    metavar="key=value",
    help="overrides applied to every trial, e.g. train.num_steps=200",
  )
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.evaluation import reports
  from transformer_mt.training import sweep

  reports.check_metric(args.metric)
  if args.dry_run:
    print("\n".join(sweep.dry_run_commands(args.experiment, args.workdir, args.overrides)))
    return
  statuses = sweep.run(
    args.experiment,
    args.workdir,
    args.overrides,
    args.parallel,
    args.trial,
    force_unlock=args.force_unlock,
  )
  if args.trial is None:
    print(reports.ranking_table(args.workdir, args.metric))
  else:
    print(f"trial {args.trial}: {statuses[args.trial]['status']}")

"""`run.py sweep`: one worker (or `--parallel K` on this host) of an experiment's
hyperparameter sweep on an Optuna study, one workdir per trial.

Every worker asks the study for trials until its budget is spent; rerunning the command
resumes what a stopped worker left running. The study is a journal file in the root, or the
database `--storage` names, which the workers of a cluster job share.
"""

from __future__ import annotations

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "sweep",
    help="work on an experiment's hyperparameter sweep (an Optuna study), one workdir per "
    "trial, until its trial budget is spent (resumes)",
    parents=[flags.distributed_flags(), flags.force_unlock_flag()],
  )
  p.add_argument("--experiment", required=True, help="experiment declaring get_sweep(), e.g. demo")
  p.add_argument("--workdir", required=True, help="sweep root: ROOT/trial_000, ROOT/trial_001...")
  p.add_argument(
    "--parallel",
    type=int,
    default=1,
    help="workers at once, each on its own 1/K of the local devices (default 1)",
  )
  p.add_argument(
    "--storage",
    default=None,
    help="the study's storage, shared by the workers of a cluster: an SQLAlchemy URL "
    "(postgresql://user:password@host/db) or a journal file; default ROOT/study.journal",
  )
  p.add_argument(
    "--dry-run",
    action="store_true",
    help="print the sweep (space, sampler, pruner, budget, study) and the command each worker "
    "runs (e.g. every task of a SLURM job array), and exit; writes nothing",
  )
  p.add_argument(
    "overrides",
    nargs="*",
    metavar="key=value",
    help="overrides applied to every trial, e.g. train.num_steps=200",
  )
  p.set_defaults(func=run)


def run(args) -> None:
  import json

  from transformer_mt.evaluation import sweep_report
  from transformer_mt.runtime import distributed, errors
  from transformer_mt.training import sweep

  if args.parallel > 1 and (args.coordinator_address or args.multihost):
    raise errors.BadValue(
      "--parallel K starts K one-process workers on this host; a worker whose trials span "
      "several processes takes --coordinator_address/--num_processes/--process_id (or SLURM's "
      "tasks) without --parallel."
    )
  if args.dry_run:
    _, record = sweep.prepare(args.experiment, args.workdir, args.overrides, args.storage)
    print(json.dumps(record, indent=2))
    print(sweep.worker_command(args.experiment, args.workdir, args.overrides, args.storage))
    return
  if args.parallel == 1:  # a worker (the --parallel parent starts its workers instead)
    from transformer_mt.commands.train import initialize_distributed

    initialize_distributed(args)
  sweep.run(
    args.experiment,
    args.workdir,
    args.overrides,
    args.parallel,
    storage=args.storage,
    force_unlock=args.force_unlock,
  )
  if args.parallel > 1 or distributed.is_primary():  # (the parent starts no JAX backend)
    print(sweep_report.table(args.workdir, args.storage))

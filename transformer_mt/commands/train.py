"""`run.py train`: train (or resume) an experiment in a workdir, on one process or many."""

from __future__ import annotations

import os

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "train",
    help="train (or resume) an experiment in a workdir",
    parents=[flags.distributed_flags(), flags.force_unlock_flag()],
  )
  p.add_argument("--experiment", default="demo", help="experiment name (see `list`)")
  p.add_argument("--workdir", required=True, help="checkpoints, metrics and tokenizer go here")
  p.add_argument(
    "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.num_steps=100"
  )
  p.set_defaults(func=run)


def initialize_distributed(args) -> None:
  """Joins the multi-process run the flags (or SLURM, Open MPI, a TPU VM) describe, before
  anything touches a device."""
  from transformer_mt.runtime import distributed

  distributed.initialize(
    args.coordinator_address,
    args.num_processes,
    args.process_id,
    args.multihost,
    args.no_multihost,
  )


def run(args) -> None:
  initialize_distributed(args)
  from transformer_mt.config import registry
  from transformer_mt.runtime import distributed
  from transformer_mt.training import train

  config = registry.load_experiment(args.experiment, args.overrides)
  result = train.train(config, args.workdir, force_unlock=args.force_unlock)
  if not distributed.is_primary():
    return
  done = f"Done: step {result['step']}, checkpoints in {os.path.join(args.workdir, 'checkpoints')}"
  if os.path.abspath(result["final_model"]) != os.path.abspath(args.workdir):
    done += f"; the final model (averaged): {result['final_model']}"
  print(done)

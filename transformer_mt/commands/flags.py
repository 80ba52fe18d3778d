"""Flags that several commands share, and the helpers that read them.

Parent parsers (argparse `parents=`) for the multi-process launch, --force_unlock, --mesh and
the languages of a multilingual import; --workdir/--step of the commands that decode or score;
and the mesh and Translator those flags name. Library imports stay inside the helpers, so
building the parser imports no JAX.
"""

from __future__ import annotations

import argparse


def distributed_flags() -> argparse.ArgumentParser:
  """Flags of a multi-process launch (see transformer_mt/runtime/distributed.py)."""
  flags = argparse.ArgumentParser(add_help=False)
  group = flags.add_argument_group(
    "multi-process launch (SLURM, Open MPI and TPU VMs are detected)"
  )
  group.add_argument(
    "--coordinator_address",
    default=None,
    metavar="HOST:PORT",
    help="address of process 0, the same on every process",
  )
  group.add_argument("--num_processes", type=int, default=None, help="number of processes")
  group.add_argument("--process_id", type=int, default=None, help="this process, 0..N-1")
  group.add_argument(
    "--multihost",
    action="store_true",
    help="let JAX detect another cluster it supports (e.g. Kubernetes)",
  )
  group.add_argument(
    "--no_multihost",
    action="store_true",
    help="run as one process even where SLURM, Open MPI or a TPU VM is detected",
  )
  return flags


def force_unlock_flag() -> argparse.ArgumentParser:
  """--force_unlock of the commands that write a run (see transformer_mt/workdir/lock.py)."""
  flags = argparse.ArgumentParser(add_help=False)
  flags.add_argument(
    "--force_unlock",
    action="store_true",
    help="take over the workdir's writer lock (WORKDIR/writer.lock) left by a run on another "
    "host that is known to be dead; a lock of a live run on this host is never taken, and "
    "one of a dead run on this host is taken over without this flag",
  )
  return flags


def mesh_flag() -> argparse.ArgumentParser:
  """--mesh of the inference commands: they run on this machine's devices, whatever the
  training mesh was."""
  flags = argparse.ArgumentParser(add_help=False)
  flags.add_argument(
    "--mesh",
    default=None,
    metavar="AXIS=SIZE,...",
    help="device mesh to decode on, e.g. data=1,fsdp=1,tensor=1 (default: every device on "
    "the data axis, parameters replicated); the checkpoint's training mesh is not used",
  )
  return flags


def language_flags() -> argparse.ArgumentParser:
  """--src_lang/--tgt_lang: the languages of a multilingual import (mBART, NLLB)."""
  flags = argparse.ArgumentParser(add_help=False)
  for flag, side in (("--src_lang", "source"), ("--tgt_lang", "target")):
    flags.add_argument(
      flag,
      default=None,
      metavar="CODE",
      help=f"{side} language code of an imported mBART or NLLB model, e.g. en_XX or eng_Latn; "
      f"import saves it as data.{side}_code, which translate and evaluate default to",
    )
  return flags


# Not argparse `choices`: a bad value gets the one-line `error:` of every other user error.
METRIC_HELP = (
  "rank the trials of a sweep from before Optuna by their last validation bleu (default) or "
  "chrf (trials that logged no chrF are ranked last, shown as –); a sweep on an Optuna study "
  "is ranked by the metric its get_sweep() declares"
)


def model_workdirs_flag(p: argparse.ArgumentParser, required: bool = True) -> None:
  """--workdir (repeatable: an ensemble) and --step of the commands that decode or score."""
  p.add_argument(
    "--workdir",
    action="append",
    required=required,
    help="workdir (or its checkpoints/, or an averaged checkpoint directory) of a trained or "
    "imported model; repeat it for an ensemble, which decodes from the mean of the models' "
    "log-probabilities at each step (the models must share one tokenizer; decode settings "
    "are the first workdir's)",
  )
  p.add_argument(
    "--step", type=int, default=None, help="checkpoint step of every workdir (default: latest)"
  )


def inference_mesh(args):
  """The mesh of `--mesh` over this machine's devices (see sharding.inference_mesh_config)."""
  from transformer_mt.runtime import sharding

  return sharding.make_mesh(sharding.inference_mesh_config(args.mesh))


def load_from_flags(args, beam_size: int | None = None, decode_overrides=()):
  """The Translator (or ensemble) named by the flags `translate` and `score` share: --workdir
  (repeatable), --step, --mesh, --alpha, --src_lang, --tgt_lang; and translate's
  decode.KEY=VALUE overrides (checked by `loading.load_translator`)."""
  from transformer_mt.decoding import loading

  return loading.load_translator(
    args.workdir,
    args.step,
    inference_mesh(args),
    beam_size=beam_size,
    alpha=args.alpha,
    source_lang=args.src_lang,
    target_lang=args.tgt_lang,
    decode_overrides=decode_overrides,
  )

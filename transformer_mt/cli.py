"""Command line: `run.py list | train | sweep | import | translate | evaluate | score | average |
attention | plot | reproduce | report`.

Also installed as the `transformer-mt` console script.

User errors (unknown experiment or key, missing checkpoint, bad value: the errors.UserError
the project raises on purpose) print one line and exit with status 2; `--debug` shows the
traceback instead. Any other exception is a bug: its traceback, what to report, exit status 1.

Every path a user gives (flags, and the path-valued config keys in `key=value` overrides)
is made absolute (command_paths.py), relative to the current directory and with `~`
expanded, before any command runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from transformer_mt.commands import translate as translate_command

# Path resolution lives in command_paths; these names are the command line's too.
from transformer_mt.commands.paths import (  # noqa: F401
  PATH_FLAGS,
  PATH_KEYS,
  absolute_path,
  absolute_source,
  resolve_paths,
)
from transformer_mt.commands.paths import absolute_override as _absolute_override  # noqa: F401
from transformer_mt.commands.translate import inference_mesh as _inference_mesh
from transformer_mt.runtime import errors


def _cmd_list(args) -> None:
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


def _initialize_distributed(args) -> None:
  from transformer_mt.runtime import distributed

  distributed.initialize(
    args.coordinator_address,
    args.num_processes,
    args.process_id,
    args.multihost,
    args.no_multihost,
  )


def _cmd_train(args) -> None:
  _initialize_distributed(args)
  from transformer_mt.config import registry
  from transformer_mt.runtime import distributed
  from transformer_mt.training import train

  config = registry.load_experiment(args.experiment, args.overrides)
  result = train.train(config, args.workdir, force_unlock=args.force_unlock)
  if distributed.is_primary():
    print(
      f"Done: step {result['step']}, checkpoints in {os.path.join(args.workdir, 'checkpoints')}"
    )


def _cmd_import(args) -> None:
  from transformer_mt.interop import hf_import

  step_dir = hf_import.import_pretrained(
    args.from_,
    args.workdir,
    args.overrides,
    source_lang=args.src_lang,
    target_lang=args.tgt_lang,
  )
  print(f"Imported {args.from_} into {step_dir} (use --workdir {args.workdir} to translate).")


def _cmd_score(args) -> None:
  from transformer_mt.data import text_files
  from transformer_mt.decoding import teacher_forcing as scoring

  pairs = text_files.read_parallel(args.source, args.target)  # one error line on a mismatch
  translator = translate_command.load_from_flags(args)
  scores = scoring.score_lines(translator, [s for s, _ in pairs], [t for _, t in pairs])
  text = scoring.format_scores(scores)
  if args.output == "-":
    sys.stdout.write(text)
  else:
    text_files.write_atomically(args.output, text)


# The flags that choose or drive a model: meaningless when --hypotheses gives the translations.
_DECODE_FLAGS = ("workdir", "step", "split", "beam", "alpha", "limit", "mesh", "src_lang")


def _cmd_evaluate(args) -> None:
  from transformer_mt.evaluation import test_set as evaluate

  if args.hypotheses:
    given = [f"--{name}" for name in _DECODE_FLAGS if getattr(args, name) is not None]
    if given:
      raise errors.BadValue(
        f"--hypotheses scores the given translations, so {', '.join(given)} (which choose "
        "or run a model) cannot go with it: drop them, or drop --hypotheses to translate."
      )
    if not args.reference:
      raise errors.BadValue(
        "--hypotheses needs --reference, the file to score the translations on."
      )
    report = evaluate.score_translations(
      args.hypotheses, args.reference, args.tgt_lang, args.source
    )
    print(f"{report['split']}: {report['num_sentences']} given translations")
  else:
    if not args.workdir:
      raise errors.BadValue(
        "evaluate needs --workdir (a model to translate with) or --hypotheses (translations "
        "to score)."
      )
    report = evaluate.evaluate(
      args.workdir,
      args.split or "test",
      args.step,
      args.beam,
      args.alpha,
      args.source,
      args.reference,
      args.limit,
      _inference_mesh(args),
      args.src_lang,
      args.tgt_lang,
    )
    print(
      f"{report['split']}: {report['num_sentences']} sentences, step {report['step']}, "
      f"beam {report['beam_size']}, alpha {report['alpha']}, "
      f"{report['sentences_per_second']:.1f} sentences/s"
    )
  print(f"  sacreBLEU {report['sacrebleu']:.2f}  ({report['sacrebleu_signature']})")
  print(f"  paper-comparable BLEU {report['paper_bleu']:.2f}  ({report['paper_bleu_method']})")
  print(f"    multi-bleu.perl: {report['paper_bleu_multi_bleu']}")
  print(f"  chrF {report['chrf']:.2f}  ({report['chrf_signature']})")
  print(f"  chrF++ {report['chrf_plus_plus']:.2f}  ({report['chrf_plus_plus_signature']})")
  if "report_path" in report:
    print(f"  report: {report['report_path']}")


def _cmd_average(args) -> None:
  from transformer_mt.workdir import averaging

  output, steps = averaging.average_last(args.workdir, args.last, args.output)
  print(f"Averaged steps {steps} into {output} (use it as --workdir for translate/evaluate).")


def _cmd_attention(args) -> None:
  from transformer_mt.decoding import translator as translate
  from transformer_mt.evaluation import plots

  translator = translate.load_translator(
    args.workdir, args.step, _inference_mesh(args), beam_size=1
  )
  layer = args.layer if args.layer in (None, "mean") else int(args.layer)
  translation = plots.attention_heatmap(
    translator, args.src, args.output, layer=layer, head=args.head
  )
  print(f"{translation}\nwrote {args.output}")


def _cmd_plot(args) -> None:
  from transformer_mt.evaluation import plots

  output = args.output or os.path.join(args.workdir, "curves.png")
  series = plots.training_curves(args.workdir, output)
  print(f"wrote {output} ({', '.join(series)})")


def _cmd_reproduce(args) -> None:
  from transformer_mt.training import reproduce

  if args.dry_run:
    print(reproduce.plan(args.experiment, args.workdir, args.overrides))
    return
  results = reproduce.reproduce(
    args.experiment, args.workdir, args.overrides, force_unlock=args.force_unlock
  )
  print(reproduce.markdown_table([results]))
  print(f"results: {os.path.join(args.workdir, reproduce.RESULTS_FILENAME)}")


def _cmd_sweep(args) -> None:
  from transformer_mt.training import sweep

  sweep.check_metric(args.metric)
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
    print(sweep.ranking_table(args.workdir, args.metric))
  else:
    print(f"trial {args.trial}: {statuses[args.trial]['status']}")


def _cmd_report(args) -> None:
  from transformer_mt.training import reproduce, sweep

  sweep.check_metric(args.metric)
  sweeps = [w for w in args.workdirs if sweep.is_sweep_dir(w)]
  rows = [w for w in args.workdirs if w not in sweeps]
  for root in sweeps:
    print(sweep.ranking_table(root, args.metric) + "\n")
  if rows:
    print(reproduce.report(rows, args.chart))
    if args.chart:
      print(f"chart: {args.chart}")


def _distributed_flags() -> argparse.ArgumentParser:
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


def _force_unlock_flag() -> argparse.ArgumentParser:
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


def _mesh_flag() -> argparse.ArgumentParser:
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


def _language_flags() -> argparse.ArgumentParser:
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
_METRIC_HELP = (
  "rank a sweep's trials by their last validation bleu (default) or chrf; trials that "
  "logged no chrF (run before it was logged) are ranked last, shown as –"
)


def _model_workdirs_flag(p: argparse.ArgumentParser, required: bool = True) -> None:
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


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="run.py", description=__doc__.splitlines()[0])
  parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
  commands = parser.add_subparsers(dest="command", required=True)
  distributed_flags = _distributed_flags()
  force_unlock_flag = _force_unlock_flag()
  mesh_flag = _mesh_flag()
  language_flags = _language_flags()

  p = commands.add_parser(
    "list", help="list experiments with parameter counts and training-time estimates"
  )
  p.set_defaults(func=_cmd_list)

  p = commands.add_parser(
    "train",
    help="train (or resume) an experiment in a workdir",
    parents=[distributed_flags, force_unlock_flag],
  )
  p.add_argument("--experiment", default="demo", help="experiment name (see `list`)")
  p.add_argument("--workdir", required=True, help="checkpoints, metrics and tokenizer go here")
  p.add_argument(
    "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.num_steps=100"
  )
  p.set_defaults(func=_cmd_train)

  p = commands.add_parser(
    "sweep",
    help="run an experiment's hyperparameter sweep, one workdir "
    "per trial (resumes; --dry-run prints the commands)",
    parents=[force_unlock_flag],
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
  p.add_argument("--metric", default="bleu", help=_METRIC_HELP)
  p.add_argument(
    "overrides",
    nargs="*",
    metavar="key=value",
    help="overrides applied to every trial, e.g. train.num_steps=200",
  )
  p.set_defaults(func=_cmd_sweep)

  p = commands.add_parser(
    "import",
    help="convert a Hugging Face checkpoint (Marian, mBART, NLLB) and its tokenizer into a "
    "workdir that translate and evaluate use",
    parents=[language_flags],
  )
  p.add_argument(
    "--from",
    dest="from_",
    required=True,
    metavar="hf:DIR_OR_NAME",
    help="hf: then a save_pretrained directory, or a hub name (downloaded; needs the internet)",
  )
  p.add_argument("--workdir", required=True, help="a new workdir (or one without checkpoints)")
  p.add_argument(
    "overrides",
    nargs="*",
    metavar="key=value",
    help="decode.* and data.* settings saved with it, e.g. decode.beam_size=4",
  )
  p.set_defaults(func=_cmd_import)

  translate_command.add_parser(commands, [mesh_flag, language_flags], _model_workdirs_flag)

  p = commands.add_parser(
    "evaluate",
    help="translate a test set and report sacreBLEU, paper BLEU, chrF and chrF++ "
    "(or, with --hypotheses, score given translations)",
    parents=[mesh_flag, language_flags],
  )
  _model_workdirs_flag(p, required=False)
  p.add_argument("--split", default=None, help="the experiment's split to evaluate (default: test)")
  p.add_argument("--source", default=None, help="evaluate on this source file instead of --split")
  p.add_argument("--reference", default=None, help="reference file, line-aligned with --source")
  p.add_argument(
    "--hypotheses",
    default=None,
    help="score these translations (one detokenized line per --reference line) instead of "
    "translating: no --workdir, and --tgt_lang names the target language (e.g. de)",
  )
  p.add_argument("--beam", type=int, default=None, help="beam size (default: the config's)")
  p.add_argument("--alpha", type=float, default=None, help="length penalty alpha (default: config)")
  p.add_argument("--limit", type=int, default=None, help="only the first N sentences")
  p.set_defaults(func=_cmd_evaluate)

  p = commands.add_parser(
    "score",
    help="log-probability of given translations (teacher forcing): TSV rows "
    "line_index<TAB>logprob<TAB>tokens<TAB>per_token<TAB>score",
    description="Scores each (source, target) line pair by teacher forcing, as beam search "
    "would have scored that target: logprob = summed log-probability of the target tokens, "
    "tokens = their count (EOS and a forced language tag included; the tag adds 0), "
    "per_token = logprob / tokens, score = logprob / length penalty (the config's alpha and "
    "penalty). An empty source line gives tokens 0 and nan. See "
    "transformer_mt/decoding/teacher_forcing.py.",
    parents=[mesh_flag, language_flags],
  )
  _model_workdirs_flag(p)
  p.add_argument("--source", required=True, help="source file, one sentence per line")
  p.add_argument("--target", required=True, help="target file, line-aligned with --source")
  p.add_argument("--output", default="-", help="where to write the TSV rows (default: stdout)")
  p.add_argument(
    "--alpha", type=float, default=None, help="length penalty alpha of score (default: config)"
  )
  p.set_defaults(func=_cmd_score)

  p = commands.add_parser("average", help="average the parameters of the last N checkpoints")
  p.add_argument("--workdir", required=True)
  p.add_argument(
    "--last", type=int, required=True, help="number of checkpoints (paper: 5 base, 20 big)"
  )
  p.add_argument(
    "--output", default=None, help="output directory (default: WORKDIR/averaged_lastN)"
  )
  p.set_defaults(func=_cmd_average)

  p = commands.add_parser(
    "attention", help="PNG heatmap of cross-attention for one sentence", parents=[mesh_flag]
  )
  p.add_argument("--workdir", required=True)
  p.add_argument("--src", required=True, help="the source sentence")
  p.add_argument("--output", default="attention.png", help="PNG path (default: attention.png)")
  p.add_argument("--layer", default=None, help="decoder layer index, or 'mean' (default: last)")
  p.add_argument("--head", type=int, default=None, help="head index (default: mean over heads)")
  p.add_argument("--step", type=int, default=None)
  p.set_defaults(func=_cmd_attention)

  p = commands.add_parser(
    "reproduce",
    help="train -> average -> evaluate a table row, writing WORKDIR/results.json",
    parents=[force_unlock_flag],
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
  p.set_defaults(func=_cmd_reproduce)

  p = commands.add_parser(
    "report",
    help="markdown table (and PNG chart) of reproduced rows; "
    "sweep roots are ranked by validation BLEU (or --metric chrf)",
  )
  p.add_argument("workdirs", nargs="+", help="workdirs holding results.json, or sweep roots")
  p.add_argument("--chart", default=None, help="also write a PNG bar chart here")
  p.add_argument("--metric", default="bleu", help=_METRIC_HELP)
  p.set_defaults(func=_cmd_report)

  p = commands.add_parser("plot", help="PNG of loss / learning-rate / BLEU curves of a workdir")
  p.add_argument("workdir")
  p.add_argument("--output", default=None, help="PNG path (default: WORKDIR/curves.png)")
  p.set_defaults(func=_cmd_plot)
  return parser


# After the traceback of an exception transformer_mt did not raise on purpose.
BUG_REPORT = (
  "This is a bug in transformer_mt (or a fault of the machine: a full disk, a lost device or "
  "connection); please report it with the command, the traceback above and `pip freeze` output."
)


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  # Orbax reports routine facts (e.g. "directory is read only") as absl warnings.
  logging.getLogger("absl").setLevel(logging.ERROR)
  for noisy in ("jax._src", "orbax", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  # tensorstore's failed reads of a damaged checkpoint surface as unretrieved asyncio futures;
  # the damage is reported once, by name, where the checkpoint is skipped.
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)
  from transformer_mt.runtime import compile_cache

  compile_cache.enable()  # before anything compiles
  try:
    resolve_paths(args)
    args.func(args)
  except errors.UserError as e:
    if args.debug:
      raise
    print(f"error: {e}", file=sys.stderr)
    return 2
  except Exception:  # Not raised on purpose: never shorten it to a line that looks like ours.
    traceback.print_exc()
    print(BUG_REPORT, file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""Command line: `run.py list | train | translate`. Also installed as `transformer-mt`.

User errors (unknown experiment or key, missing checkpoint, bad value) print one
line and exit with status 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _cmd_list(args) -> None:
  from transformer_mt import registry
  from transformer_mt.config import TransformerConfig
  from transformer_mt.model import count_parameters
  rows = []
  for name in registry.experiment_names():
    config = registry.load_experiment(name)
    model = TransformerConfig.from_mapping(config.model.to_dict(),
                                           vocab_size=config.tokenizer.vocab_size)
    rows.append((name, count_parameters(model), config.description))
  width = max(len(r[0]) for r in rows)
  print(f"{'experiment':<{width}}  {'params':>8}  description")
  for name, params, description in rows:
    print(f"{name:<{width}}  {params / 1e6:>7.2f}M  {description}")
  print("Parameter counts include the embeddings; a tied (shared) embedding matrix is counted once.")


def _cmd_train(args) -> None:
  from transformer_mt import registry, train
  config = registry.load_experiment(args.experiment, args.overrides)
  result = train.train(config, args.workdir)
  print(f"Done: step {result['step']}, checkpoints in {os.path.join(args.workdir, 'checkpoints')}")


def _cmd_translate(args) -> None:
  from transformer_mt import translate
  translator = translate.load_translator(args.workdir, args.step)
  if args.input == "-":
    lines = translate.read_lines(sys.stdin.buffer)
  else:
    if not os.path.exists(args.input):
      raise FileNotFoundError(f"Input file {args.input} does not exist.")
    with open(args.input, "rb") as f:
      lines = translate.read_lines(f)
  outputs = translator.translate(lines, progress=args.input != "-")
  text = "".join(line + "\n" for line in outputs)
  if args.output == "-":
    sys.stdout.write(text)
  else:
    tmp = f"{args.output}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, args.output)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="run.py", description=__doc__.splitlines()[0])
  parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
  commands = parser.add_subparsers(dest="command", required=True)

  p = commands.add_parser("list", help="list experiments with parameter counts")
  p.set_defaults(func=_cmd_list)

  p = commands.add_parser("train", help="train (or resume) an experiment in a workdir")
  p.add_argument("--experiment", default="demo", help="experiment name (see `list`)")
  p.add_argument("--workdir", required=True, help="checkpoints, metrics and tokenizer go here")
  p.add_argument("overrides", nargs="*", metavar="key=value",
                 help="config overrides, e.g. train.num_steps=100")
  p.set_defaults(func=_cmd_train)

  p = commands.add_parser("translate", help="translate lines with a trained checkpoint")
  p.add_argument("--workdir", required=True, help="workdir (or its checkpoints/) of a trained run")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  p.add_argument("--input", default="-", help="file to translate (default: stdin)")
  p.add_argument("--output", default="-", help="where to write translations (default: stdout)")
  p.set_defaults(func=_cmd_translate)
  return parser


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  # Orbax reports routine facts (e.g. "directory is read only") as absl warnings.
  logging.getLogger("absl").setLevel(logging.ERROR)
  for noisy in ("jax._src", "orbax", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  try:
    args.func(args)
  except (ValueError, FileNotFoundError, KeyError) as e:
    if args.debug:
      raise
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0

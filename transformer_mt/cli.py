"""Command line: `run.py list | prepare | train | sweep | import | export | translate | evaluate |
score | average | attention | plot | reproduce | report`.

Also installed as the `transformer-mt` console script.

User errors (unknown experiment or key, missing checkpoint, bad value: the errors.UserError
the project raises on purpose) print one line and exit with status 2; `--debug` shows the
traceback instead. Any other exception is a bug: its traceback, what to report, exit status 1.

Every path a user gives (flags, and the path-valued config keys in `key=value` overrides)
is made absolute (commands/paths.py), relative to the current directory and with `~`
expanded, before any command runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

from transformer_mt.commands import (
  attention,
  average,
  evaluate,
  export,
  import_hf,
  list_experiments,
  paths,
  plot,
  prepare,
  report,
  reproduce,
  score,
  sweep,
  train,
  translate,
)
from transformer_mt.runtime import errors

# One module per command (commands/), each with add_parser(subparsers) and run(args); in the
# order `--help` lists them.
COMMANDS = (
  list_experiments,
  prepare,
  train,
  sweep,
  import_hf,
  export,
  translate,
  evaluate,
  score,
  average,
  attention,
  reproduce,
  report,
  plot,
)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="run.py", description=__doc__.splitlines()[0])
  parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
  subparsers = parser.add_subparsers(dest="command", required=True)
  for command in COMMANDS:
    command.add_parser(subparsers)
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
  from transformer_mt.runtime import compile_cache

  compile_cache.enable()  # before anything compiles
  try:
    paths.resolve_paths(args)
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

"""The command line is one module per command (transformer_mt/commands/), and splitting it so
changed nothing a user sees: the same subcommands in the same order, the same help text, and
`import transformer_mt.cli` (what `run.py --help` loads) still imports no JAX.

When a command's help changes on purpose, regenerate the golden file with
`python tests/test_commands.py` and review its diff.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = pathlib.Path(__file__).resolve().parent / "cli_help.golden"
# Every subcommand of run.py with its module in transformer_mt/commands, in --help's order.
COMMANDS = {
  "list": "list_experiments",
  "prepare": "prepare",
  "train": "train",
  "sweep": "sweep",
  "import": "import_hf",
  "export": "export",
  "translate": "translate",
  "evaluate": "evaluate",
  "score": "score",
  "average": "average",
  "attention": "attention",
  "reproduce": "reproduce",
  "report": "report",
  "plot": "plot",
}
# argparse wraps help to the terminal's width; a fixed one makes the text the same everywhere.
COLUMNS = "100"


def help_text() -> str:
  """`run.py --help`, then `run.py COMMAND --help` of every command, as one text."""
  from transformer_mt import cli

  parts = []
  for argv in [["--help"]] + [[name, "--help"] for name in COMMANDS]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
      cli.build_parser().parse_args(argv)
    parts.append(f"=== run.py {' '.join(argv)}\n{out.getvalue()}")
  return "".join(parts)


def test_each_subcommand_in_order_is_a_commands_module():
  from transformer_mt import cli

  assert [m.__name__ for m in cli.COMMANDS] == [
    f"transformer_mt.commands.{module}" for module in COMMANDS.values()
  ]
  for module in COMMANDS.values():
    command = importlib.import_module(f"transformer_mt.commands.{module}")
    assert callable(command.add_parser) and callable(command.run), module
  for name in COMMANDS:
    args = cli.build_parser().parse_args(_minimal_argv(name))
    assert args.command == name
    assert args.func.__module__ == f"transformer_mt.commands.{COMMANDS[name]}"


def _minimal_argv(name: str) -> list[str]:
  """The shortest command line `name` parses (its required flags with dummy values)."""
  required = {
    "prepare": ["--experiment", "demo"],
    "train": ["--workdir", "w"],
    "sweep": ["--experiment", "demo", "--workdir", "w"],
    "import": ["--from", "hf:x", "--workdir", "w"],
    "export": ["--workdir", "w", "--to", "hf", "o"],
    "translate": ["--workdir", "w"],
    "score": ["--workdir", "w", "--source", "s", "--target", "t"],
    "average": ["--workdir", "w", "--last", "2"],
    "attention": ["--workdir", "w", "--src", "a"],
    "reproduce": ["--experiment", "demo", "--workdir", "w"],
    "report": ["w"],
    "plot": ["w"],
  }
  return [name, *required.get(name, [])]


def test_importing_the_cli_and_building_its_parser_imports_no_jax():
  code = (
    "import sys\n"
    "from transformer_mt import cli\n"
    "cli.build_parser()\n"
    "loaded = [m for m in ('jax', 'orbax', 'flax') if m in sys.modules]\n"
    "assert not loaded, loaded\n"
  )
  subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_help_of_every_command_is_unchanged(monkeypatch):
  monkeypatch.setenv("COLUMNS", COLUMNS)
  assert help_text() == GOLDEN.read_text(encoding="utf-8")


if __name__ == "__main__":
  os.environ["COLUMNS"] = COLUMNS
  sys.path.insert(0, str(ROOT))
  GOLDEN.write_text(help_text(), encoding="utf-8")
  print(f"wrote {GOLDEN}")

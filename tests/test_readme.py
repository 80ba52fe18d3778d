"""The README, verbatim: the `run.py` commands of its Quick start and Commands sections run as
printed, one after another, from a scratch directory laid out like the repository root.

Only the training commands (train, reproduce, sweep) get overrides appended: fewer steps and the
common tiny shape (tests/helpers.py), so the session takes minutes and every later command
(translate, evaluate, export, ...) reads a tiny workdir. The commands themselves, their flags and
every path stay exactly as the README prints them, relative to the current directory. When a README
command changes, this test runs the new one.
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest
from helpers import child_xla_flags, tiny_overrides

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECTIONS = ("Install and quick start", "Commands")
# Appended to the commands that train: the tiny shape with the demo's beam of 4, 30 steps and a
# checkpoint every 10 (so `average --last 2` has two to average). Later overrides win over the
# README's own.
TRAINING_OVERRIDES = tiny_overrides(
  "train.num_steps=30", "train.checkpoint_every=10", drop=["decode.beam_size"]
)
TRAINING_COMMANDS = ("train", "reproduce", "sweep")
# What a reader of the README learns to do; the test fails if a section stops showing one.
EXPECTED = {
  "list",
  "train",
  "translate",
  "evaluate",
  "average",
  "attention",
  "plot",
  "reproduce",
  "report",
  "sweep",
  "score",
}
# Subcommands that need the interop extra (transformers, torch): run by their own test.
NEEDS_INTEROP = {"export"}
SENTENCES = "the old dog watched these big red apples in a garden quickly\nmy cats\n\nyour kings\n"


def readme_commands(text: str, sections=SECTIONS) -> list[str]:
  """The shell lines that run `run.py` in the ```bash blocks under the `## ` headings named,
  in order, without repeats (backslash continuations joined, comments dropped)."""
  commands, section, in_block, pending = [], None, False, ""
  for line in text.splitlines():
    if line.startswith("## "):
      section = line[3:].strip()
    elif line.strip().startswith("```"):
      in_block = not in_block and line.strip() == "```bash" and section in sections
    elif in_block:
      line = pending + line.strip()
      if line.endswith("\\"):
        pending = line[:-1].rstrip() + " "
        continue
      pending = ""
      if "run.py" in line and not line.startswith("#") and line not in commands:
        commands.append(line)
  return commands


def subcommand(line: str) -> str:
  words = shlex.split(line, comments=True)
  return words[words.index("run.py") + 1]


def test_readme_lists_every_command():
  commands = readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
  assert {subcommand(c) for c in commands} >= EXPECTED, commands


def test_readme_parser_follows_blocks_sections_and_continuations():
  text = "\n".join(
    [
      "## Quick start",
      "```bash",
      "python3 -m venv .venv",
      "python run.py train --workdir a \\",
      "    --experiment demo",
      "```",
      "```python",
      "python run.py list",
      "```",
      "## Other",
      "```bash",
      "python run.py plot a",
      "```",
      "## Commands",
      "```bash",
      "# python run.py commented",
      "python run.py train --workdir a --experiment demo",
      "echo x | python run.py translate --workdir a",
      "```",
    ]
  )
  assert readme_commands(text) == [
    "python run.py train --workdir a --experiment demo",
    "echo x | python run.py translate --workdir a",
  ]


def _needs_an_extra(line: str) -> bool:
  return subcommand(line) in NEEDS_INTEROP


def _run(line: str, cwd: pathlib.Path, env: dict) -> None:
  if subcommand(line) in TRAINING_COMMANDS:
    assert "|" not in line and ";" not in line, f"cannot append overrides to {line!r}"
    line = f"{line} {' '.join(TRAINING_OVERRIDES)}"
  result = subprocess.run(
    ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
  )
  assert result.returncode == 0, f"{line}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
  assert "Traceback" not in result.stderr, f"{line}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
  """The README's commands run in order from a scratch directory laid out like the repository
  root, all but those that need an extra (run by their own test on the same directory)."""
  tmp_path = tmp_path_factory.mktemp("readme")
  # The repository root as the README assumes it: run.py in the current directory (the
  # package itself comes from the install, or from PYTHONPATH for an uninstalled checkout).
  shutil.copy(ROOT / "run.py", tmp_path / "run.py")
  (tmp_path / "sentences.txt").write_text(SENTENCES, encoding="utf-8")
  env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
  env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
  env["XLA_FLAGS"] = child_xla_flags()  # one CPU device, as on a user's laptop
  commands = readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
  for line in commands:
    if not _needs_an_extra(line):
      _run(line, tmp_path, env)
  return tmp_path, env, [line for line in commands if _needs_an_extra(line)]


def test_readme_commands_run_as_printed(session):
  tmp_path, _, _ = session
  # Everything the session wrote is under the scratch directory, where the README said.
  assert (tmp_path / "workdirs" / "demo" / "checkpoints").is_dir()
  assert len((tmp_path / "translations.txt").read_text().splitlines()) == 4
  assert (tmp_path / "attention.png").stat().st_size > 0
  assert (tmp_path / "workdirs" / "demo" / "curves.png").stat().st_size > 0
  assert (tmp_path / "workdirs" / "demo_row" / "results.json").exists()
  assert (tmp_path / "report.png").stat().st_size > 0
  assert (tmp_path / "workdirs" / "demo_sweep" / "sweep.json").exists()
  assert len((tmp_path / "ensemble.txt").read_text().splitlines()) == 4


@pytest.mark.interop
def test_readme_commands_that_need_the_interop_extra_run_as_printed(session):
  """`export` writes a transformers model: it needs the interop extra, and skips without it
  (naming it) once the rest of the session has run."""
  pytest.importorskip(
    "transformers", minversion="5.18", reason="needs the interop extra: pip install -e '.[interop]'"
  )
  pytest.importorskip("torch", reason="needs the interop extra: pip install -e '.[interop]'")
  tmp_path, env, lines = session
  assert lines, "the README shows no command that needs the interop extra"
  for line in lines:
    _run(line, tmp_path, env)
  assert (tmp_path / "exports" / "demo_hf" / "config.json").exists()

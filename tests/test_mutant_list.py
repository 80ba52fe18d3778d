"""The mutant list (tests/mutant_list.py, tests/mutant_list_io.py) against the code it mutates.

tests/mutants.py refuses to run when a mutant's original line is missing from its file, but it
runs only by hand, so a moved or rewritten line could leave the list behind unnoticed (one did:
the beam-search candidates line, rewritten for the two-stage top-k). Checked here on every test
run, without running a mutant: each original line occurs exactly once in its file, and each
test a mutant names exists.
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import mutants  # noqa: E402


def test_every_original_line_occurs_once():
  mutants.check_in_sync(ROOT, mutants.MUTANTS)  # sys.exit with the list of problems otherwise


def test_every_named_test_exists():
  missing = []
  for mutant in mutants.MUTANTS:
    for node in mutant.tests:
      path, _, name = node.partition("::")
      function = re.sub(r"\[.*\]$", "", name)
      source = ROOT / path
      # A node may name a whole file.
      if not source.is_file() or (function and f"def {function}(" not in source.read_text()):
        missing.append(f"{mutant.id}: {node}")
  assert not missing, "mutants naming tests that do not exist:\n" + "\n".join(missing)


def test_ids_are_unique():
  ids = [mutant.id for mutant in mutants.MUTANTS]
  assert len(ids) == len(set(ids))

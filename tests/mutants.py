"""Proves the tests can fail: applies deliberate one-line bugs (mutants) and runs the tests
that should catch each one. Not part of the test suite (pytest collects test_*.py only) and
not run in CI: it takes minutes.

    python tests/mutants.py            # every mutant, then the table and the summary line
    python tests/mutants.py --list     # the mutants and their tests, nothing run
    python tests/mutants.py --only gnmt-penalty --only causal-mask-off-by-one

The working tree is never touched. Its git-tracked and untracked-but-not-ignored files are
copied into a temporary directory (with ../shared beside it, linked, so the tests find the
shared data); each mutant is written into that copy, its tests run there, and the file is
restored before the next one. Every original line must occur exactly once in its file, or
the script stops before running anything, so the list cannot silently drift from the code.

First the unmutated copy runs every selected test: they must all pass, none skipped (a
skipped test can catch nothing), or the script stops. Then, per mutant:
  caught:   pytest exits 1: at least one selected test failed (or errored in its setup, e.g.
            a fixture that builds a model); the table names the first failing test (-x).
  survived: every selected test passed.
  error:    anything else (the tests could not be collected, or the run timed out): not a
            catch, since a mutant that only breaks an import proves nothing about the tests.
The last line is "N mutants, C caught, S survived" (plus errors, if any); exit status 0 only
when every mutant was caught.

A mutant's tests run in the order listed, the existing ones before any in
test_mutant_guards.py, so the table shows whether the older tests already catch it. A test
renamed or removed elsewhere makes the baseline fail (pytest finds no such test): update the
lists (tests/mutant_list.py, tests/mutant_list_io.py). Measured on 2 cores: 25 mutants in
~10 min (baseline 202 s) at a load average of ~2; ~34 min (baseline 894 s) shared with a
load of ~7; 101 mutants in ~30 min (baseline on 2 xdist processes 348 s) on 2 Intel Xeon cores,
nothing else running (2026-11-29).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import py_compile
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

from mutant_list import MUTANTS as CORE_MUTANTS
from mutant_list import Mutant
from mutant_list_io import IO_MUTANTS

MUTANTS = CORE_MUTANTS + IO_MUTANTS

ROOT = pathlib.Path(__file__).resolve().parents[1]
# pytest-xdist processes of the baseline run (the test extra installs xdist; CI uses 2).
BASELINE_WORKERS = 2


@dataclasses.dataclass
class Outcome:
  result: str  # "caught", "survived", "error"
  seconds: float
  failed: list[str] = dataclasses.field(default_factory=list)  # node ids: file::name[params]
  skipped: list[str] = dataclasses.field(default_factory=list)
  durations: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # slowest first
  log: str = ""  # the tail of pytest's output


def source_files(root: pathlib.Path) -> list[str]:
  """The files a fresh checkout would have, plus untracked files git does not ignore."""
  listing = subprocess.run(
    ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    cwd=root,
    check=True,
    capture_output=True,
  ).stdout.decode()
  return [name for name in listing.split("\0") if name and (root / name).is_file()]


def copy_repository(root: pathlib.Path, destination: pathlib.Path) -> pathlib.Path:
  """destination/repo: a copy of `root`'s source files; destination/shared links to
  root/../shared (where the tests look for their shared data)."""
  repo = destination / "repo"
  for name in source_files(root):
    target = repo / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / name, target)
  shared = (root / ".." / "shared").resolve()
  if shared.is_dir():
    (destination / "shared").symlink_to(shared, target_is_directory=True)
  return repo


def check_in_sync(repo: pathlib.Path, mutants) -> None:
  """Every original line occurs exactly once in its file: otherwise stop, naming them all."""
  problems = []
  for mutant in mutants:
    path = repo / mutant.file
    if not path.is_file():
      problems.append(f"{mutant.id}: {mutant.file} does not exist")
      continue
    count = path.read_text().split("\n").count(mutant.original)
    if count != 1:
      problems.append(
        f"{mutant.id}: the line {mutant.original!r} occurs {count} times in {mutant.file} "
        "(expected exactly once): update the mutant list to the code"
      )
    if mutant.original == mutant.mutated:
      problems.append(f"{mutant.id}: the mutated line equals the original")
  if problems:
    sys.exit(
      "mutants.py: the mutant list is out of sync with the code:\n  " + "\n  ".join(problems)
    )


def pytest_env(repo: pathlib.Path, cache_dir: str) -> dict[str, str]:
  env = dict(os.environ)
  env["PYTHONPATH"] = str(repo)  # before the venv's editable install of some other checkout
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
  env["PYTHONDONTWRITEBYTECODE"] = "1"
  return env


def run_pytest(
  repo: pathlib.Path, tests, env, timeout: float, stop_at_first: bool, workers: int = 0
) -> Outcome:
  """Runs `tests` in `repo` (on `workers` pytest-xdist processes, by file, when > 0); the
  per-test results come from pytest's JUnit XML."""
  report = repo.parent / "report.xml"
  report.unlink(missing_ok=True)
  command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
  command += ["-x"] if stop_at_first else []
  command += ["-n", str(workers), "--dist", "loadfile"] if workers else []
  command += [f"--junitxml={report}", *tests]
  start = time.perf_counter()
  try:
    process = subprocess.run(
      command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
    )
  except subprocess.TimeoutExpired as timed_out:
    output = timed_out.stdout or ""
    output = output.decode(errors="replace") if isinstance(output, bytes) else output
    return Outcome(
      "error", time.perf_counter() - start, log=f"timed out after {timeout} s\n{output}"
    )
  seconds = time.perf_counter() - start
  log = (process.stdout + process.stderr)[-4000:]
  cases = junit_cases(report)
  outcome = Outcome(
    "error",
    seconds,
    failed=[name for name, status, _ in cases if status in ("failure", "error")],
    skipped=[name for name, status, _ in cases if status == "skipped"],
    durations=sorted(((t, name) for name, _, t in cases), reverse=True),
    log=log,
  )
  if process.returncode == 0 and cases:
    outcome.result = "survived"
  elif process.returncode == 1 and outcome.failed:
    outcome.result = "caught"
  return outcome


def junit_cases(report: pathlib.Path) -> list[tuple[str, str, float]]:
  """(node id, "passed" | "failure" | "error" | "skipped", seconds) of every test case."""
  if not report.is_file():
    return []
  cases = []
  for case in ET.parse(report).getroot().iter("testcase"):
    module = case.get("classname", "").replace(".", "/")
    name = f"{module}.py::{case.get('name')}"
    status = "passed"
    for child in case:
      if child.tag in ("failure", "error", "skipped"):
        status = child.tag
    cases.append((name, status, float(case.get("time") or 0.0)))
  return cases


def run_mutant(repo: pathlib.Path, mutant: Mutant, env, timeout: float) -> Outcome:
  """Writes the mutant into the copy, runs its tests, and restores the file whatever happens."""
  path = repo / mutant.file
  original_text = path.read_text()
  lines = original_text.split("\n")
  lines[lines.index(mutant.original)] = mutant.mutated
  try:
    path.write_text("\n".join(lines))
    try:
      py_compile.compile(str(path), doraise=True, cfile=str(repo.parent / "compiled.pyc"))
    except py_compile.PyCompileError as error:
      return Outcome("error", 0.0, log=f"the mutated file does not compile: {error}")
    return run_pytest(repo, mutant.tests, env, timeout, stop_at_first=True)
  finally:
    path.write_text(original_text)


def print_table(rows) -> None:
  headers = ("mutant", "file", "tests listed", "result", "caught by (first failure)", "time")
  widths = [max(len(h), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
  print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
  print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
  for row in rows:
    print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")


def short_test(node: str) -> str:
  return node.removeprefix("tests/")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--list", action="store_true", help="list the mutants and exit")
  parser.add_argument("--only", action="append", default=[], metavar="ID", help="run only ID")
  parser.add_argument(
    "--timeout", type=float, default=900.0, help="seconds per pytest run (default 900)"
  )
  parser.add_argument(
    "--baseline_timeout",
    type=float,
    default=3600.0,
    help="seconds for the unmutated run of every selected test (default 3600)",
  )
  parser.add_argument(
    "--cache-dir",
    default=os.path.join(tempfile.gettempdir(), "transformer_mt-mutants-jax-cache"),
    help="JAX compilation cache shared by the runs (default: one in the temp directory)",
  )
  parser.add_argument("--keep", action="store_true", help="keep the temporary copy")
  args = parser.parse_args(argv)

  known = {m.id for m in MUTANTS}
  unknown = [i for i in args.only if i not in known]
  if unknown:
    parser.error(f"unknown mutant(s) {unknown}; --list shows them")
  mutants = [m for m in MUTANTS if not args.only or m.id in args.only]
  if args.list:
    for m in mutants:
      print(f"{m.id}: {m.description}\n  {m.file}\n  - {m.original.strip()}")
      print(f"  + {m.mutated.strip()}\n  tests: {', '.join(map(short_test, m.tests))}")
    return 0

  workspace = pathlib.Path(tempfile.mkdtemp(prefix="transformer_mt-mutants-"))
  try:
    repo = copy_repository(ROOT, workspace)
    check_in_sync(repo, mutants)
    env = pytest_env(repo, args.cache_dir)
    tests = list(dict.fromkeys(t for m in mutants for t in m.tests))
    print(f"baseline: {len(tests)} test selections on the unmutated copy ...", flush=True)
    # Every selected test, on both cores: serially they took over the 900 s of --timeout
    # (2026-11-29, 90 selections); a mutant's own run stops at its first failure.
    baseline = run_pytest(
      repo, tests, env, args.baseline_timeout, stop_at_first=False, workers=BASELINE_WORKERS
    )
    if baseline.result != "survived" or baseline.skipped:
      print(baseline.log, file=sys.stderr)
      problem = f"skipped: {', '.join(baseline.skipped)}" if baseline.skipped else "see above"
      sys.exit(f"mutants.py: the unmutated tests must all pass, none skipped ({problem}).")
    slowest = ", ".join(f"{short_test(n)} {t:.0f} s" for t, n in baseline.durations[:3])
    print(f"baseline passed in {baseline.seconds:.0f} s (slowest: {slowest})", flush=True)

    rows, counts = [], {"caught": 0, "survived": 0, "error": 0}
    for number, mutant in enumerate(mutants, start=1):
      outcome = run_mutant(repo, mutant, env, args.timeout)
      counts[outcome.result] += 1
      by = ", ".join(short_test(t) for t in outcome.failed) if outcome.result == "caught" else "-"
      print(
        f"[{number}/{len(mutants)}] {mutant.id}: {outcome.result} "
        f"({outcome.seconds:.0f} s){' by ' + by if outcome.result == 'caught' else ''}",
        flush=True,
      )
      if outcome.result != "caught":
        print(outcome.log, flush=True)
      rows.append(
        (
          mutant.id,
          mutant.file.removeprefix("transformer_mt/"),
          len(mutant.tests),
          outcome.result,
          by,
          f"{outcome.seconds:.0f} s",
        )
      )
  finally:
    if args.keep:
      print(f"copy kept in {workspace}")
    else:
      shutil.rmtree(workspace, ignore_errors=True)

  print()
  print_table(rows)
  summary = f"{len(mutants)} mutants, {counts['caught']} caught, {counts['survived']} survived"
  print(summary + (f", {counts['error']} errors" if counts["error"] else ""))
  return 0 if counts["caught"] == len(mutants) else 1


if __name__ == "__main__":
  sys.exit(main())

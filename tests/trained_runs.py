"""Trained workdirs built once per pytest session and copied into each test that uses one.

A tiny training run costs 20-60 s, mostly compilation; several test files need the same one.
`session_workdir(tmp_path_factory, name, build)` builds it once for the whole session, under
pytest-xdist too (its documented recipe for session data: the workers share
`tmp_path_factory.getbasetemp().parent`, and a file lock lets the first worker build while the
others wait), and `copy_of(workdir, destination)` gives a test its own copy, so that no test
sees what another one wrote.

The runs themselves, with the overrides the test files share:
  - `ten_steps`: TINY below, 10 steps, checkpoints at 5 and 10 (test_damaged_checkpoint.py,
    test_fault_tolerance.py).
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Callable

from filelock import FileLock
from helpers import tiny_overrides

# The tiny run with dropout that test_fault_tolerance.py and test_damaged_checkpoint.py train:
# no validation BLEU and no held-out BLEU after the last step (they compare parameters and
# losses; the decoding after training is tested in test_end_to_end.py).
TINY = tiny_overrides("model.dropout_rate=0.1", "train.bleu_every=0") + [
  "evaluate.test_after_training=False"
]


def session_workdir(
  tmp_path_factory, name: str, build: Callable[[pathlib.Path], None]
) -> pathlib.Path:
  """The workdir `name`, which `build(workdir)` fills the first time any worker of this session
  asks for it. Tests must not write into it: copy it first (`copy_of`)."""
  if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: its own base directory
    root = tmp_path_factory.getbasetemp()
  else:  # every worker's base directory is a child of the session's
    root = tmp_path_factory.getbasetemp().parent
  workdir = root / "trained_runs" / name
  done = workdir.with_name(name + ".done")
  workdir.parent.mkdir(parents=True, exist_ok=True)
  with FileLock(str(workdir) + ".lock"):
    if not done.exists():
      if workdir.exists():  # a build that failed part-way
        shutil.rmtree(workdir)
      build(workdir)
      done.touch()
  return workdir


def copy_of(workdir: pathlib.Path, destination: pathlib.Path) -> pathlib.Path:
  """A copy of `workdir` at `destination` (which must not exist), returned."""
  shutil.copytree(workdir, destination)
  return destination


def _train(overrides: list[str]) -> Callable[[pathlib.Path], None]:
  def build(workdir: pathlib.Path) -> None:
    from transformer_mt.config import registry
    from transformer_mt.training import train

    train.train(registry.load_experiment("demo", overrides), str(workdir), progress=False)

  return build


def ten_steps(tmp_path_factory) -> pathlib.Path:
  """A finished 10-step run of TINY with checkpoints at 5 and 10 (8 devices, in-process)."""
  overrides = TINY + ["train.num_steps=10", "train.checkpoint_every=5"]
  return session_workdir(tmp_path_factory, "ten_steps", _train(overrides))

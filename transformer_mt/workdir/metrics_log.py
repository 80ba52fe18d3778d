"""Training metrics to TensorBoard event files and a JSONL file in the workdir.

Only process 0 writes. Per-step metrics stay on the device until a log step, then
are fetched together, so logging never stalls the step pipeline.

After a resume, `metrics.jsonl` holds each step once and in order: a run killed after logging
steps past its last checkpoint (kill -9, a crash) repeats those steps when it resumes, so
`MetricWriter(workdir, resumed_from=M)` first drops the rows of steps after M and rewrites
the file atomically (the kept rows into a temporary file, then renamed over it), and
TensorBoard is told to purge its events after M too. The repeated steps are then logged
again, with the same values (resume is bit-exact).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from transformer_mt.data import text_files


def _tensorboardx_writer() -> type:
  """tensorboardX's SummaryWriter, imported without torch when torch is not loaded yet.

  tensorboardX imports torch whenever it is installed (the `interop` extra), only so that it
  can accept torch tensors, which this writer never passes: that import took 1.1-2.3 s of every
  training process's start (2 Intel Xeon cores, torch 2.13 CPU), ~15% of a tiny demo run.
  While tensorboardX loads, a None in sys.modules makes `import torch` raise ImportError, which
  tensorboardX catches (its torch support is optional); torch imports normally afterwards."""
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter

    return SummaryWriter
  sys.modules["torch"] = None
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricWriter:
  """Writes `WORKDIR/metrics.jsonl` (one JSON object per step) and TensorBoard scalars."""

  def __init__(self, workdir: str, resumed_from: int = 0):
    """`resumed_from`: the step the run starts after (its restored checkpoint's, 0 for a
    fresh start); rows already logged for later steps are dropped first."""
    self.enabled = jax.process_index() == 0
    self._jsonl = None
    self._tensorboard = None
    if self.enabled:
      SummaryWriter = _tensorboardx_writer()  # slow import: only the writing process pays it
      path = os.path.join(workdir, "metrics.jsonl")
      had_rows = os.path.exists(path)
      if had_rows:
        drop_rows_after(path, resumed_from)
      self._jsonl = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
      # TensorBoard hides the events of steps >= purge_step written before this point.
      self._tensorboard = SummaryWriter(
        os.path.join(workdir, "tensorboard"), purge_step=resumed_from + 1 if had_rows else None
      )

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step)}
    record.update({k: float(np.asarray(v)) for k, v in scalars.items()})
    self._jsonl.write(json.dumps(record) + "\n")
    for name, value in record.items():
      if name != "step":
        self._tensorboard.add_scalar(name, value, step)

  def flush(self) -> None:
    if self.enabled:
      self._jsonl.flush()
      self._tensorboard.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tensorboard.close()


def drop_rows_after(path: str, step: int) -> int:
  """Rewrites the JSONL file `path` without its rows of steps after `step`; returns how many
  rows were dropped. Rows without a step are kept; a line that is not JSON (the torn last
  line of a killed run) is dropped. The kept rows are written with
  `text_files.write_atomically`, so a crash here leaves either the old file or the new one."""
  kept, dropped = [], 0
  with open(path, encoding="utf-8") as f:
    for line in f:
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        dropped += 1
        continue
      if isinstance(record, dict) and record.get("step", step) > step:
        dropped += 1
      else:
        kept.append(line if line.endswith("\n") else line + "\n")
  if dropped:
    text_files.write_atomically(path, "".join(kept))
    logging.info(
      "Dropped %d rows of %s after step %d: the resumed run logs those steps again.",
      dropped,
      path,
      step,
    )
  return dropped


def read_metrics(workdir: str) -> list[dict[str, float]]:
  """The records of `metrics.jsonl`, in the order they were written."""
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def validation_history(workdir: str, up_to_step: int) -> list[tuple[int, float]]:
  """(step, validation loss) of the evaluations logged in `metrics.jsonl` at steps up to
  `up_to_step` (the checkpoint a run resumes from), in step order; [] without the file.
  Early stopping (training/actions.EarlyStopping) counts on from them after a resume."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  losses = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:  # the torn last line of a killed run
        continue
      logged = isinstance(record, dict) and "validation/loss" in record
      if logged and record.get("step", up_to_step + 1) <= up_to_step:
        losses[int(record["step"])] = float(record["validation/loss"])
  return sorted(losses.items())

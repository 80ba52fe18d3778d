"""Training metrics to TensorBoard event files and a JSONL file in the workdir.

Only process 0 writes. Per-step metrics stay on the device until a log step, then
are fetched together, so logging never stalls the step pipeline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


class MetricWriter:
  """Writes `WORKDIR/metrics.jsonl` (one JSON object per step) and TensorBoard scalars."""

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    self._jsonl = None
    self._tensorboard = None
    if self.enabled:
      from tensorboardX import SummaryWriter  # slow import: only the writing process pays it

      self._jsonl = open(  # noqa: SIM115 - kept open for the run, closed in close()
        os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8"
      )
      self._tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"))

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


def read_metrics(workdir: str) -> list[dict[str, float]]:
  """The records of `metrics.jsonl`, in the order they were written."""
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]

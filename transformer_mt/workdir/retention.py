"""Which of a run's checkpoints are kept, and which of them a final model averages.

A run saves on the `train.checkpoint_every` grid: its regular checkpoints. A save forced off
that grid is a resume point only: the stop a signal forces, the last step of a run whose
`train.num_steps` is off the grid, an early stop between two grid steps. It is marked so in
Orbax's step metadata (RESUME_POINT_ONLY) and:

- never counts toward `train.keep_checkpoints` (KeepRegular, the training manager's Orbax
  preservation policy), so a stopped and resumed run keeps the checkpoints of a run never
  stopped;
- is deleted once a newer checkpoint is on disk (Orbax decides what to delete as a save
  starts and deletes it once that save is committed, so a kill in between leaves both);
- is never averaged: `regular_steps` leaves it out, so the last N that `evaluate.average_last`
  and `run.py average` take are N grid checkpoints, as fairseq averages its last N epoch
  checkpoints and never its mid-epoch `checkpoint_last`.

Checkpoints written before the mark existed have none and count as regular.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import orbax.checkpoint as ocp
from orbax.checkpoint._src.checkpoint_managers import preservation_policy

RESUME_POINT_ONLY = "resume_point_only"  # step metadata: saved off the checkpoint grid


def is_resume_point(manager: ocp.CheckpointManager, step: int) -> bool:
  """Whether checkpoint `step` of `manager` carries the resume-point mark."""
  metadata = manager.metadata(step).custom_metadata or {}
  return bool(metadata.get(RESUME_POINT_ONLY))


def regular_steps(manager: ocp.CheckpointManager) -> list[int]:
  """The steps of the regular (on-grid) checkpoints, ascending: the ones averaging reads."""
  return [step for step in sorted(manager.all_steps()) if not is_resume_point(manager, step)]


@dataclasses.dataclass
class KeepRegular(preservation_policy.PreservationPolicy):
  """Orbax's preservation policy for a training run: the newest `keep` regular checkpoints
  (None: all of them) and the newest checkpoint, whatever it is.

  Orbax asks it as each save starts, with that save's step last in `checkpoints`. That step's
  mark may not be on disk yet, so it is judged by the grid, as the save decided it
  (`step % save_every`); the older ones are judged by their marks on disk, read once each."""

  keep: int | None
  save_every: int
  read_mark: Callable[[int], bool]  # step -> carries RESUME_POINT_ONLY (older checkpoints)
  _marks: dict[int, bool] = dataclasses.field(default_factory=dict)

  def should_preserve(
    self,
    checkpoints: Sequence[preservation_policy.PolicyCheckpointInfo],
    *,
    context: preservation_policy.PreservationContext,
  ) -> list[bool]:
    if not checkpoints:
      return []
    newest = checkpoints[-1].step
    self._marks[newest] = newest % self.save_every != 0
    for info in checkpoints[:-1]:
      if info.step not in self._marks:
        self._marks[info.step] = self.read_mark(info.step)
    regular = [info.step for info in checkpoints if not self._marks[info.step]]
    kept = set(regular if self.keep is None else regular[max(len(regular) - self.keep, 0) :])
    return [info.step in kept or info.step == newest for info in checkpoints]

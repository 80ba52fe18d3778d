"""The training batches as one checkpointable stream: Grain's iterator, the filter counts it
carries, and a state that resumes exactly (input_pipeline.training_batches builds it).

`FilterCounts` counts the training pairs seen and dropped (empty, too long) where the filter
runs; `TrainingBatches` moves the counts made in Grain workers into the training process,
and saves and restores the iterator's position with the counts and the data's fingerprint
(corpus_fingerprint.py), so a resumed run continues the same stream over the same data.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

import grain
import numpy as np

from transformer_mt.data import corpus_fingerprint
from transformer_mt.runtime import errors


@dataclasses.dataclass
class FilterCounts:
  """Training pairs seen and dropped by this process (thread-safe).

  Where the filter runs, `count` also logs each pair's position in the shuffled stream and
  its outcome, and `_CountsInBatch` carries that log back with each batch, so that the
  training process's counts (`TrainingBatches`) count each position once: Grain re-reads
  the pairs of a half-used packing window after a restore. Pickles without its lock or
  log, so a filter holding one travels into a Grain worker (whose copy then counts there).
  """

  seen: int = 0
  empty: int = 0
  too_long: int = 0
  _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
  _log: list = dataclasses.field(default_factory=list, repr=False)

  def count(self, empty: bool, too_long: bool, stream_index: int | None = None) -> None:
    self.add(1, int(empty), int(too_long))
    if stream_index is not None:
      with self._lock:
        self._log.append((stream_index, int(empty), int(too_long)))

  def drain_log(self) -> np.ndarray:
    """int64 [n, 3]: (stream index, empty, too long) of the pairs counted since the last call."""
    with self._lock:
      log, self._log = self._log, []
    return np.array(log, np.int64).reshape(-1, 3)

  def add(self, seen: int, empty: int, too_long: int) -> None:
    with self._lock:
      self.seen += seen
      self.empty += empty
      self.too_long += too_long

  def set(self, seen: int, empty: int, too_long: int) -> None:
    with self._lock:
      self.seen, self.empty, self.too_long = seen, empty, too_long

  def totals(self) -> np.ndarray:
    """[seen, empty, too_long] as one int64 array."""
    with self._lock:
      return np.array([self.seen, self.empty, self.too_long], np.int64)

  def __getstate__(self):
    return {"seen": self.seen, "empty": self.empty, "too_long": self.too_long}

  def __setstate__(self, state):
    self.__init__(**state)


class TrainingBatches:
  """The training batch iterator: Grain's, with its filter counts moved into `counts` and a
  checkpointable state that records the number of workers and the counts.

  Orbax's Grain handler saves `get_state()` bytes as the process's JSON file and restores
  them with `set_state`. The state is {"num_workers", "iterator": Grain's state,
  "filter_counts": {"seen", "empty", "too_long"}}: the counts as of that iterator position,
  so a resumed run's `data/dropped_*` continue from the checkpoint instead of restarting at
  zero. A state of another worker count is refused, since it belongs to another batch
  stream. Older states still restore, with counts from zero (logged): Grain's own state
  (no workers) or {"num_workers", "workers"}.
  """

  def __init__(
    self,
    iterator: grain.DatasetIterator,
    counts: FilterCounts,
    num_workers: int,
    fingerprint: dict | None = None,
    allow_changed_corpus: bool = False,
  ):
    self._iterator = iterator
    self.counts = counts
    self.num_workers = num_workers
    self.fingerprint = fingerprint  # of the data this stream reads (corpus_fingerprint.py)
    self.allow_changed_corpus = allow_changed_corpus
    # The last stream position counted, per reader (worker w reads positions w mod workers):
    # a position at or before it is a pair re-read after a restore, already counted.
    self._counted_through = np.full(max(num_workers, 1), -1, np.int64)

  def __iter__(self) -> TrainingBatches:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = dict(next(self._iterator))
    self._count(batch.pop("filter_log")[1:])
    if self.num_workers:
      # Plain arrays, not views of Grain's shared memory (freed once the batch is dropped).
      batch = {k: np.array(v) for k, v in batch.items()}
    return batch

  def _count(self, log: np.ndarray) -> None:
    """Adds the pairs of `log` ([n, 3]: stream index, empty, too long) not counted before."""
    if not len(log):
      return
    index, empty, too_long = log.T
    reader = index % len(self._counted_through)
    new = index > self._counted_through[reader]
    self.counts.add(int(new.sum()), int(empty[new].sum()), int(too_long[new].sum()))
    np.maximum.at(self._counted_through, reader, index)

  def get_state(self) -> bytes:
    seen, empty, too_long = (int(n) for n in self.counts.totals())
    state = {
      "num_workers": self.num_workers,
      "iterator": self._iterator.get_state(),
      "filter_counts": {
        "seen": seen,
        "empty": empty,
        "too_long": too_long,
        "counted_through": self._counted_through.tolist(),
      },
    }
    if self.fingerprint is not None:
      state["corpus"] = self.fingerprint
    return json.dumps(state, indent=4).encode()

  def set_state(self, state: bytes) -> None:
    state = json.loads(state)
    corpus_fingerprint.check(state.pop("corpus", None), self.fingerprint, self.allow_changed_corpus)
    if set(state) == {"num_workers", "iterator", "filter_counts"}:
      saved, iterator_state = state["num_workers"], state["iterator"]
      counts = state["filter_counts"]
    elif set(state) == {"num_workers", "workers"}:
      saved, iterator_state, counts = state["num_workers"], state["workers"], None
    else:  # Grain's own state: written before workers and counts were saved
      saved, iterator_state, counts = 0, state, None
    if saved != self.num_workers:
      raise errors.BadValue(
        f"the data iterator was saved with data.num_workers={saved} and this run has "
        f"data.num_workers={self.num_workers}; resume with data.num_workers={saved} (the "
        "number of workers decides the batch order)"
      )
    self._iterator.set_state(iterator_state)
    if counts is None:
      logging.warning(
        "This checkpoint's data-iterator state predates saved filter counts: "
        "data/pairs_seen and data/dropped_* count again from zero."
      )
      self.counts.set(0, 0, 0)
      self._counted_through[:] = -1
    else:
      self.counts.set(counts["seen"], counts["empty"], counts["too_long"])
      self._counted_through[:] = counts["counted_through"]

  def start_prefetch(self) -> None:
    self._iterator.start_prefetch()

  def close(self) -> None:
    self._iterator.close()

"""One TFDS ArrayRecord record at a time, at a cost that does not grow with the shard.

A globally shuffled Grain pipeline reads its source one index at a time. Through TFDS's
`ArrayRecordDataSource` each such read is array_record's `reader.read([position])`, which in
array_record 0.8.6 (the newest) costs time in proportion to the records in the shard: 28 us
at 10k records, 0.60 ms at 250k (TFDS writes ~280k per WMT14 shard), i.e. under 2,000 pairs/s
per process, far below what one training process consumes. The same reader's range read
`read(position, position + 1)` takes 4-6 us at any shard size (CHANGELOG.md names the commit
of the benchmark that measured both).

`SingleRecordReads` wraps the TFDS source: a single index goes to that range read, and is then
decoded exactly as TFDS decodes it; batches (`__getitems__`) and everything else go to TFDS
unchanged. It reaches into array_record's source for the shard of an index and its reader, so
where a version lacks those internals it reads through TFDS as before (`fast` says which), and
tests/test_tfds_source.py checks both paths give the same records and that the fast one is in
use with the pinned versions.
"""

from __future__ import annotations

import collections.abc
import logging
from typing import Any

# What the fast path needs from tfds.core.data_sources.array_record.ArrayRecordDataSource
# (its `data_source`, array_record's ArrayRecordDataSource, and `_deserialize`).
_INTERNALS = ("_reader_idx_and_position", "_ensure_reader_exists", "_readers")
# Whether this process has warned that the fast path is off (once is enough: every split of
# every run in it would say the same).
_warned = False


def _warn_slow_once(records: Any) -> None:
  """A real TFDS source read without the range read is slower by the shard's size: say so
  once, naming the versions, so a changed TFDS or array_record does not slow a run silently.
  TFDS's mock_data source (a MagicMock, in tests) has no shards to be slow on."""
  global _warned
  inner = getattr(records, "data_source", None)
  if _warned or type(inner).__module__.startswith("unittest.mock"):
    return
  _warned = True
  from importlib import metadata

  import tensorflow_datasets as tfds

  logging.warning(
    "TFDS records are read one at a time through array_record's read([i]), whose cost grows "
    "with the shard (about 2,000 pairs/s per process on WMT14's shards): the range read needs "
    "internals that tensorflow-datasets %s / array_record %s lack (%s). Pin the versions in "
    "pyproject.toml, or use more data.num_workers.",
    tfds.__version__,
    metadata.version("array_record"),
    type(inner).__name__,
  )


class SingleRecordReads(collections.abc.Sequence):
  """TFDS records by index; one index is read with the shard reader's range read."""

  def __init__(self, records: Any):
    from array_record.python import array_record_data_source

    self.records = records
    inner = getattr(records, "data_source", None)
    # The class itself, not attribute probing: TFDS's mock_data source is a MagicMock, which
    # has every attribute.
    self.fast = (
      isinstance(inner, array_record_data_source.ArrayRecordDataSource)
      and all(hasattr(inner, name) for name in _INTERNALS)
      and hasattr(records, "_deserialize")
    )
    if not self.fast:
      _warn_slow_once(records)

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, index: int) -> Any:
    if not self.fast:
      return self.records[index]
    inner = self.records.data_source
    reader_index, position = inner._reader_idx_and_position(index)
    inner._ensure_reader_exists(reader_index)
    reader = inner._readers[reader_index]
    if not hasattr(reader, "read"):  # array_record's own fallback for non-ArrayRecord files
      return self.records[index]
    (raw,) = reader.read(position, position + 1)
    return self.records._deserialize(raw)

  def __getitems__(self, indices: collections.abc.Sequence[int]) -> list[Any]:
    getitems = getattr(self.records, "__getitems__", None)
    if getitems is None:
      return [self[i] for i in indices]
    return list(getitems(indices))

  def __repr__(self) -> str:
    return f"SingleRecordReads({self.records!r}, fast={self.fast})"

"""The one figure behind data/array_record_reads.py: what reading a single record costs through
array_record's `read([i])` against its range read `read(i, i + 1)`, by shard size.

    python benchmarks/array_record_reads.py [--records 10000 50000 250000] [--reads 2000]

Writes one ArrayRecord shard per size (with TFDS's writer options, group_size:1, and records of
~300 bytes, about a WMT pair as a tf.train.Example), then times --reads random single-record
reads each way on a warm page cache, in the same process, and prints the microseconds per
record and their ratio. TFDS writes ~280k records per WMT14 shard. Nothing is asserted:
figures depend on the machine and its load (the load average is printed beside them).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._tfds_corpus import WRITER_OPTIONS  # noqa: E402

RECORD_BYTES = 300


def write_shard(path: str, records: int) -> None:
  from array_record.python import array_record_module

  rng = np.random.default_rng(0)
  writer = array_record_module.ArrayRecordWriter(path, WRITER_OPTIONS)
  payload = rng.integers(32, 127, size=RECORD_BYTES, dtype=np.uint8).tobytes()
  for i in range(records):
    writer.write(i.to_bytes(8, "little") + payload)
  writer.close()


def time_reads(path: str, records: int, reads: int) -> tuple[float, float]:
  """(µs per record through read([i]), µs per record through read(i, i + 1))."""
  from array_record.python import array_record_module

  reader = array_record_module.ArrayRecordReader(path, "readahead_buffer_size:0")
  indices = np.random.default_rng(1).integers(0, records, size=reads).tolist()
  for i in indices[:100]:  # warm the page cache and the reader
    reader.read(i, i + 1)
  start = time.perf_counter()
  for i in indices:
    (record,) = reader.read([i])
    assert int.from_bytes(record[:8], "little") == i
  by_list = (time.perf_counter() - start) / reads
  start = time.perf_counter()
  for i in indices:
    (record,) = reader.read(i, i + 1)
    assert int.from_bytes(record[:8], "little") == i
  by_range = (time.perf_counter() - start) / reads
  reader.close()
  return by_list * 1e6, by_range * 1e6


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--records", type=int, nargs="+", default=[10_000, 50_000, 250_000])
  parser.add_argument("--reads", type=int, default=2000)
  args = parser.parse_args()
  from importlib import metadata

  version = metadata.version("array_record")
  print(f"array_record {version}; 1-minute load {os.getloadavg()[0]:.2f}")
  print("records per shard | read([i]) µs | read(i, i + 1) µs | ratio")
  with tempfile.TemporaryDirectory() as folder:
    for records in args.records:
      path = os.path.join(folder, f"shard-{records}.array_record")
      write_shard(path, records)
      by_list, by_range = time_reads(path, records, args.reads)
      print(f"{records:,} | {by_list:.1f} | {by_range:.1f} | {by_list / by_range:.1f}x")
  print(f"1-minute load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()

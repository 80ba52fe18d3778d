"""A line-aligned corpus written as a prepared TFDS dataset, for benchmarks/corpus_scale.py's
`--source tfds`: `wmt14_translate/de-en` in array_record format, which `tfds.data_source` (and so
the project's `load_tfds_pairs` with data.tfds_data_dir=DIR) opens as already prepared, with no
download. `python benchmarks/corpus_scale.py --source tfds --tfds-data-dir DIR` writes one into
DIR (and keeps it) when DIR does not hold it yet.

Nothing in the format is written by hand: each pair is serialized by TFDS's own serializer from
the real builder's `info.features` (a Translation feature: a tf.train.Example), the shards are
written by array_record's writer with the options TFDS's ArrayRecordFileAdapter uses
('group_size:1': one record per chunk, so any record is read alone), split across shards as
TFDS's writer would split them (its ShardConfig picks the number from the size, the examples are
divided by get_shard_boundaries, named by its ShardedFileTemplate), and dataset_info.json /
features.json are written by `builder.info` itself once the split infos (shard lengths, bytes)
are set on it. Unlike TFDS, examples keep the file order (TFDS shuffles them by key hash), so
that train record i is line i of the text files.

train is the whole corpus; validation and test are its first `held_out` pairs (the project's
tfds source always opens all three splits; the benchmark never evaluates). Shards are written in
parallel by `workers` processes, each streaming its lines from byte offsets found in one pass
over the files, so memory stays at one shard's buffers whatever the corpus size.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import multiprocessing
import os
import pathlib
import shutil
import tempfile

from benchmarks.harness.corpus import SOURCE_LANG, TARGET_LANG

DATASET, CONFIG = "wmt14_translate", "de-en"
NAME = f"{DATASET}/{CONFIG}"
# The writer options of TFDS's ArrayRecordFileAdapter.write_examples.
WRITER_OPTIONS = "group_size:1"
# Bytes per pair a tf.train.Example adds to the two texts (keys, lengths, nesting), only to
# estimate the serialized size from which TFDS's ShardConfig picks the number of shards.
EXAMPLE_OVERHEAD = 30
BLOCK = 1 << 24


def builder(data_dir: str | os.PathLike):
  """The real wmt14_translate/de-en builder, writing array_record, over `data_dir`."""
  import tensorflow_datasets as tfds

  # Registers the builder whatever optional modules are missing (see data/tfds_source.py).
  importlib.import_module("tensorflow_datasets.translate.wmt14")
  # A builder of a dataset not prepared yet looks for its info on GCS through an empty
  # mkdtemp("tfds") it never removes: made in a folder of ours, removed here.
  scratch, tempfile.tempdir = tempfile.tempdir, tempfile.mkdtemp(prefix="tfds_builder_")
  try:
    return tfds.builder_cls(DATASET)(
      config=CONFIG, data_dir=os.fspath(data_dir), file_format="array_record"
    )
  finally:
    scratch, tempfile.tempdir = tempfile.tempdir, scratch
    shutil.rmtree(scratch, ignore_errors=True)


def dataset_dir(data_dir: str | os.PathLike) -> pathlib.Path:
  """DATA_DIR/wmt14_translate/de-en/VERSION: where the prepared files are (or will be)."""
  import tensorflow_datasets as tfds

  importlib.import_module("tensorflow_datasets.translate.wmt14")
  cls = tfds.builder_cls(DATASET)
  version = cls.builder_configs[CONFIG].version or cls.VERSION
  return pathlib.Path(data_dir, DATASET, CONFIG, str(version))


def train_pairs(data_dir: str | os.PathLike) -> int:
  """Pairs in the train split of the dataset prepared in `data_dir` (from its dataset_info)."""
  return builder(data_dir).info.splits["train"].num_examples


def line_offsets(path: str, lines: list[int]) -> tuple[int, list[int]]:
  """(lines in `path`, byte offset where each of the sorted `lines` starts). One pass counting
  newlines per block, then only the blocks holding a wanted line are read again."""
  counts = []  # (block start, newlines in it)
  with open(path, "rb") as f:
    while block := f.read(BLOCK):
      counts.append(block.count(b"\n"))
    total_bytes = f.tell()
    offsets, seen, block_index = [], 0, 0
    for line in lines:
      # Line `line` starts after newline number `line` (1-based); line 0 starts at 0.
      while block_index < len(counts) and seen + counts[block_index] < line:
        seen += counts[block_index]
        block_index += 1
      if line == 0:
        offsets.append(0)
        continue
      if block_index == len(counts):
        offsets.append(total_bytes)
        continue
      f.seek(block_index * BLOCK)
      block, position = f.read(BLOCK), -1
      for _ in range(line - seen):
        position = block.index(b"\n", position + 1)
      offsets.append(block_index * BLOCK + position + 1)
  return sum(counts), offsets


_WORKER = {}


def _serializer(template_dir: str):
  """(features, serializer) of the real builder, made once per process."""
  if "features" not in _WORKER:
    from tensorflow_datasets.core import example_serializer

    features = builder(template_dir).info.features
    _WORKER["features"] = features
    _WORKER["serializer"] = example_serializer.ExampleSerializer(features.get_serialized_info())
  return _WORKER["features"], _WORKER["serializer"]


def write_shard(task: dict) -> tuple[int, int]:
  """Writes `task["count"]` pairs, read from the byte offsets `task["starts"]` of the source and
  target files, to the array_record file `task["path"]`; returns (pairs, serialized bytes)."""
  from array_record.python import array_record_module

  features, serializer = _serializer(task["template_dir"])
  writer = array_record_module.ArrayRecordWriter(task["path"], WRITER_OPTIONS)
  written = size = 0
  source_path, target_path = task["files"]
  with open(source_path, "rb") as source, open(target_path, "rb") as target:
    source.seek(task["starts"][0])
    target.seek(task["starts"][1])
    for source_line, target_line in zip(source, target):
      if written == task["count"]:
        break
      example = {
        SOURCE_LANG: source_line.removesuffix(b"\n"),
        TARGET_LANG: target_line.removesuffix(b"\n"),
      }
      record = serializer.serialize_example(features.encode_example(example))
      writer.write(record)
      written += 1
      size += len(record)
  writer.close()
  if written != task["count"]:
    raise ValueError(f"{task['path']}: {written} pairs read, {task['count']} expected")
  return written, size


def write_tfds_dataset(
  prefix: str | os.PathLike,
  data_dir: str | os.PathLike,
  workers: int = 0,
  held_out: int = 300,
  num_shards: int | None = None,
) -> dict:
  """Writes PREFIX.en / PREFIX.de (line-aligned, each line ending in a newline) as the prepared
  TFDS dataset wmt14_translate/de-en under `data_dir`: `num_shards` train shards (None: as many
  as TFDS would write) written by `workers` processes (0: os.cpu_count()). Returns {"pairs",
  "shards", "bytes" (on disk), "dir"}."""
  from tensorflow_datasets.core import naming, splits
  from tensorflow_datasets.core.utils import shard_utils

  files = [f"{prefix}.{SOURCE_LANG}", f"{prefix}.{TARGET_LANG}"]
  target = dataset_dir(data_dir)
  if target.exists():
    raise FileExistsError(f"{target} exists: a prepared {NAME} is never written over")
  target.parent.mkdir(parents=True, exist_ok=True)
  text_bytes = sum(os.path.getsize(path) for path in files)
  pairs, _ = line_offsets(files[0], [])
  if pairs == 0:
    raise ValueError(f"{files[0]} is empty")
  # TFDS's own choice of shards for this many examples of about this size.
  num_shards = shard_utils.ShardConfig(num_shards=num_shards).get_number_shards(
    text_bytes + pairs * EXAMPLE_OVERHEAD, pairs
  )
  bounds = [0] + list(shard_utils.get_shard_boundaries(pairs, num_shards))
  held = min(held_out, pairs)
  starts = {}
  for path in files:
    counted, offsets = line_offsets(path, sorted(set(bounds[:-1])))
    if counted != pairs:
      raise ValueError(f"{files[0]} has {pairs} lines, {path} {counted}: not line-aligned")
    starts[path] = dict(zip(sorted(set(bounds[:-1])), offsets))
  # Written under a temporary name and renamed when complete, as TFDS does (incomplete_dir).
  work = pathlib.Path(tempfile.mkdtemp(prefix=f"{target.name}.incomplete_", dir=target.parent))
  try:
    tasks, infos = [], []
    for split, count, shards in (
      ("train", pairs, num_shards),
      ("validation", held, 1),
      ("test", held, 1),
    ):
      template = naming.ShardedFileTemplate(
        data_dir=work, dataset_name=DATASET, split=split, filetype_suffix="array_record"
      )
      split_bounds = bounds if split == "train" else [0, count]
      for shard, path in enumerate(template.sharded_filepaths(shards)):
        first = split_bounds[shard]
        tasks.append(
          dict(
            split=split,
            path=os.fspath(path),
            files=files,
            starts=[starts[f][first] for f in files],
            count=split_bounds[shard + 1] - first,
            template_dir=os.fspath(data_dir),
          )
        )
      infos.append((split, template, shards))
    results = _run(tasks, workers or os.cpu_count() or 1)
    split_infos = []
    for split, template, _ in infos:
      done = [r for task, r in zip(tasks, results) if task["split"] == split]
      split_infos.append(
        splits.SplitInfo(
          name=split,
          shard_lengths=[n for n, _ in done],
          num_bytes=sum(size for _, size in done),
          filename_template=template.replace(data_dir=target),
        )
      )
    info = builder(data_dir).info
    info.set_splits(splits.SplitDict(split_infos))
    info.write_to_directory(work)
    work.chmod(0o755)  # mkdtemp's 0o700 would keep other users out
    work.rename(target)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  disk = sum(p.stat().st_size for p in target.iterdir())
  return {"pairs": pairs, "shards": num_shards, "bytes": disk, "dir": os.fspath(target)}


def _run(tasks: list[dict], workers: int) -> list[tuple[int, int]]:
  """write_shard of each task, in this process or in `workers` spawned ones (never forked from
  a process that may hold JAX's or absl's threads), in the tasks' order."""
  if workers <= 1 or len(tasks) <= 2:
    return [write_shard(task) for task in tasks]
  # The largest shards first, so that the last one does not run alone at the end.
  order = sorted(range(len(tasks)), key=lambda i: -tasks[i]["count"])
  context = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
    futures = {i: pool.submit(write_shard, tasks[i]) for i in order}
    return [futures[i].result() for i in range(len(tasks))]

"""Local training corpora read by random access from the text files themselves.

Held as Python strings, a WMT14 EN-FR training corpus (36M pairs, ~10 GB of text) takes ~57 GB
in one process, and Grain's `mp_prefetch` pickles all of it to every worker. Here each text file
is prepared once: its line start offsets, int64, go to a `.npy` file in a cache folder shared
by hosts and jobs (what fairseq's `.idx` holds, without copying the text into a `.bin`; how that
folder is kept, locked and cleaned: line_index_cache.py). `PreparedCorpus` then reads
pair i with one `os.pread` of each line's bytes at its offsets (the offsets memory-mapped), and
pickles as paths and sizes: a Grain worker opens the files itself. The text lives in the page
cache, shared by every process that reads it, and in none of their RSS: memory-mapping the text
instead was ~1.5x faster warm, but the kernel maps whole large folios on each fault, so every
reading process's RSS grew to nearly the corpus's size (1.41 GB per Grain worker on 4.5M pairs).
Measured on 4.5M and 36M generated pairs: see docs/data.md.

What is read equals `text_files.read_corpus` of the same files, line for line: lines split
on b"\\n" only, "\\r\\n" ending lines without the "\\r", empty lines kept as "", a final line
without newline counted, a UTF-8 byte order mark at the start dropped. Preparation checks
what `read_parallel` checks (missing file, directory, invalid UTF-8 with file and line, line
counts that differ), with the same messages, in one pass that also takes the file's SHA-256
(line_offsets.py), what a checkpoint's fingerprint compares.
"""

from __future__ import annotations

import bisect
import collections
import operator
import os
import resource
import time
from collections.abc import Iterator, Sequence

import numpy as np

from transformer_mt.data import line_index_cache, text_files


def prepare(
  files: Sequence[tuple[str, str]], prepared_dir: str = ""
) -> tuple[PreparedCorpus, list[str]]:
  """The corpus of (source file, target file) pairs (`text_files.corpus_files`), each file
  prepared unless its current version (`line_index_cache.file_state`) is recorded with an
  index of its content in the cache folder; a new version or copy is scanned, and shares an
  existing index of the same content.

  Returns:
    The corpus, and the files whose index this call made (the others' were there before).
  Raises:
    text_files.DataError: what `text_files.read_parallel` raises for the same files.
  """
  folder = line_index_cache.cache_folder(prepared_dir)
  indexes, prepared_now = [], []
  for source_path, target_path in files:
    pair = []
    for path in (source_path, target_path):
      index, new = line_index_cache.prepare_file(path, folder)
      pair.append(index)
      if new:
        prepared_now.append(path)
    source, target = pair
    if source.lines != target.lines:
      longer, shorter = (source, target) if source.lines > target.lines else (target, source)
      raise text_files.DataError(
        text_files.count_mismatch_message(
          source.path,
          source.lines,
          target.path,
          target.lines,
          extra_lines_empty=_lines_empty_from(longer, shorter.lines),
        )
      )
    indexes.append((source, target))
  return PreparedCorpus(indexes), prepared_now


class PreparedCorpus(Sequence):
  """(source, target) pairs of prepared file pairs, in order, read by index from disk.

  Opens a file pair on its first read, in the process that reads, and keeps at most as many
  open as the process's open-file limit allows (least recently read closed first); pickles as
  the FileIndex list only. Marks each index it opens, and those it keeps open once an hour, as
  read (`line_index_cache.mark_read`), so `remove_unused` leaves them alone.
  """

  def __init__(
    self, indexes: Sequence[tuple[line_index_cache.FileIndex, line_index_cache.FileIndex]]
  ):
    self.indexes = list(indexes)
    self._ends = np.cumsum([source.lines for source, _ in self.indexes], dtype=np.int64).tolist()
    # Open file pairs, least recently read first; at most `_max_open_pairs()` of them.
    self._opened: collections.OrderedDict[int, tuple[_LineFile, _LineFile]] = (
      collections.OrderedDict()
    )
    self._open_limit = _max_open_pairs()
    self._marked: dict[str, float] = {}  # index folder -> when this process last marked it
    # When to mark the open ones again.
    self._next_mark = time.monotonic() + line_index_cache.MARK_SECONDS

  def __len__(self) -> int:
    return self._ends[-1] if self._ends else 0

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    index = operator.index(index)
    size = len(self)
    if index < 0:
      index += size
    if not 0 <= index < size:
      raise IndexError(f"pair {index} of a {size}-pair corpus")
    k = bisect.bisect_right(self._ends, index)
    line = index - self._ends[k - 1] if k else index
    source, target = self._open(k)
    if time.monotonic() >= self._next_mark:
      self._mark_open()
    return source.line(line), target.line(line)

  def close(self) -> None:
    """Closes every open file; reading again opens what it needs (the training process calls
    it when Grain workers take over the reading)."""
    while self._opened:
      _, (source, target) = self._opened.popitem()
      source.close()
      target.close()

  def _open(self, k: int) -> tuple[_LineFile, _LineFile]:
    """File pair `k`, opened on first use; the least recently read pair is closed first when
    the open-file budget is spent."""
    opened = self._opened.get(k)
    if opened is not None:
      self._opened.move_to_end(k)
      return opened
    while len(self._opened) >= self._open_limit:
      _, (source, target) = self._opened.popitem(last=False)
      source.close()
      target.close()
    source_index, target_index = self.indexes[k]
    opened = self._opened[k] = (_LineFile(source_index), _LineFile(target_index))
    now = time.monotonic()
    for index in (source_index, target_index):
      last = self._marked.get(index.index_dir)
      if last is None or now - last >= line_index_cache.MARK_SECONDS:
        self._marked[index.index_dir] = now
        line_index_cache.mark_read(index.index_dir)
    return opened

  def _mark_open(self) -> None:
    """Marks the indexes of the open file pairs as read, once an hour."""
    now = time.monotonic()
    self._next_mark = now + line_index_cache.MARK_SECONDS
    for k in self._opened:
      for index in self.indexes[k]:
        self._marked[index.index_dir] = now
        line_index_cache.mark_read(index.index_dir)

  def __iter__(self) -> Iterator[tuple[str, str]]:
    for i in range(len(self)):
      yield self[i]

  def content_key(self) -> list[tuple[str, str]]:
    """(absolute path, SHA-256 of its bytes) of every file as prepared, in order: what the
    corpus is, for keying what is derived from it (a tokenizer trained on it,
    tokenizer_cache.py) and for telling a resume that the data changed
    (corpus_fingerprint.py). The digests alone decide; the paths name the files in messages."""
    return [(os.path.abspath(index.path), index.sha256) for pair in self.indexes for index in pair]

  def __repr__(self) -> str:
    return f"PreparedCorpus({len(self)} pairs, {2 * len(self.indexes)} files)"

  def __getstate__(self):
    return {"indexes": self.indexes}

  def __setstate__(self, state):
    self.__init__(state["indexes"])


class _LineFile:
  """One prepared text file: its offsets memory-mapped, its lines read with `os.pread`."""

  def __init__(self, index: line_index_cache.FileIndex):
    try:
      stat = os.stat(index.path)
    except OSError:
      stat = None
    if stat is None or line_index_cache.file_state(stat) != index.state:
      raise text_files.DataError(
        f"{index.path} changed (or was removed) after it was prepared: training would read "
        "other lines than it counted; restart the run (it prepares the file again)."
      )
    try:
      # A plain ndarray view of the memory map: indexing it is several times cheaper.
      offsets = np.load(os.path.join(index.index_dir, line_index_cache.OFFSETS), mmap_mode="r")
    except FileNotFoundError:
      raise text_files.DataError(
        f"The prepared index of {index.path} ({index.index_dir}) was removed while this run "
        "used it (by hand, or by `run.py prepare --remove_unused_days` after a day without "
        "reads); restart the run (it prepares the file again)."
      ) from None
    self._offsets = np.asarray(offsets)
    # Unbuffered: each line is one pread at its offset; the file object closes the descriptor.
    self._file = open(index.path, "rb", buffering=0)  # noqa: SIM115

  def close(self) -> None:
    """Closes the text file and lets go of the offsets' memory map (and its descriptor)."""
    self._file.close()
    self._offsets = None

  def line(self, i: int) -> str:
    # offsets[i + 1] - 1 is the "\n" ending line i (or the end of a file without one).
    start, end = self._offsets[i : i + 2].tolist()  # one NumPy call, not two
    raw = os.pread(self._file.fileno(), end - 1 - start, start)
    if raw.endswith(b"\r"):
      raw = raw[:-1]
    return raw.decode("utf-8")


# Descriptors of one open file pair: two text files, two offsets memory maps (mmap dups its fd).
_DESCRIPTORS_PER_PAIR = 4


def _max_open_pairs() -> int:
  """File pairs one process may keep open: a quarter of its soft RLIMIT_NOFILE (the rest is for
  JAX, Grain's shared-memory batches, sockets, logs); at least 1, 16 under `ulimit -n 256`."""
  soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft == resource.RLIM_INFINITY:
    return 1 << 30
  return max(1, soft // 4 // _DESCRIPTORS_PER_PAIR)


def _lines_empty_from(index: line_index_cache.FileIndex, first: int) -> bool:
  """Whether lines `first`.. of a prepared file are all "" (read_parallel's hint)."""
  opened = _LineFile(index)
  lengths = np.diff(opened._offsets[first:]) - 1  # bytes before each line's "\n"
  if (lengths > 1).any():
    return False
  # A one-byte line is empty only if that byte is the "\r" of a "\r\n"; zero-byte ones are.
  return all(opened.line(first + int(i)) == "" for i in np.flatnonzero(lengths == 1))

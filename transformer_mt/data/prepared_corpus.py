"""Local training corpora read by random access from the text files themselves.

Held as Python strings, a WMT14 EN-FR training corpus (36M pairs, ~10 GB of text) takes ~57 GB
in one process, and Grain's `mp_prefetch` pickles all of it to every worker. Here each text file
is prepared once: its line start offsets, int64, go to a `.npy` file in a cache folder (what
fairseq's `.idx` holds, without copying the text into a `.bin`). `PreparedCorpus` then reads
pair i with one `os.pread` of each line's bytes at its offsets (the offsets memory-mapped), and
pickles as paths and sizes: a Grain worker opens the files itself. The text lives in the page
cache, shared by every process that reads it, and in none of their RSS: memory-mapping the text
instead was ~1.5x faster warm, but the kernel maps whole large folios on each fault, so every
reading process's RSS grew to nearly the corpus's size (1.41 GB per Grain worker on 4.5M pairs).
Measured on 4.5M and 36M generated pairs: see docs/data.md.

The cache folder holds, per text file, `NAME-PATHHASH-STATEHASH/` (`offsets.npy` and
`manifest.json`), keyed by the file's absolute path, size, modification time, inode and
status-change time (`cp -p` and `rsync -t` keep the first two, never the last two): a changed
file is prepared again (its old index removed), an unchanged one never is. A corpus folder
may be read-only; only the cache folder is written. Preparation holds an exclusive `flock` on
`NAME-PATHHASH.lock` and writes into a `.tmp-...` folder renamed into place once its manifest
(written last) is on disk, so processes starting together prepare once, and one killed midway
leaves only a temporary folder, which a later preparation of that file removes.

On a cluster the cache folder may be on a network filesystem whose `flock` locks one node or
is refused: cache_writes.py names temporary folders by host, PID and a random part, removes
only dead writers' folders, and goes on without a refused lock, in which case processes
starting together may each scan a file and the first complete index renamed into place wins.
In a multi-process job process 0 prepares while the others wait (sources.prepare_local_train).

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
import dataclasses
import errno
import hashlib
import json
import operator
import os
import re
import resource
import shutil
from collections.abc import Iterator, Sequence

import numpy as np

from transformer_mt.data import cache_writes, line_offsets, text_files

# Bump when the index format changes: indexes of another version are prepared again.
FORMAT_VERSION = 3  # 2: keyed by inode and status-change time too; 3: content digest
_OFFSETS = "offsets.npy"
_MANIFEST = "manifest.json"
_TMP = ".tmp-"
_LOCK = ".lock"


def cache_folder(prepared_dir: str = "") -> str:
  """`prepared_dir` made absolute, or, when it is "", $XDG_CACHE_HOME/transformer_mt/prepared
  (~/.cache/transformer_mt/prepared without XDG_CACHE_HOME)."""
  if prepared_dir:
    return os.path.abspath(os.path.expanduser(prepared_dir))
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "transformer_mt", "prepared")


@dataclasses.dataclass(frozen=True)
class FileIndex:
  """A prepared text file: what its index was made from, and where the index is."""

  path: str  # the file, as the corpus names it (messages use this)
  size: int  # bytes, when prepared
  mtime_ns: int  # st_mtime_ns, when prepared
  inode: int  # st_ino: `cp -p` and `rsync -t` keep size and mtime, not the inode
  ctime_ns: int  # st_ctime_ns, which no tool sets back
  lines: int
  sha256: str  # of the file's bytes (line_offsets.scan): its content, wherever it lies
  index_dir: str  # the folder holding offsets.npy and manifest.json

  @property
  def state(self) -> tuple[int, int, int, int]:
    """What `file_state` of the file gave when it was prepared."""
    return self.size, self.mtime_ns, self.inode, self.ctime_ns


def prepare(
  files: Sequence[tuple[str, str]], prepared_dir: str = ""
) -> tuple[PreparedCorpus, list[str]]:
  """The corpus of (source file, target file) pairs (`text_files.corpus_files`), each file
  prepared unless an index of its current version (`file_state`) is in the cache folder.

  Returns:
    The corpus, and the files prepared by this call (the others were prepared before).
  Raises:
    text_files.DataError: what `text_files.read_parallel` raises for the same files.
  """
  folder = cache_folder(prepared_dir)
  indexes, prepared_now = [], []
  for source_path, target_path in files:
    pair = []
    for path in (source_path, target_path):
      index, new = prepare_file(path, folder)
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


def prepare_file(path: str, folder: str) -> tuple[FileIndex, bool]:
  """The index of the text file `path` in the cache folder `folder`, made if it is missing or
  stale; True when this call made it."""
  path = os.fspath(path)
  text_files.check_is_file(path)
  stat = os.stat(path)
  group, name = _index_names(path, stat)
  final = os.path.join(folder, name)
  index = _complete_index(final, path, stat)
  if index is not None:
    return index, False
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise cannot_write(folder, e) from e
  with cache_writes.locked(os.path.join(folder, group + _LOCK), cannot_write):
    index = _complete_index(final, path, stat)  # another process may have made it meanwhile
    if index is not None:
      return index, False
    cache_writes.remove_stale(folder, f"{_TMP}{group}-", f"{group}-", keep=name)
    tmp = os.path.join(folder, cache_writes.temporary_name(f"{_TMP}{group}-"))
    try:
      os.mkdir(tmp)
      scanned = line_offsets.scan(path, os.path.join(tmp, _OFFSETS))
      if file_state(os.stat(path)) != file_state(stat):
        raise text_files.DataError(
          f"{path} changed while it was being prepared; run again once nothing writes it."
        )
      manifest = {
        "format_version": FORMAT_VERSION,
        "path": os.path.abspath(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "inode": stat.st_ino,
        "ctime_ns": stat.st_ctime_ns,
        "lines": scanned.lines,
        "sha256": scanned.sha256,
      }
      # Written last and flushed to disk before the rename: a folder under its final name is
      # complete, whatever kills this process.
      cache_writes.write_synced(
        os.path.join(tmp, _MANIFEST), json.dumps(manifest, indent=1).encode()
      )
      cache_writes.fsync_dir(tmp)
      try:
        os.rename(tmp, final)
      except OSError as e:
        # Without a lock another process may have renamed its index into place first: a
        # complete one is as good as ours.
        index = _complete_index(final, path, stat)
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or index is None:
          raise
        shutil.rmtree(tmp, ignore_errors=True)
        return index, False
      cache_writes.fsync_dir(folder)
    except OSError as e:
      shutil.rmtree(tmp, ignore_errors=True)
      raise cannot_write(folder, e) from e
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return FileIndex(path, *file_state(stat), scanned.lines, scanned.sha256, final), True


class PreparedCorpus(Sequence):
  """(source, target) pairs of prepared file pairs, in order, read by index from disk.

  Opens a file pair on its first read, in the process that reads, and keeps at most as many
  open as the process's open-file limit allows (least recently read closed first); pickles as
  the FileIndex list only.
  """

  def __init__(self, indexes: Sequence[tuple[FileIndex, FileIndex]]):
    self.indexes = list(indexes)
    self._ends = np.cumsum([source.lines for source, _ in self.indexes], dtype=np.int64).tolist()
    # Open file pairs, least recently read first; at most `_max_open_pairs()` of them.
    self._opened: collections.OrderedDict[int, tuple[_LineFile, _LineFile]] = (
      collections.OrderedDict()
    )
    self._open_limit = _max_open_pairs()

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
    return opened

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

  def __init__(self, index: FileIndex):
    try:
      stat = os.stat(index.path)
    except OSError:
      stat = None
    if stat is None or file_state(stat) != index.state:
      raise text_files.DataError(
        f"{index.path} changed (or was removed) after it was prepared: training would read "
        "other lines than it counted; restart the run (it prepares the file again)."
      )
    # A plain ndarray view of the memory map: indexing it is several times cheaper.
    self._offsets = np.asarray(np.load(os.path.join(index.index_dir, _OFFSETS), mmap_mode="r"))
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


def _lines_empty_from(index: FileIndex, first: int) -> bool:
  """Whether lines `first`.. of a prepared file are all "" (read_parallel's hint)."""
  opened = _LineFile(index)
  lengths = np.diff(opened._offsets[first:]) - 1  # bytes before each line's "\n"
  if (lengths > 1).any():
    return False
  # A one-byte line is empty only if that byte is the "\r" of a "\r\n"; zero-byte ones are.
  return all(opened.line(first + int(i)) == "" for i in np.flatnonzero(lengths == 1))


def file_state(stat: os.stat_result) -> tuple[int, int, int, int]:
  """What identifies a version of a file: size, mtime, inode and status-change time (a copy
  made with `cp -p` or `rsync -t` keeps the first two, never the last two)."""
  return stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns


def _index_names(path: str, stat: os.stat_result) -> tuple[str, str]:
  """("NAME-PATHHASH", "NAME-PATHHASH-STATEHASH"): the file's group (its lock, and the stale
  indexes of earlier versions) and the index folder of its present version (`file_state`)."""
  absolute = os.path.abspath(path)
  readable = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(absolute))[:64]
  group = f"{readable}-{hashlib.sha256(absolute.encode()).hexdigest()[:16]}"
  state = ":".join(str(n) for n in (*file_state(stat), FORMAT_VERSION))
  return group, f"{group}-{hashlib.sha256(state.encode()).hexdigest()[:16]}"


def _complete_index(folder: str, path: str, stat: os.stat_result) -> FileIndex | None:
  """The index in `folder` if its manifest says it was made from `path` as it is now."""
  try:
    with open(os.path.join(folder, _MANIFEST), "rb") as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return None
  wanted = (FORMAT_VERSION, os.path.abspath(path), *file_state(stat))
  fields = ("format_version", "path", "size", "mtime_ns", "inode", "ctime_ns")
  found = tuple(manifest.get(name) for name in fields)
  if found != wanted or not os.path.isfile(os.path.join(folder, _OFFSETS)):
    return None
  return FileIndex(path, *file_state(stat), int(manifest["lines"]), manifest["sha256"], folder)


def cannot_write(folder: str, error: OSError) -> text_files.DataError:
  return text_files.DataError(
    text_files.cannot_write(folder, error)
    + " It is the cache of prepared corpora: pass data.prepared_dir=DIR for another one."
  )

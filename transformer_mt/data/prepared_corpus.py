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

The cache folder holds one index per content, `index-vFORMAT-DIGEST/` (`offsets.npy` and
`manifest.json`), named by the SHA-256 of the file's bytes, so identical copies (each node of a
cluster staging the corpus at its local path, a job staging it anew each time) share one index.
Beside it, per file version, `NAME-PATHHASH-STATEHASH.json` records that the file at that
absolute path with that size, modification time, inode and status-change time (`cp -p` and
`rsync -t` keep the first two, never the last two) holds that digest: an unchanged file is
found without reading it, a changed one (or a new copy) is scanned again, and its digest names
the index it uses, the existing one if the content is the same. A corpus folder may be
read-only; only the cache folder is written.

No preparation removes an index: the cache folder is shared by hosts whose file at one path may
differ, and another host's job may be reading any index in it (a process that removed "stale
versions of this path" killed such readers with a FileNotFoundError, issue 41). Readers mark
the indexes they use: each preparation that finds or makes one, and each reading process once
an hour (`_MARK_SECONDS`), sets the index folder's modification time. `remove_unused`, run only
by `run.py prepare --remove_unused_days DAYS`, removes indexes no process has marked for DAYS
days (at least 1), so no lock is needed across hosts.

Preparation holds an exclusive `flock` on `NAME-PATHHASH.lock` and writes into a `.tmp-...`
folder renamed into place once its manifest (written last) is on disk, then the record: so
processes starting together prepare once, and one killed midway leaves only a temporary
folder, which a later preparation of that file removes.

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
import contextlib
import dataclasses
import errno
import hashlib
import json
import operator
import os
import re
import resource
import shutil
import time
from collections.abc import Iterator, Sequence

import numpy as np

from transformer_mt.data import cache_writes, line_offsets, text_files

# Bump when the index format changes: indexes of another version are prepared again.
FORMAT_VERSION = 4  # 2: inode and ctime in the key; 3: content digest; 4: indexes by content
_OFFSETS = "offsets.npy"
_MANIFEST = "manifest.json"
_TMP = ".tmp-"
_LOCK = ".lock"
# A reading process marks each index it has open at least this often (seconds).
_MARK_SECONDS = 3600
# `remove_unused` removes nothing marked more recently than this: 24 marks' margin.
MIN_UNUSED_DAYS = 1.0
# Index folders `remove_unused` may remove: this layout's, and the path-keyed ones of formats
# 1-3 (NAME-PATHHASH-STATEHASH), each holding a manifest.
_INDEX_NAME = re.compile(r"index-v\d+-[0-9a-f]{32}|.+-[0-9a-f]{16}-[0-9a-f]{16}")
_RECORD_NAME = re.compile(r".+-[0-9a-f]{16}-[0-9a-f]{16}\.json")


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
  index_dir: str  # the folder holding offsets.npy and manifest.json, shared by equal copies

  @property
  def state(self) -> tuple[int, int, int, int]:
    """What `file_state` of the file gave when it was prepared."""
    return self.size, self.mtime_ns, self.inode, self.ctime_ns


def prepare(
  files: Sequence[tuple[str, str]], prepared_dir: str = ""
) -> tuple[PreparedCorpus, list[str]]:
  """The corpus of (source file, target file) pairs (`text_files.corpus_files`), each file
  prepared unless its current version (`file_state`) is recorded with an index of its content
  in the cache folder; a new version or copy is scanned, and shares an existing index of the
  same content.

  Returns:
    The corpus, and the files whose index this call made (the others' were there before).
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
  """The index of the text file `path` in the cache folder `folder`, made if no index of its
  content is there; True when this call made it. Removes no index (the module docstring)."""
  path = os.fspath(path)
  text_files.check_is_file(path)
  stat = os.stat(path)
  group, record = _names(path, stat)
  record_path = os.path.join(folder, record)
  index = _recorded_index(record_path, folder, path, stat)
  if index is not None:
    return index, False
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise cannot_write(folder, e) from e
  with cache_writes.locked(os.path.join(folder, group + _LOCK), cannot_write):
    index = _recorded_index(record_path, folder, path, stat)  # made by another process meanwhile
    if index is not None:
      return index, False
    cache_writes.remove_dead_temporaries(folder, f"{_TMP}{group}-")
    tmp = os.path.join(folder, cache_writes.temporary_name(f"{_TMP}{group}-"))
    try:
      os.mkdir(tmp)
      scanned = line_offsets.scan(path, os.path.join(tmp, _OFFSETS))
      if file_state(os.stat(path)) != file_state(stat):
        raise text_files.DataError(
          f"{path} changed while it was being prepared; run again once nothing writes it."
        )
      final = os.path.join(folder, _index_name(scanned.sha256))
      made = _publish(tmp, final, scanned)
      _write_record(folder, group, record_path, path, stat, scanned.sha256)
    except OSError as e:
      shutil.rmtree(tmp, ignore_errors=True)
      raise cannot_write(folder, e) from e
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return FileIndex(path, *file_state(stat), scanned.lines, scanned.sha256, final), made


def _publish(tmp: str, final: str, scanned: line_offsets.Scanned) -> bool:
  """Renames the scanned folder `tmp` to `final` unless a complete index of the same content
  is there already (then `tmp` is removed); True when this call put it there."""
  mark_read(final)  # before the check, as in `_recorded_index`: it may be an old one
  if _complete_index(final, scanned.sha256) is not None:
    shutil.rmtree(tmp, ignore_errors=True)
    return False
  manifest = {
    "format_version": FORMAT_VERSION,
    "sha256": scanned.sha256,
    "lines": scanned.lines,
  }
  # Written last and flushed to disk before the rename: a folder under its final name is
  # complete, whatever kills this process.
  cache_writes.write_synced(os.path.join(tmp, _MANIFEST), json.dumps(manifest, indent=1).encode())
  cache_writes.fsync_dir(tmp)
  try:
    os.rename(tmp, final)
  except OSError as e:
    # Without a lock (or from another host, or a copy at another path) another process may
    # have renamed the same content's index into place first: a complete one is as good.
    if (
      e.errno not in (errno.ENOTEMPTY, errno.EEXIST)
      or _complete_index(final, scanned.sha256) is None
    ):
      raise
    shutil.rmtree(tmp, ignore_errors=True)
    return False
  cache_writes.fsync_dir(os.path.dirname(final))
  return True


def _write_record(
  folder: str, group: str, record_path: str, path: str, stat: os.stat_result, sha256: str
) -> None:
  """Records that `path` in its state `stat` holds the content `sha256` (after its index is
  in place: a record names a complete index, unless `remove_unused` removed it since)."""
  record = {
    "format_version": FORMAT_VERSION,
    "path": os.path.abspath(path),
    "size": stat.st_size,
    "mtime_ns": stat.st_mtime_ns,
    "inode": stat.st_ino,
    "ctime_ns": stat.st_ctime_ns,
    "sha256": sha256,
  }
  tmp = os.path.join(folder, cache_writes.temporary_name(f"{_TMP}{group}-") + ".json")
  try:
    cache_writes.write_synced(tmp, json.dumps(record, indent=1).encode())
    os.replace(tmp, record_path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def mark_read(index_dir: str) -> None:
  """Marks the index in `index_dir` as read now (its folder's modification time), which keeps
  it from `remove_unused`. A mark that cannot be set (the folder removed, another user's) is
  skipped: reading never fails on it."""
  with contextlib.suppress(OSError):
    os.utime(index_dir)


def remove_unused(prepared_dir: str, days: float) -> list[str]:
  """Removes from the cache folder the indexes no process has marked (read or prepared) for
  `days` days, the records of files whose index is gone, and temporary folders of dead
  preparations; keeps everything else, tokenizers included.

  An index is renamed away first, then its mark looked at again: one marked in between (a job
  starting on it at that moment) is put back, so no reader finds one half removed.

  Returns:
    The index folders removed.
  """
  if not days >= MIN_UNUSED_DAYS:
    raise ValueError(f"days={days}: under {MIN_UNUSED_DAYS}, a live reader's index could go")
  folder = cache_folder(prepared_dir)
  if not os.path.isdir(folder):
    return []
  cutoff = time.time() - days * 24 * 3600
  removed = []
  for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
    if not (_INDEX_NAME.fullmatch(entry.name) and _is_index(entry.path)):
      continue
    if _marked_since(entry.path, cutoff):
      continue
    doomed = os.path.join(folder, cache_writes.temporary_name(f"{_TMP}unused-"))
    try:
      os.rename(entry.path, doomed)
    except FileNotFoundError:  # removed meanwhile by another clean-up
      continue
    if _marked_since(doomed, cutoff):
      with contextlib.suppress(OSError):  # else the same content was prepared again meanwhile
        os.rename(doomed, entry.path)
        continue
    shutil.rmtree(doomed, ignore_errors=True)
    removed.append(entry.path)
  for entry in os.scandir(folder):
    if _RECORD_NAME.fullmatch(entry.name) and not _record_has_index(folder, entry.path):
      with contextlib.suppress(FileNotFoundError):
        os.remove(entry.path)
  cache_writes.remove_dead_temporaries(folder, _TMP)
  return removed


def _is_index(path: str) -> bool:
  return os.path.isdir(path) and os.path.isfile(os.path.join(path, _MANIFEST))


def _marked_since(path: str, cutoff: float) -> bool:
  try:
    return os.stat(path).st_mtime > cutoff
  except FileNotFoundError:
    return True  # not ours to remove any more


def _record_has_index(folder: str, record_path: str) -> bool:
  """Whether the index a record names is there; True for a record that cannot be read (it is
  left alone)."""
  record = _read_json(record_path)
  if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
    return True
  return os.path.isdir(os.path.join(folder, _index_name(record["sha256"])))


class PreparedCorpus(Sequence):
  """(source, target) pairs of prepared file pairs, in order, read by index from disk.

  Opens a file pair on its first read, in the process that reads, and keeps at most as many
  open as the process's open-file limit allows (least recently read closed first); pickles as
  the FileIndex list only. Marks each index it opens, and those it keeps open once an hour,
  as read (`mark_read`), so `remove_unused` leaves them alone.
  """

  def __init__(self, indexes: Sequence[tuple[FileIndex, FileIndex]]):
    self.indexes = list(indexes)
    self._ends = np.cumsum([source.lines for source, _ in self.indexes], dtype=np.int64).tolist()
    # Open file pairs, least recently read first; at most `_max_open_pairs()` of them.
    self._opened: collections.OrderedDict[int, tuple[_LineFile, _LineFile]] = (
      collections.OrderedDict()
    )
    self._open_limit = _max_open_pairs()
    self._marked: dict[str, float] = {}  # index folder -> when this process last marked it
    self._next_mark = time.monotonic() + _MARK_SECONDS  # when to mark the open ones again

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
      if last is None or now - last >= _MARK_SECONDS:
        self._marked[index.index_dir] = now
        mark_read(index.index_dir)
    return opened

  def _mark_open(self) -> None:
    """Marks the indexes of the open file pairs as read, once an hour."""
    now = time.monotonic()
    self._next_mark = now + _MARK_SECONDS
    for k in self._opened:
      for index in self.indexes[k]:
        self._marked[index.index_dir] = now
        mark_read(index.index_dir)

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
    try:
      # A plain ndarray view of the memory map: indexing it is several times cheaper.
      offsets = np.load(os.path.join(index.index_dir, _OFFSETS), mmap_mode="r")
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


def _names(path: str, stat: os.stat_result) -> tuple[str, str]:
  """("NAME-PATHHASH", "NAME-PATHHASH-STATEHASH.json"): the file's group (its lock and
  temporary folders) and the record of its present version (`file_state`)."""
  absolute = os.path.abspath(path)
  readable = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(absolute))[:64]
  group = f"{readable}-{hashlib.sha256(absolute.encode()).hexdigest()[:16]}"
  state = ":".join(str(n) for n in (*file_state(stat), FORMAT_VERSION))
  return group, f"{group}-{hashlib.sha256(state.encode()).hexdigest()[:16]}.json"


def _index_name(sha256: str) -> str:
  """The folder of the index of every file whose bytes have this SHA-256."""
  return f"index-v{FORMAT_VERSION}-{sha256[:32]}"


def _read_json(path: str):
  try:
    with open(path, "rb") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _recorded_index(
  record_path: str, folder: str, path: str, stat: os.stat_result
) -> FileIndex | None:
  """The index of `path` as it is now, if a record says which content it holds and that
  content's index is complete; marked as read."""
  record = _read_json(record_path)
  if not isinstance(record, dict):
    return None
  wanted = (FORMAT_VERSION, os.path.abspath(path), *file_state(stat))
  fields = ("format_version", "path", "size", "mtime_ns", "inode", "ctime_ns")
  sha256 = record.get("sha256")
  if tuple(record.get(name) for name in fields) != wanted or not isinstance(sha256, str):
    return None
  index_dir = os.path.join(folder, _index_name(sha256))
  mark_read(index_dir)  # before the check: a `remove_unused` that starts after it keeps it
  lines = _complete_index(index_dir, sha256)
  if lines is None:
    return None
  return FileIndex(path, *file_state(stat), lines, sha256, index_dir)


def _complete_index(index_dir: str, sha256: str) -> int | None:
  """The line count of the index in `index_dir` if its manifest says it is of this format and
  of the content `sha256`, and its offsets are there; else None."""
  manifest = _read_json(os.path.join(index_dir, _MANIFEST))
  if not isinstance(manifest, dict):
    return None
  found = (manifest.get("format_version"), manifest.get("sha256"))
  if found != (FORMAT_VERSION, sha256) or not os.path.isfile(os.path.join(index_dir, _OFFSETS)):
    return None
  return int(manifest["lines"])


def cannot_write(folder: str, error: OSError) -> text_files.DataError:
  return text_files.DataError(
    text_files.cannot_write(folder, error)
    + " It is the cache of prepared corpora: pass data.prepared_dir=DIR for another one."
  )

"""The cache folder of line indexes through which data/prepared_corpus.py reads a local corpus.

It holds one index per content, `index-vFORMAT-DIGEST/` (`offsets.npy` and
`manifest.json`), named by the SHA-256 of the file's bytes, so identical copies (each node of a
cluster staging the corpus at its local path, a job staging it anew each time) share one index.
Beside it, per file version, `NAME-PATHHASH-STATEHASH.json` records that the file at that
absolute path with that size, modification time, inode and status-change time (`cp -p` and
`rsync -t` keep the first two, never the last two) holds that digest: an unchanged file is
found without reading it, a changed one (or a new copy) is scanned again, and its digest names
the index it uses, the existing one if the content is the same. A corpus folder may be
read-only; only the cache folder is written.

No preparation removes an index: the cache folder is shared by hosts whose file at one path may
differ, and another host's job may be reading any index in it (removing an index under a reader
kills it with a FileNotFoundError). Readers mark the indexes they use: each preparation that
finds or makes one, and each reading process once an hour (`MARK_SECONDS`), sets the index
folder's modification time. `remove_unused`, run only by `run.py prepare --remove_unused_days
DAYS`, removes indexes no process has marked for DAYS days (at least 1), so no lock is needed
across hosts.

Preparation holds an exclusive `flock` on `NAME-PATHHASH.lock` and writes into a `.tmp-...`
folder renamed into place once its manifest (written last) is on disk, then the record: so
processes starting together prepare once, and one killed midway leaves only a temporary
folder, which a later preparation of that file removes.

The index itself, each line's start offset, comes from one pass over the file that also checks
it and takes its SHA-256 (line_offsets.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import time

from transformer_mt.data import cache_writes, line_offsets, text_files

# Bump when the index format changes: indexes of another version are prepared again.
FORMAT_VERSION = 4  # 2: inode and ctime in the key; 3: content digest; 4: indexes by content
OFFSETS = "offsets.npy"
_MANIFEST = "manifest.json"
_TMP = ".tmp-"
_LOCK = ".lock"
# A reading process marks each index it has open at least this often (seconds).
MARK_SECONDS = 3600
# `remove_unused` removes nothing marked more recently than this: 24 marks' margin.
MIN_UNUSED_DAYS = 1.0
# Index folders `remove_unused` may remove: this layout's, and the path-keyed ones of formats
# 1-3 (NAME-PATHHASH-STATEHASH), each holding a manifest.
_INDEX_NAME = re.compile(r"index-v\d+-[0-9a-f]{32}|.+-[0-9a-f]{16}-[0-9a-f]{16}")
_RECORD_NAME = re.compile(r".+-[0-9a-f]{16}-[0-9a-f]{16}\.json")
# The names of `file_state`'s values, in its order: a record's keys and FileIndex's fields.
_STATE_FIELDS = ("size", "mtime_ns", "inode", "ctime_ns")


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
    return tuple(getattr(self, name) for name in _STATE_FIELDS)


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
      scanned = line_offsets.scan(path, os.path.join(tmp, OFFSETS))
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
    **dict(zip(_STATE_FIELDS, file_state(stat))),
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
  fields = ("format_version", "path", *_STATE_FIELDS)
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
  if found != (FORMAT_VERSION, sha256) or not os.path.isfile(os.path.join(index_dir, OFFSETS)):
    return None
  return int(manifest["lines"])


def cannot_write(folder: str, error: OSError) -> text_files.DataError:
  return text_files.DataError(
    text_files.cannot_write(folder, error)
    + " It is the cache of prepared corpora: pass data.prepared_dir=DIR for another one."
  )

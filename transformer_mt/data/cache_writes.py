"""Writing into a cache folder that many processes, on many hosts, may share (the prepared
corpora's and their tokenizers', data.prepared_dir): an exclusive lock that goes on without
one where the filesystem refuses flock, temporary names unique across hosts, removal of the
temporary files dead writers left (never another live host's work, and never a published
index: line_index_cache.remove_unused alone removes those), and writes synced to disk before a
rename publishes them. line_index_cache.py and tokenizer_cache.py write through it; the
reasoning is in line_index_cache.py's docstring.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
import socket
import time

# A temporary folder older than this is a dead writer's, whichever host made it.
_STALE_SECONDS = 24 * 3600
# flock's errors where the filesystem does not support it (rather than a real failure).
_NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
_warned_no_flock: set[str] = set()


def temporary_name(prefix: str) -> str:
  """`prefix` + HOST-PID-RANDOM: unique across hosts, including two hosts' processes that
  share a PID (one process per container), and across calls of one process."""
  return f"{prefix}{_host()}-{os.getpid()}-{secrets.token_hex(4)}"


def _host() -> str:
  """This host's name as it goes into a temporary folder's name (no separators)."""
  return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def remove_dead_temporaries(folder: str, temporary_prefix: str) -> None:
  """Removes the temporary folders and files (`temporary_name(temporary_prefix)...`) of
  writers that are gone: only when this host made one and its process is dead, or when it is
  over a day old, since the lock may be per node (or refused) and another host's writer may be
  writing it right now."""
  now = time.time()
  for entry in os.scandir(folder):
    if not entry.name.startswith(temporary_prefix):
      continue
    owner = entry.name[len(temporary_prefix) :].rsplit("-", 2)
    mine_and_dead = (
      len(owner) == 3 and owner[0] == _host() and owner[1].isdigit() and not _alive(owner[1])
    )
    try:
      old = now - entry.stat(follow_symlinks=False).st_mtime > _STALE_SECONDS
      if mine_and_dead or old:
        if entry.is_dir(follow_symlinks=False):
          shutil.rmtree(entry.path, ignore_errors=True)
        else:
          os.remove(entry.path)
    except FileNotFoundError:  # removed meanwhile by whoever made it
      continue


def _alive(pid: str) -> bool:
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


@contextlib.contextmanager
def locked(lock_path: str, cannot_write):
  """An exclusive flock on `lock_path` (created if needed, never removed), waited for. Where
  the filesystem refuses flock itself, the block runs without it (see the module docstring),
  with one warning per cache folder."""
  folder = os.path.dirname(lock_path)
  try:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
  except OSError as e:
    raise cannot_write(folder, e) from e
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
      if e.errno not in _NO_FLOCK:
        raise cannot_write(folder, e) from e
      if folder not in _warned_no_flock:
        _warned_no_flock.add(folder)
        logging.warning(
          "The cache folder %s refuses file locks (%s); preparing without one. Processes "
          "starting together may each scan a file; the first complete index is kept. Put "
          "data.prepared_dir on a filesystem with flock, or prepare ahead with `run.py "
          "prepare`, to scan once.",
          folder,
          errno.errorcode.get(e.errno, e.errno),
        )
    yield
  finally:
    os.close(fd)  # releases the lock


def write_synced(path: str, data: bytes) -> None:
  with open(path, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def fsync_dir(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)

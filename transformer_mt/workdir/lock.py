"""One writer per workdir: the lock file WORKDIR/writer.lock and who holds it.

Two `train` runs writing into one workdir (an accidental double launch, or a requeued job
overlapping the one it replaces) would interleave their checkpoints and metrics.jsonl
lines without any error. So every command that writes a run (`train`, each `sweep` trial,
`reproduce`, and a whole `sweep` on its root) holds the workdir's lock while it writes, and
a second writer stops before writing anything, with one line naming the holder. Readers
(translate, evaluate, score, plot, report, average) never look at the lock: they keep
working while a run trains.

The lock is a small JSON file: host, pid, the UTC time it was taken, the command line, and
what tells a live holder from a dead one on the same host (the process's start time from
/proc/PID/stat, so a recycled pid is not mistaken for the holder, the boot id, so a reboot
frees it, and the pid namespace, so another container with the same host name counts as
another host). It is written to a temporary file and hard-linked into place, so it appears
complete or not at all, and the link fails if a lock is already there (atomic on local
filesystems and NFS; a filesystem without hard links gets O_CREAT|O_EXCL then write).
Not `fcntl.flock`: on network filesystems it may lock only the node (older NFS, Lustre
`localflock`) or be refused (NFS without lockd, Lustre `noflock`; docs/data.md), and a lock
from another host must still be seen and reported.

What happens to a lock found in place:
  * its holder runs on this host: refused (also with --force_unlock: stop it first);
  * its holder died on this host (SIGKILL, OOM, a crash): taken over with a warning;
  * it comes from another host (or cannot be read): this host cannot tell whether the
    holder still runs, so it is refused with its age, and --force_unlock takes it over.
The lock is removed when the command ends: normally, by an exception, by SIGINT, and by
SIGTERM. Where SIGTERM would end the process at once (its default disposition), the lock puts
a handler there that removes the lock, then ends the process the same way. It never replaces
any other handler, since whoever set one decided what SIGTERM does: training's (a checkpoint,
then a normal exit that releases the lock on the way out) and, in a multi-process run, JAX's
preemption notifier, which catches SIGTERM in C from `jax.distributed.initialize` on so that
every process stops at the same step. `signal.getsignal` does not see that one (Python
reports only the handlers it set itself, SIG_DFL otherwise), so the lock asks the OS
(sigaction). Replacing it made process 0, the one holding the lock, die of a SIGTERM (exit
143, no checkpoint) while the others went on. A process killed anyway (SIGKILL) leaves its
lock behind; the next run on the same host sees the holder is dead and takes it over.

In a multi-process run, process 0 holds the lock for the job (`held_for_job`); the others
wait for it, and all stop with an error if it was refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import json
import logging
import os
import shlex
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax

from transformer_mt.runtime import distributed, errors

LOCK_FILENAME = "writer.lock"
# A takeover guard older than this was left by a process that died mid-takeover.
_STALE_GUARD_SECONDS = 60.0


class WorkdirBusy(errors.BadValue):
  """Another writer holds the workdir (an errors.UserError: the CLI prints it as one line)."""


@dataclasses.dataclass
class _Held:
  path: str  # the lock file
  data: bytes  # what this process wrote into it
  depth: int  # nested holds of the same workdir in this process (reproduce -> train)
  created_workdir: bool


_held: dict[str, _Held] = {}  # realpath of the workdir -> the lock this process holds
_previous_sigterm: Any = None


def lock_path(workdir: str) -> str:
  return os.path.join(workdir, LOCK_FILENAME)


@contextlib.contextmanager
def held(workdir: str, force_unlock: bool = False) -> Iterator[None]:
  """Holds WORKDIR/writer.lock for the body (creating the workdir if needed).

  Nested holds of one workdir in one process share the lock (`reproduce` holds it and
  calls `train`, which holds it too). A workdir this call created is removed again if it is
  still empty when the lock is released, so a run refused for a bad config leaves nothing.

  Raises:
    WorkdirBusy: another writer holds it (see the module docstring for which locks are
    taken over).
  """
  key = os.path.realpath(workdir)
  if key in _held:
    _held[key].depth += 1
    try:
      yield
    finally:
      _held[key].depth -= 1
    return
  created = not os.path.isdir(workdir)
  os.makedirs(workdir, exist_ok=True)
  try:
    data = _acquire(workdir, force_unlock)
  except BaseException:
    _remove_if_empty(workdir, created)
    raise
  _held[key] = _Held(lock_path(workdir), data, 1, created)
  _release_on_sigterm(True)
  try:
    yield
  finally:
    _held.pop(key)
    _release_on_sigterm(bool(_held))
    _release(workdir, data, created)


@contextlib.contextmanager
def held_for_job(workdir: str, force_unlock: bool = False) -> Iterator[None]:
  """`held` for every process of a (possibly multi-process) run: process 0 takes the lock,
  and no process goes on until it has it. If it is refused, process 0 raises its
  WorkdirBusy and the others one that points to process 0's error."""
  if jax.process_count() == 1:  # starts JAX's backend, which `held` alone does not
    with held(workdir, force_unlock):
      yield
    return
  with contextlib.ExitStack() as stack:
    refusal = None
    if distributed.is_primary():
      try:
        stack.enter_context(held(workdir, force_unlock))
      except Exception as e:  # noqa: BLE001 - the others must hear of any failure, not hang
        refusal = e
    if distributed.any_process(refusal is not None):  # also the barrier: process 0 holds it
      raise refusal or WorkdirBusy(
        f"Process 0 could not take the writer lock of {workdir}; its error says who holds it."
      )
    yield


def read_holder(workdir: str) -> dict[str, Any] | None:
  """The holder recorded in WORKDIR/writer.lock, or None when there is no lock."""
  data = _read_bytes(lock_path(workdir))
  return None if data is None else _parse(data)


def _holder_record() -> dict[str, Any]:
  pid = os.getpid()
  return {
    "host": socket.gethostname(),
    "pid": pid,
    "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "command": shlex.join([os.path.basename(sys.executable)] + sys.argv),
    "process_start": _process_start(pid)[0],
    "boot_id": _boot_id(),
    "pid_namespace": _pid_namespace(),
  }


def _acquire(workdir: str, force_unlock: bool) -> bytes:
  """Writes the lock, taking over a dead or (with force_unlock) a foreign one; its bytes."""
  path = lock_path(workdir)
  data = json.dumps(_holder_record(), indent=1).encode()
  for _ in range(100):  # each turn ends with the lock created, refused, or a holder gone
    if _create_exclusively(path, data):
      return data
    found = _read_bytes(path)
    if found is None:  # released between the two calls
      continue
    holder = _parse(found)
    where = _where(holder)
    if where == "here" and _alive(holder):
      raise WorkdirBusy(_busy_message(workdir, holder))
    if where == "here":
      logging.warning(
        "Took over the writer lock of %s from %s, which is no longer running.",
        workdir,
        _describe(holder),
      )
    elif force_unlock:
      logging.warning(
        "--force_unlock: took over the writer lock of %s from %s.", workdir, _describe(holder)
      )
    else:
      raise WorkdirBusy(_foreign_message(workdir, holder, where))
    _remove_stale(path, found)
  raise WorkdirBusy(f"Could not take the writer lock {path}: it keeps changing hands.")


def _create_exclusively(path: str, data: bytes) -> bool:
  """Creates `path` holding `data`, complete, unless it exists; whether it did."""
  descriptor, temporary = tempfile.mkstemp(prefix=f".{LOCK_FILENAME}.", dir=os.path.dirname(path))
  try:
    with os.fdopen(descriptor, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    try:
      os.link(temporary, path)
      return True
    except FileExistsError:
      # NFS may answer a retried link with EEXIST although the first one succeeded.
      return os.stat(temporary).st_nlink == 2
    except OSError:  # no hard links here: exclusive create, then write
      try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(descriptor, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
      return True
  finally:
    os.unlink(temporary)


def _remove_stale(path: str, found: bytes) -> None:
  """Removes the lock if it still holds `found`. A guard file makes the check and the removal
  one step, so two processes taking over the same dead lock cannot remove each other's new
  one; the loser then finds the winner's lock."""
  guard = path + ".takeover"
  try:
    os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
  except FileExistsError:
    with contextlib.suppress(FileNotFoundError):
      if time.time() - os.stat(guard).st_mtime > _STALE_GUARD_SECONDS:
        os.unlink(guard)
    time.sleep(0.05)
    return
  try:
    if _read_bytes(path) == found:
      os.unlink(path)
  finally:
    os.unlink(guard)


def _release(workdir: str, data: bytes, created: bool) -> None:
  path = lock_path(workdir)
  found = _read_bytes(path)
  if found == data:
    os.unlink(path)
  else:  # someone ran with --force_unlock meanwhile: the lock is theirs now
    holder = _parse(found) if found is not None else None
    logging.warning(
      "The writer lock of %s was taken over by %s while this run held it; left it in place.",
      workdir,
      _describe(holder) if holder else "another run (and since released)",
    )
  _remove_if_empty(workdir, created)


def _remove_if_empty(workdir: str, created: bool) -> None:
  if created:
    with contextlib.suppress(OSError):
      os.rmdir(workdir)  # only succeeds when empty


def _release_on_sigterm(install: bool) -> None:
  """While a lock is held, SIGTERM under the default disposition first removes the lock,
  then ends the process as SIGTERM would have. Any other handler is left alone, Python's or
  one set in C (JAX's preemption notifier; see the module docstring): the lock is then
  released by the normal exit. Training's own handler (a checkpoint, then a normal exit)
  replaces this one during its loop and restores it after."""
  global _previous_sigterm
  if threading.current_thread() is not threading.main_thread():
    return
  if install and _previous_sigterm is None:
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and _os_default(signal.SIGTERM):
      _previous_sigterm = signal.signal(signal.SIGTERM, _release_then_terminate)
  elif not install and _previous_sigterm is not None:
    if signal.getsignal(signal.SIGTERM) == _release_then_terminate:
      signal.signal(signal.SIGTERM, _previous_sigterm)
    _previous_sigterm = None


def _os_default(signum: int) -> bool:
  """Whether the OS says `signum` has its default disposition: no handler set in C either.

  Asked through sigaction(2), whose `struct sigaction` starts with the handler on Linux
  (glibc, musl) and macOS (0 is SIG_DFL). Where that cannot be asked (no libc to reach, or
  the call fails), the answer is False: a handler set in C may be there, and replacing it
  would take SIGTERM from whoever set it. The lock then relies on the normal exit, or on the
  next run taking over the lock of a holder that died.
  """
  try:
    current = ctypes.create_string_buffer(512)  # larger than any `struct sigaction`
    if ctypes.CDLL(None).sigaction(signum, None, current) != 0:
      return False
  except (OSError, AttributeError, TypeError):
    return False
  return ctypes.c_void_p.from_buffer(current).value is None


def _release_then_terminate(signum, frame) -> None:
  for key, lock in list(_held.items()):
    with contextlib.suppress(OSError):
      if _read_bytes(lock.path) == lock.data:
        os.unlink(lock.path)
    _held.pop(key, None)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  os.kill(os.getpid(), signal.SIGTERM)


def _read_bytes(path: str) -> bytes | None:
  try:
    with open(path, "rb") as f:
      return f.read()
  except FileNotFoundError:
    return None


def _parse(data: bytes) -> dict[str, Any]:
  """The holder record; {} for a lock that is not one (damaged, or written by hand)."""
  try:
    holder = json.loads(data)
  except ValueError:
    return {}
  return holder if isinstance(holder, dict) and "pid" in holder and "host" in holder else {}


def _where(holder: dict[str, Any]) -> str:
  """ "here" when this host can check whether the holder runs, else why not."""
  if not holder:
    return "unreadable"
  if holder["host"] != socket.gethostname():
    return "on another host"
  mine, theirs = _pid_namespace(), holder.get("pid_namespace")
  if mine and theirs and mine != theirs:
    return "in another PID namespace (a container) on this host"
  return "here"


def _alive(holder: dict[str, Any]) -> bool:
  """Whether the holder (a process on this host) still runs: its pid exists, is not a
  zombie, was started when the lock says (not a recycled pid), and the host has not
  rebooted since."""
  boot = _boot_id()
  if boot and holder.get("boot_id") and holder["boot_id"] != boot:
    return False
  pid = int(holder["pid"])
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # another user's process: it exists
  start, state = _process_start(pid)
  if state == "Z":
    return False
  recorded = holder.get("process_start")
  return recorded is None or start is None or start == recorded


def _process_start(pid: int) -> tuple[int | None, str | None]:
  """(start time in clock ticks since boot, state letter) from /proc/PID/stat, or Nones."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      text = f.read()
  except OSError:
    return None, None
  fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
  return int(fields[22 - 3]), fields[0]


def _boot_id() -> str | None:
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      return f.read().strip()
  except OSError:
    return None


def _pid_namespace() -> str | None:
  try:
    return os.readlink("/proc/self/ns/pid")
  except OSError:
    return None


def _age(holder: dict[str, Any]) -> str:
  try:
    started = datetime.datetime.fromisoformat(holder["started"])
  except (KeyError, TypeError, ValueError):
    return "unknown age"
  seconds = int((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds())
  hours, rest = divmod(max(seconds, 0), 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return f"{hours} h {minutes} min ago"
  return f"{minutes} min {seconds} s ago" if minutes else f"{seconds} s ago"


def _describe(holder: dict[str, Any]) -> str:
  return (
    f"pid {holder.get('pid')} on host {holder.get('host')} (started "
    f"{holder.get('started')}, {_age(holder)}; command: {holder.get('command')})"
  )


def _busy_message(workdir: str, holder: dict[str, Any]) -> str:
  return (
    f"{workdir} is being written by another run: {_describe(holder)}. Only one run may write "
    "into a workdir: wait for it to finish, or stop it (SIGTERM checkpoints and exits) and "
    "rerun to resume, or use another --workdir. Readers (translate, evaluate, plot, report) "
    "can use the workdir meanwhile."
  )


def _foreign_message(workdir: str, holder: dict[str, Any], where: str) -> str:
  path = lock_path(workdir)
  if not holder:
    return (
      f"{path} exists but is not a lock this code wrote, so it cannot say who writes into "
      f"{workdir}. If no run does, rerun with --force_unlock to take it over."
    )
  return (
    f"{workdir} is locked by {_describe(holder)}, {where}, so this host cannot tell "
    "whether it still runs. If it does, wait for it or stop it; if it is dead (e.g. its node "
    f"failed), rerun with --force_unlock to take the lock ({path}) over."
  )

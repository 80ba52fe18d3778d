"""Which filesystem a path is on, and whether it is a network one.

A sweep's study storage depends on it: SQLite's locking breaks on network filesystems
(optuna/optuna#815: a malformed database on a shared FS), and Optuna's journal file loses
writes on NFS under SLURM (optuna/optuna#5138), so the sweep refuses the one and warns about
the other there (workdir/study_storage.py). The filesystem's type is read from the mount
table of this process (/proc/self/mountinfo): the mount point that is the longest prefix of
the path's real location names it.
"""

from __future__ import annotations

import os

# Kernel filesystem types (mountinfo's field after " - ") served over a network. FUSE mounts
# (sshfs, gcsfuse, s3fs, ...) are counted as network ones: most are, and none of them promises
# the locking SQLite needs.
NETWORK_TYPES = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "beegfs")
NETWORK_PREFIXES = ("fuse", "9p")
MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
  """Mount points in mountinfo escape space, tab, newline and backslash as octal."""
  for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
    field = field.replace(code, char)
  return field


def filesystem_type(path: str) -> str | None:
  """The type of the filesystem holding `path` (which need not exist yet), e.g. "ext4",
  "nfs4", "lustre"; None where no mount table can be read."""
  location = os.path.realpath(path)
  try:
    with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  best, best_type = "", None
  for line in lines:
    fields, _, rest = line.partition(" - ")
    parts = fields.split()
    if len(parts) < 5 or not rest:
      continue
    mount_point = _unescape(parts[4])
    inside = location == mount_point or location.startswith(mount_point.rstrip("/") + "/")
    # The last of equal mount points is the one on top (mounted later).
    if inside and len(mount_point) >= len(best):
      best, best_type = mount_point, rest.split()[0]
  return best_type


def is_network(fs_type: str | None) -> bool:
  return bool(fs_type) and (fs_type in NETWORK_TYPES or fs_type.startswith(NETWORK_PREFIXES))

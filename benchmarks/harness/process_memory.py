"""The memory of a process tree, sampled from /proc: VmRSS and RssAnon of a process, of each of
its worker descendants and of the whole tree (benchmarks/corpus_scale.py's rss_gb_* figures)."""

from __future__ import annotations

import glob
import pathlib

GB = 1e9


def read_rss(pid: int) -> tuple[int, int] | None:
  """(VmRSS, RssAnon) of `pid` in bytes, or None once it is gone (or a zombie)."""
  try:
    text = pathlib.Path(f"/proc/{pid}/status").read_text()
  except OSError:
    return None
  fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
  if "VmRSS" not in fields:
    return None
  kb = lambda name: int(fields.get(name, "0 kB").split()[0]) * 1024  # noqa: E731
  return kb("VmRSS"), kb("RssAnon")


def children(pid: int) -> list[int]:
  """Direct children of `pid` (every thread's /proc children list)."""
  found = []
  for path in glob.glob(f"/proc/{pid}/task/*/children"):
    try:
      found += [int(c) for c in pathlib.Path(path).read_text().split()]
    except OSError:
      continue
  return found


def _cmdline(pid: int) -> str:
  try:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
  except OSError:
    return ""


class TreeSampler:
  """Maxima of the RSS of a process (main), of its worker descendants (each) and of the whole
  tree (summed within one sample), as VmRSS and RssAnon. Python's multiprocessing resource
  tracker is counted in the total but is no worker."""

  PARTS = ("main", "worker_max", "total")

  def __init__(self, pid: int):
    self.pid = pid
    self.max = {(kind, part): 0 for kind in ("rss", "rss_anon") for part in self.PARTS}
    self.workers_seen: set[int] = set()
    self.samples = 0
    self.latest = (0, 0)  # (VmRSS, RssAnon) of the whole tree in the last sample, bytes

  def sample(self) -> bool:
    """Takes one sample; False once the main process is gone."""
    main = read_rss(self.pid)
    if main is None:
      return False
    self.samples += 1
    total = main
    pending = children(self.pid)
    while pending:
      pid = pending.pop()
      pending += children(pid)
      rss = read_rss(pid)
      if rss is None:
        continue
      total = (total[0] + rss[0], total[1] + rss[1])
      if "resource_tracker" not in _cmdline(pid):
        self.workers_seen.add(pid)
        self._raise("worker_max", rss)
    self._raise("main", main)
    self._raise("total", total)
    self.latest = total
    return True

  def _raise(self, part: str, values: tuple[int, int]) -> None:
    for kind, value in zip(("rss", "rss_anon"), values):
      self.max[kind, part] = max(self.max[kind, part], value)

  def gigabytes(self) -> dict:
    """{"rss_gb_main", "rss_gb_worker_max", "rss_gb_total", "rss_anon_gb_...", "rss_samples"};
    the worker maxima are None when no worker was seen."""
    result = {
      f"{kind}_gb_{part}": round(value / GB, 3)
      if part != "worker_max" or self.workers_seen
      else None
      for (kind, part), value in self.max.items()
    }
    return dict(result, rss_samples=self.samples)

"""Preparing a local corpus on a cluster (issue 34): a cache folder on a filesystem that refuses
flock, two hosts whose preparing processes share a PID, and a multi-process job in which
process 0 prepares while the others wait; hosts that stage their own copies at one path and
read while the others prepare (issue 41). Hosts are simulated by the host name the cache
writer reads; what is read back is checked against `text_files.read_parallel` of the same
files, an independent reader."""

import errno
import logging
import os
import time

import jax
import pytest

from transformer_mt.data import (
  cache_writes,
  line_index_cache,
  line_offsets,
  prepared_corpus,
  sources,
  synthetic,
  text_files,
)
from transformer_mt.runtime import distributed


def _corpus(folder, lines=50):
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "train.en").write_text("".join(f"source {i}\n" for i in range(lines)))
  (folder / "train.de").write_text("".join(f"ziel {i}\n" for i in range(lines)))
  return [(str(folder / "train.en"), str(folder / "train.de"))]


def _as_read(files):
  return list(text_files.read_parallel(*files[0]))


@pytest.fixture
def refused_flock(monkeypatch):
  """flock as NFS without lockd answers it."""

  def flock(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(cache_writes.fcntl, "flock", flock)
  monkeypatch.setattr(cache_writes, "_warned_no_flock", set())


def test_a_refused_flock_prepares_without_it_and_says_so_once(tmp_path, refused_flock, caplog):
  files = _corpus(tmp_path / "corpus")
  caplog.set_level(logging.WARNING)
  corpus, prepared_now = prepared_corpus.prepare(files, str(tmp_path / "cache"))
  assert len(prepared_now) == 2 and list(corpus) == _as_read(files)
  refusals = [r for r in caplog.records if "refuses file locks (ENOLCK)" in r.getMessage()]
  assert len(refusals) == 1  # two files prepared, one warning for the folder


def test_a_lock_that_fails_otherwise_is_one_error_line(tmp_path, monkeypatch):
  def flock(fd, operation):
    raise OSError(errno.EIO, "Input/output error")

  monkeypatch.setattr(cache_writes.fcntl, "flock", flock)
  with pytest.raises(text_files.DataError, match="data.prepared_dir=DIR"):
    prepared_corpus.prepare(_corpus(tmp_path / "corpus"), str(tmp_path / "cache"))


def _as_host(monkeypatch, name):
  monkeypatch.setattr(cache_writes.socket, "gethostname", lambda: name)


def test_two_hosts_with_one_pid_prepare_at_once_without_a_lock(
  tmp_path, refused_flock, monkeypatch
):
  """Host A starts scanning; while it scans, host B, whose process has the same PID (they are
  in different containers), prepares the same file to the end. A's temporary folder survives
  B's clean-up, A's rename finds B's complete index and uses it, and no temporary folder is
  left. (Before, both wrote `.tmp-GROUP-PID`, and B removed A's folder as a dead one's.)"""
  files = _corpus(tmp_path / "corpus")
  cache = str(tmp_path / "cache")
  real_scan, seen = line_offsets.scan, []

  def scan_while_host_b_prepares(path, offsets_path):
    if not seen:
      seen.append(os.listdir(cache))
      _as_host(monkeypatch, "hostb")
      line_index_cache.prepare_file(path, cache)  # host B, same PID, runs to the end
      seen.append(os.listdir(cache))
      _as_host(monkeypatch, "hosta")
    return real_scan(path, offsets_path)

  _as_host(monkeypatch, "hosta")
  monkeypatch.setattr(line_offsets, "scan", scan_while_host_b_prepares)
  index, made_here = line_index_cache.prepare_file(files[0][0], cache)
  assert not made_here  # B's index was complete first
  a_temporary = [n for n in seen[0] if n.startswith(".tmp-")]
  assert len(a_temporary) == 1 and f"-hosta-{os.getpid()}-" in a_temporary[0]
  assert a_temporary[0] in seen[1]  # B left A's folder alone
  assert not [n for n in os.listdir(cache) if n.startswith(".tmp-")]
  assert index.lines == 50


def test_only_this_hosts_dead_or_day_old_temporary_folders_are_removed(tmp_path, monkeypatch):
  files = _corpus(tmp_path / "corpus")
  cache = tmp_path / "cache"
  cache.mkdir()
  path = files[0][0]
  group, _ = line_index_cache._names(path, os.stat(path))
  _as_host(monkeypatch, "hosta")
  dead = 2**22 + 12345  # above the default pid_max: no such process
  names = {
    "other host, same pid": f".tmp-{group}-hostb-{os.getpid()}-0a0a0a0a",
    "this host, live pid": f".tmp-{group}-hosta-{os.getpid()}-0b0b0b0b",
    "this host, dead pid": f".tmp-{group}-hosta-{dead}-0c0c0c0c",
    "other host, two days old": f".tmp-{group}-hostc-77-0d0d0d0d",
  }
  for name in names.values():
    (cache / name).mkdir()
  old = time.time() - 2 * 24 * 3600
  os.utime(cache / names["other host, two days old"], (old, old))
  prepared_corpus.prepare(files, str(cache))
  left = set(os.listdir(cache))
  assert names["other host, same pid"] in left and names["this host, live pid"] in left
  assert names["this host, dead pid"] not in left
  assert names["other host, two days old"] not in left


# One "host" of a cluster whose nodes stage their corpus at the same local path and share the
# cache folder (docs/multihost.md): a process whose working directory stands for its node's
# disk prepares /proc/self/cwd/train.{en,de} (one path string for every host, each host's own
# copy behind it, with its own inode and ctime), then reads every pair, each pass through a
# freshly unpickled corpus as a Grain worker opens one, until the stop file appears; then one
# last pass, and it prints what that pass read.
_HOST = """
import json, os, pickle, sys, time
from transformer_mt.data import cache_writes, prepared_corpus
cache_writes.socket.gethostname = lambda: sys.argv[2]
cache, stop = sys.argv[1], sys.argv[3]
files = [("/proc/self/cwd/train.en", "/proc/self/cwd/train.de")]
corpus, now = prepared_corpus.prepare(files, cache)
print(json.dumps({"prepared": now}), flush=True)
passes = 0
while True:
  last = os.path.exists(stop)
  pairs = list(pickle.loads(pickle.dumps(corpus)))
  passes += 1
  if last:
    break
  time.sleep(0.02)
print(json.dumps({"passes": passes, "pairs": pairs}), flush=True)
"""


def test_hosts_with_their_own_copies_at_one_path_prepare_and_read_at_once(tmp_path):
  """Hosts A and C stage the same text, host B another train.en, each at the one path, with
  one shared cache folder. A prepares and reads; B and C prepare while A reads, then read
  too. Nobody's index is removed under a reader (before, each preparation removed every other
  version of the path's index: A's reads stopped on a FileNotFoundError of its offsets.npy),
  A and C share one index per file, and what no process has read for a week is reclaimed by
  the explicit clean-up, the rest kept."""
  import json
  import pickle
  import subprocess
  import sys

  from helpers import ROOT

  cache, stop = tmp_path / "cache", tmp_path / "stop"
  copies = {}
  for host in ("hosta", "hostb", "hostc"):
    copies[host] = _corpus(tmp_path / host)
  (tmp_path / "hostb" / "train.en").write_text("".join(f"quelle {i}\n" for i in range(50)))

  def start(host):
    return subprocess.Popen(
      [sys.executable, "-c", _HOST, str(cache), host, str(stop)],
      cwd=tmp_path / host,
      env={**os.environ, "PYTHONPATH": str(ROOT)},
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )

  hosts = {"hosta": start("hosta")}
  assert json.loads(hosts["hosta"].stdout.readline()) == {
    "prepared": ["/proc/self/cwd/train.en", "/proc/self/cwd/train.de"]
  }, hosts["hosta"].stderr.read()
  hosts.update(hostb=start("hostb"), hostc=start("hostc"))
  for host in ("hostb", "hostc"):  # both prepared while A reads
    assert "prepared" in json.loads(hosts[host].stdout.readline() or "{}"), hosts[
      host
    ].stderr.read()
  stop.touch()  # each host's last pass opens its indexes after every preparation
  results = {host: process.communicate(timeout=120) for host, process in hosts.items()}
  for host, (out, err) in results.items():
    assert hosts[host].returncode == 0, f"{host}:\n{err[-3000:]}"
    read = json.loads(out)
    assert [tuple(pair) for pair in read["pairs"]] == _as_read(copies[host]), host
  assert json.loads(results["hosta"][0])["passes"] > 1  # A read while B and C prepared
  indexes = sorted(n for n in os.listdir(cache) if n.startswith("index-"))
  assert len(indexes) == 3  # A's and C's train.en, B's train.en, everyone's train.de

  # The clean-up: nothing was read a week ago, so nothing goes; then A and C stop for good
  # (their train.en's index was last read 8 days ago) while B still reads.
  assert line_index_cache.remove_unused(str(cache), days=7) == []
  b_files = [(str(tmp_path / "hostb" / "train.en"), str(tmp_path / "hostb" / "train.de"))]
  b_corpus, _ = prepared_corpus.prepare(b_files, str(cache))
  b_dirs = {index.index_dir for pair in b_corpus.indexes for index in pair}
  old = time.time() - 8 * 24 * 3600
  for name in indexes:
    if str(cache / name) not in b_dirs:
      os.utime(cache / name, (old, old))
  (removed,) = line_index_cache.remove_unused(str(cache), days=7)
  assert removed not in b_dirs and not os.path.exists(removed)
  assert list(pickle.loads(pickle.dumps(b_corpus))) == _as_read(b_files)
  # A's copy is prepared again on its next use.
  _, prepared_now = prepared_corpus.prepare(copies["hosta"], str(cache))
  assert prepared_now == [copies["hosta"][0][0]]


def test_readers_mark_their_indexes_and_the_clean_up_keeps_what_is_marked(tmp_path, monkeypatch):
  """A reading process (here an unpickled corpus, as a Grain worker has) marks each index when
  it opens it and again once an hour while it keeps reading; `remove_unused` keeps an index
  marked within its days. One removed anyway is one error line for a reader, not a
  FileNotFoundError."""
  import pickle

  files = _corpus(tmp_path / "corpus")
  cache = str(tmp_path / "cache")
  corpus, _ = prepared_corpus.prepare(files, cache)
  reader = pickle.loads(pickle.dumps(corpus))
  dirs = [index.index_dir for index in corpus.indexes[0]]

  def age():
    old = time.time() - 2 * 24 * 3600
    for folder in dirs:
      os.utime(folder, (old, old))

  def marked():
    return [time.time() - os.stat(folder).st_mtime < 600 for folder in dirs]

  age()
  assert reader[0] == ("source 0", "ziel 0") and marked() == [True, True]  # opened: marked
  age()
  assert reader[1] == ("source 1", "ziel 1") and marked() == [False, False]  # not every read
  an_hour_later = time.monotonic() + 3600
  monkeypatch.setattr(prepared_corpus.time, "monotonic", lambda: an_hour_later)
  assert reader[2] == ("source 2", "ziel 2") and marked() == [True, True]
  monkeypatch.undo()
  assert line_index_cache.remove_unused(cache, days=1) == []
  age()
  assert sorted(line_index_cache.remove_unused(cache, days=1)) == sorted(dirs)
  assert [n for n in os.listdir(cache) if not n.endswith(".lock")] == []  # records went too
  with pytest.raises(text_files.DataError, match="was removed while this run used it"):
    pickle.loads(pickle.dumps(corpus))[0]


def test_process_0_prepares_while_the_others_wait(tmp_path, monkeypatch):
  files = _corpus(tmp_path / "corpus")
  events, state = [], {"index": 0, "fail": False}
  real_prepare = prepared_corpus.prepare

  def prepare(files, prepared_dir):
    if state["fail"]:
      events.append(("prepare failed", state["index"]))
      raise text_files.DataError("disk full")
    corpus, now = real_prepare(files, prepared_dir)
    events.append(("prepare", state["index"], len(now)))
    return corpus, now

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: state["index"])
  monkeypatch.setattr(distributed, "barrier", lambda name: events.append(("barrier", name)))
  monkeypatch.setattr(prepared_corpus, "prepare", prepare)
  config = {
    "root": str(tmp_path / "corpus"),
    "train_prefixes": ["train"],
    "source_lang": "en",
    "target_lang": "de",
    "prepared_dir": str(tmp_path / "cache"),
  }
  import ml_collections

  data = ml_collections.ConfigDict(config)
  for index in (0, 1):
    state["index"] = index
    corpus, _ = sources.prepare_local_train(data)
    assert list(corpus) == _as_read(files)
  barrier = ("barrier", "local_corpus_prepared")
  # Process 0 scans both files before the barrier; process 1 reads its indexes after it.
  assert events == [("prepare", 0, 2), barrier, barrier, ("prepare", 1, 0)]
  events.clear()
  state.update(index=0, fail=True)
  with pytest.raises(text_files.DataError, match="disk full"):
    sources.prepare_local_train(data)
  assert events == [("prepare failed", 0), barrier]  # the others are released first


# Reads 500 prepared shards under `ulimit -n 256` (before, every pair of files was opened on the
# first read: 2,000 descriptors): every pair in a random order in this process, then a few
# batches from 2 Grain workers (each a process under the same limit).
_MANY_SHARDS = """
import random, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from transformer_mt.data import input_pipeline, prepared_corpus, text_files
from transformer_mt.data.tokenizer import train_tokenizer
files = [(f"{sys.argv[1]}/s{i}.en", f"{sys.argv[1]}/s{i}.de") for i in range(500)]
corpus, _ = prepared_corpus.prepare(files, sys.argv[2])
order = list(range(len(corpus)))
random.Random(0).shuffle(order)
expected = [pair for source, target in files for pair in text_files.read_parallel(source, target)]
assert [corpus[i] for i in order] == [expected[i] for i in order]
tokenizer = train_tokenizer(expected, vocab_size=60)
batches, _ = input_pipeline.training_batches(
  corpus, tokenizer, batch_rows=4, grad_accum_steps=1, max_len=16, seed=0, num_workers=2
)
for _ in range(20):
  next(batches)
batches.close()
print("read", len(corpus), "pairs; open pairs allowed", corpus._open_limit)
"""


def test_five_hundred_shards_read_within_an_open_file_limit_of_256(tmp_path):
  import subprocess
  import sys

  from helpers import ROOT

  shards = tmp_path / "shards"
  shards.mkdir()
  for i in range(500):
    (shards / f"s{i}.en").write_text(f"source {i} a\nsource {i} b\n")
    (shards / f"s{i}.de").write_text(f"ziel {i} a\nziel {i} b\n")
  result = subprocess.run(
    [sys.executable, "-c", _MANY_SHARDS, str(shards), str(tmp_path / "cache")],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "read 1000 pairs; open pairs allowed 16" in result.stdout


def test_sigterm_while_sentencepiece_trains_ends_the_run_once_it_returns(tmp_path):
  """SentencePiece trains in one C call, during which Python runs no signal handler: a
  SIGTERM then waits for the call to return (seconds here, minutes at WMT size), after which
  the lock's handler releases the workdir and the process ends as SIGTERM ends it. Nothing
  half-written is left: no tokenizer in the workdir or the cache, no workdir lock."""
  import signal
  import subprocess

  from helpers import ROOT, local_train_overrides, run_py, write_local_pairs

  write_local_pairs(tmp_path / "data", synthetic.generate_splits(30_000, 4, seed=5)["train"])
  argv = run_py(
    "train",
    "--experiment",
    "demo",
    "--workdir",
    str(tmp_path / "run"),
    *local_train_overrides(tmp_path / "data", tmp_path / "cache"),
    "tokenizer.vocab_size=4000",
    "tokenizer.model_type='bpe'",
    "tokenizer.sample_size=60000",
  )
  process = subprocess.Popen(
    argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
  )
  for line in process.stderr:
    if "SentencePiece vocabulary" in line:
      break
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=600) == -signal.SIGTERM
  assert not (tmp_path / "run" / "tokenizer.model").exists()
  assert not (tmp_path / "run" / "writer.lock").exists()
  kept = [n for n in os.listdir(tmp_path / "cache") if n.startswith("tokenizer-")]
  assert not [n for n in kept if not n.endswith(".lock")]  # lock files stay, by design

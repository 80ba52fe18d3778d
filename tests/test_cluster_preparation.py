"""Preparing a local corpus on a cluster (issue 34): a cache folder on a filesystem that refuses
flock, two hosts whose preparing processes share a PID, and a multi-process job in which
process 0 prepares while the others wait. Hosts are simulated by the host name the cache
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
      prepared_corpus.prepare_file(path, cache)  # host B, same PID, runs to the end
      seen.append(os.listdir(cache))
      _as_host(monkeypatch, "hosta")
    return real_scan(path, offsets_path)

  _as_host(monkeypatch, "hosta")
  monkeypatch.setattr(line_offsets, "scan", scan_while_host_b_prepares)
  index, made_here = prepared_corpus.prepare_file(files[0][0], cache)
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
  group, _ = prepared_corpus._index_names(path, os.stat(path))
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

"""A prepared local corpus (transformer_mt/data/prepared_corpus.py) reads exactly what
`text_files.read_corpus` reads and gives exactly the in-memory path's batches; it is prepared
again when a file changes and never otherwise, works from a read-only corpus folder, is
prepared once by processes starting together, survives a SIGKILL mid-way, and reports bad
files with read_parallel's messages."""

import collections
import hashlib
import json
import os
import pickle
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import ROOT

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.data import (
  input_pipeline,
  line_index_cache,
  line_offsets,
  prepared_corpus,
  text_files,
)
from transformer_mt.data import sources as data_sources
from transformer_mt.data.tokenizer import train_tokenizer

TRICKY = {
  # A byte order mark, CRLF, an empty line, U+2028 and a lone \r inside lines, no final newline.
  "a.en": "\ufeffHello\r\n\r\nx\u2028y\n a\rb \nlast".encode(),
  "a.de": b"Hallo\n\nx y\r\n\x0c\nLetzte\n",
  "c1.en": b"one\n\nthree\n\n",
  "c1.de": b"eins\nzwei\n\n\n",
  "c2.en": "\u00e9t\u00e9\n".encode(),
  "c2.de": b"Sommer",
  "b.en": b"\n",
  "b.de": b"\r\n",
  "e.en": b"",
  "e.de": b"",
}
PREFIXES = ["a", "c*", "b", "e"]


def write_files(folder, files):
  folder.mkdir(parents=True, exist_ok=True)
  for name, data in files.items():
    (folder / name).write_bytes(data)


def prepare(prefixes, root, cache, source="en", target="de"):
  files = text_files.corpus_files(prefixes, source, target, root=root)
  return prepared_corpus.prepare(files, str(cache))


def read_error(function, *args):
  with pytest.raises(text_files.DataError) as info:
    function(*args)
  return str(info.value)


@pytest.mark.parametrize("chunk", [line_offsets.CHUNK, 5])
def test_reads_exactly_what_read_corpus_reads(tmp_path, monkeypatch, chunk):
  monkeypatch.setattr(line_offsets, "CHUNK", chunk)  # 5: lines and a BOM cut across blocks
  write_files(tmp_path / "corpus", TRICKY)
  expected = text_files.read_corpus(PREFIXES, "en", "de", root=tmp_path / "corpus")
  corpus, now = prepare(PREFIXES, tmp_path / "corpus", tmp_path / "cache")
  # e.en and e.de are both empty: one index of that content, made for the first.
  assert len(now) == 9 and str(tmp_path / "corpus" / "e.de") not in now
  assert corpus.indexes[-1][0].index_dir == corpus.indexes[-1][1].index_dir
  assert len(corpus) == len(expected) == 11
  assert list(corpus) == expected
  assert expected[0] == ("Hello", "Hallo") and expected[4][0] == "last"
  assert [corpus[i] for i in (10, 0, 5, -1, -11)] == [expected[i] for i in (10, 0, 5, -1, -11)]
  assert corpus[3:7] == expected[3:7]
  for bad in (11, -12):
    with pytest.raises(IndexError):
      corpus[bad]
  # What a Grain worker receives: the indexes' paths and counts, not the text.
  restored = pickle.loads(pickle.dumps(corpus))
  assert list(restored) == expected and restored.indexes == corpus.indexes
  assert b"Hello" not in pickle.dumps(corpus)
  # Each file's digest is hashlib's over its bytes, whatever the blocks it was read in.
  for index in (index for pair in corpus.indexes for index in pair):
    with open(index.path, "rb") as f:
      assert index.sha256 == hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
  """(root, prefixes, in-memory pairs, tokenizer) of a 1200-pair corpus in two files."""
  root = tmp_path_factory.mktemp("generated")
  rng = np.random.default_rng(0)
  letters = list("abcdefghijklmnopqrstuvwxyz\u00e4\u00f6\u00fc")
  words = ["".join(rng.choice(letters, size=rng.integers(1, 9))) for _ in range(400)]
  for part in ("p1", "p2"):
    for lang in ("en", "de"):
      lines = [" ".join(rng.choice(words, size=rng.integers(0, 20))) for _ in range(600)]
      (root / f"{part}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
  pairs = text_files.read_corpus(["p*"], "en", "de", root=root)
  return root, ["p*"], pairs, train_tokenizer(pairs, vocab_size=100, sample_size=2000)


def batch_hashes(batches, n):
  hashes = []
  for _ in range(n):
    batch = next(batches)
    digest = hashlib.sha256()
    for key in sorted(batch):
      digest.update(key.encode() + np.ascontiguousarray(batch[key]).tobytes())
    hashes.append(digest.hexdigest())
  return hashes


def make_batches(pairs, tokenizer, **kwargs):
  batches, _ = input_pipeline.training_batches(
    pairs, tokenizer, batch_rows=8, grad_accum_steps=2, max_len=32, seed=5, **kwargs
  )
  return batches


def test_batches_equal_the_in_memory_path(generated, tmp_path):
  """The same batches, per process shard, after a restore, and through one Grain worker."""
  root, prefixes, pairs, tokenizer = generated
  corpus, _ = prepare(prefixes, root, tmp_path / "cache")
  for shard in ({}, {"process_index": 1, "process_count": 2}):
    assert batch_hashes(make_batches(corpus, tokenizer, **shard), 4) == batch_hashes(
      make_batches(pairs, tokenizer, **shard), 4
    )
  expected = batch_hashes(make_batches(pairs, tokenizer), 5)
  first = make_batches(corpus, tokenizer)
  batch_hashes(first, 3)
  resumed = make_batches(corpus, tokenizer)
  resumed.set_state(first.get_state())
  assert batch_hashes(resumed, 2) == expected[3:]
  worker = make_batches(corpus, tokenizer, num_workers=1)
  try:
    assert batch_hashes(worker, 3) == expected[:3]
  finally:
    worker.close()


def index_files(corpus):
  """{file path: (index folder, inode and mtime of its offsets.npy)}."""
  result = {}
  for index in (index for pair in corpus.indexes for index in pair):
    offsets = os.stat(os.path.join(index.index_dir, "offsets.npy"))
    result[index.path] = (index.index_dir, offsets.st_ino, offsets.st_mtime_ns)
  return result


def test_a_changed_file_is_prepared_again_an_unchanged_one_never(tmp_path):
  root, cache = tmp_path / "corpus", tmp_path / "cache"
  write_files(root, {"t.en": b"a\nb\n", "t.de": b"x\ny\n"})
  first, now = prepare(["t"], root, cache)
  before = index_files(first)
  assert len(now) == 2
  again, now = prepare(["t"], root, cache)
  assert now == [] and index_files(again) == before
  (root / "t.de").write_bytes(b"xx\nyy\n")  # new content and size
  changed, now = prepare(["t"], root, cache)
  assert now == [str(root / "t.de")]
  after = index_files(changed)
  assert after[str(root / "t.en")] == before[str(root / "t.en")]
  assert after[str(root / "t.de")][0] != before[str(root / "t.de")][0]
  assert list(changed) == [("a", "xx"), ("b", "yy")]
  # The old version's index stays (another host may read it) until a clean-up finds it unread
  # for the days it is given; the indexes in use stay.
  stale = before[str(root / "t.de")][0]
  assert os.path.exists(stale) and line_index_cache.remove_unused(str(cache), days=1) == []
  old = time.time() - 2 * 24 * 3600
  os.utime(stale, (old, old))
  assert line_index_cache.remove_unused(str(cache), days=1) == [stale]
  assert not os.path.exists(stale) and index_files(prepare(["t"], root, cache)[0]) == after
  # A corpus opened (here: unpickled, as in a Grain worker) after its file changed refuses to
  # read other lines than it counted.
  (root / "t.en").write_bytes(b"a\nb\nc\n")
  with pytest.raises(text_files.DataError, match="changed .*after it was prepared"):
    pickle.loads(pickle.dumps(changed))[0]


def test_a_read_only_corpus_folder_works_with_the_cache_elsewhere(tmp_path):
  root = tmp_path / "corpus"
  write_files(root, TRICKY)
  listing = sorted(os.listdir(root))
  for name in listing:
    os.chmod(root / name, stat.S_IRUSR | stat.S_IRGRP)
  os.chmod(root, stat.S_IRUSR | stat.S_IXUSR)
  try:
    corpus, _ = prepare(PREFIXES, root, tmp_path / "cache")
    assert list(corpus) == text_files.read_corpus(PREFIXES, "en", "de", root=root)
    assert sorted(os.listdir(root)) == listing  # nothing written beside the corpus
  finally:
    os.chmod(root, stat.S_IRWXU)


# A child process that prepares the corpus slowly (tiny scan blocks, a pause after each), so
# that two of them overlap and one can be killed mid-way; prints what it prepared.
CHILD = """
import hashlib, json, sys, time
sys.path.insert(0, {root!r})
from transformer_mt.data import line_offsets, prepared_corpus, text_files
write = line_offsets.write_offsets
def slow_write(out, starts):
  time.sleep({pause})
  write(out, starts)
line_offsets.CHUNK = 64
line_offsets.write_offsets = slow_write
files = text_files.corpus_files(["big"], "en", "de", root={corpus!r})
corpus, now = prepared_corpus.prepare(files, {cache!r})
digest = hashlib.sha256(json.dumps(list(corpus)).encode()).hexdigest()
print(json.dumps({{"now": now, "digest": digest}}))
"""


def start_child(corpus, cache, pause):
  code = CHILD.format(root=str(ROOT), corpus=str(corpus), cache=str(cache), pause=pause)
  return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def write_big(root, lines):
  write_files(
    root,
    {f"big.{lang}": "".join(f"{lang} {i} " * 3 + "\n" for i in range(lines)).encode()
     for lang in ("en", "de")},
  )  # fmt: skip


def test_two_processes_preparing_at_once_prepare_once(tmp_path):
  root, cache = tmp_path / "corpus", tmp_path / "cache"
  write_big(root, 300)
  children = [start_child(root, cache, pause=0.01) for _ in range(2)]
  results = [json.loads(child.communicate()[0]) for child in children]
  assert [child.returncode for child in children] == [0, 0]
  prepared = collections.Counter(path for result in results for path in result["now"])
  assert prepared == {str(root / "big.en"): 1, str(root / "big.de"): 1}
  expected = text_files.read_corpus(["big"], "en", "de", root=root)
  digest = hashlib.sha256(json.dumps([list(p) for p in expected]).encode()).hexdigest()
  assert [result["digest"] for result in results] == [digest, digest]
  folders = [name for name in os.listdir(cache) if not name.endswith((".lock", ".json"))]
  assert len(folders) == 2 and not any(name.startswith(".tmp-") for name in folders)


def test_a_preparation_killed_midway_leaves_nothing_taken_for_complete(tmp_path):
  root, cache = tmp_path / "corpus", tmp_path / "cache"
  write_big(root, 3000)
  child = start_child(root, cache, pause=0.05)
  try:
    deadline = time.monotonic() + 120  # a guard against a hang, not a measurement
    while not (cache.exists() and any(n.startswith(".tmp-") for n in os.listdir(cache))):
      assert child.poll() is None and time.monotonic() < deadline
      time.sleep(0.05)
    assert child.poll() is None
    os.kill(child.pid, signal.SIGKILL)
  finally:
    child.wait()
  assert child.returncode == -signal.SIGKILL
  left = os.listdir(cache)
  assert all(name.startswith(".tmp-") or name.endswith(".lock") for name in left), left
  corpus, now = prepare(["big"], root, cache)
  assert now == [str(root / "big.en"), str(root / "big.de")]
  assert list(corpus) == text_files.read_corpus(["big"], "en", "de", root=root)
  assert not any(name.startswith(".tmp-") for name in os.listdir(cache))


def test_bad_files_give_read_parallels_messages(tmp_path, monkeypatch):
  monkeypatch.setattr(line_offsets, "CHUNK", 7)  # line numbers counted across blocks
  root, cache = tmp_path / "corpus", tmp_path / "cache"
  cases = {
    "utf8": {"u.en": b"1\n2\n3\n4\n", "u.de": "eins\nzwei\ndrei\nGr\xfc\xdfe\n".encode("latin-1")},
    "counts": {"u.en": b"a\nb\nc\n", "u.de": b"x\ny\n"},
    "empty_extra": {"u.en": b"a\nb\n\r\n\n", "u.de": b"x\ny\n"},
    "utf16": {"u.en": "a\n".encode("utf-16"), "u.de": b"x\n"},
    "directory": {"u.de": b"x\n"},
  }
  for case, files in cases.items():
    folder = root / case
    write_files(folder, files)
    if case == "directory":
      (folder / "u.en").mkdir()
    source, target = folder / "u.en", folder / "u.de"
    expected = read_error(text_files.read_parallel, str(source), str(target))
    assert read_error(prepare, ["u"], folder, cache) == expected, case
    assert "\n" not in expected
  utf8 = read_error(prepare, ["u"], root / "utf8", cache)
  assert "u.de is not valid UTF-8: line 4, byte 3 of the line" in utf8
  assert "are empty" in read_error(prepare, ["u"], root / "empty_extra", cache)
  missing = read_error(prepare, ["nothere"], root / "counts", cache)
  assert missing == read_error(text_files.read_corpus, ["nothere"], "en", "de", root / "counts")


def local_config(root, cache, *overrides):
  return registry.load_experiment(
    "news_ende_small",
    [
      f"data.root='{root}'",
      "data.train_prefixes=['c*', 'a']",
      "data.validation_prefixes=['b']",
      "data.test_prefixes=['e']",
      f"data.prepared_dir='{cache}'",
      *overrides,
    ],
  )


def test_load_pairs_prepares_the_train_split_only(tmp_path):
  write_files(tmp_path / "corpus", TRICKY)
  config = local_config(tmp_path / "corpus", tmp_path / "cache")
  splits = data_sources.load_pairs(config.data)
  assert isinstance(splits["train"], prepared_corpus.PreparedCorpus)
  assert isinstance(splits["validation"], list) and isinstance(splits["test"], list)
  expected = text_files.read_corpus(["c*", "a"], "en", "de", root=tmp_path / "corpus")
  assert list(splits["train"]) == expected
  # An index folder, a record of the file's version and a lock per file.
  assert len(os.listdir(tmp_path / "cache")) == 3 * 6


def test_prepare_command(tmp_path, capsys):
  write_files(tmp_path / "corpus", TRICKY)
  root, cache = tmp_path / "corpus", tmp_path / "cache"
  argv = ["prepare", "--experiment", "news_ende_small", f"data.root='{root}'"]
  argv += ["data.train_prefixes=['c*', 'a']", f"data.prepared_dir='{cache}'"]
  argv += ["tokenizer.vocab_size=27"]  # 8000 cannot be trained on these 14 sentences: exit 2
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  assert "10 training pairs in 6 files; 6 prepared now, 0 already were" in out
  assert f"Cache folder: {cache}" in out and f"{root / 'a.en'}  5 lines  prepared now" in out
  assert cli.main(argv) == 0
  assert "0 prepared now, 6 already were" in capsys.readouterr().out
  assert cli.main(["prepare", "--experiment", "demo"]) == 0
  assert "Nothing to prepare for demo: data.source='synthetic'" in capsys.readouterr().out
  # The explicit clean-up: indexes unread for 8 days go (this format's, and a path-keyed one
  # of format 3), the corpus's own stay (marked again by this preparation); under a day is
  # one error line.
  unused = [
    cache / "index-v4-0123456789abcdef0123456789abcdef",
    cache / f"a.en-{'0' * 16}-{'1' * 16}",
  ]
  for folder in unused:
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
  old = time.time() - 8 * 24 * 3600
  for name in os.listdir(cache):
    os.utime(cache / name, (old, old))
  assert cli.main([*argv, "--remove_unused_days", "7"]) == 0
  out = capsys.readouterr().out
  assert "6 already were" in out and f"Removed 2 line indexes unread for 7 days from {cache}" in out
  assert out.endswith("".join(f"  {folder}\n" for folder in sorted(unused)))
  assert not any(folder.exists() for folder in unused)
  assert list(prepare(["c*", "a"], root, cache)[0]) == text_files.read_corpus(
    ["c*", "a"], "en", "de", root=root
  )
  assert cli.main([*argv, "--remove_unused_days", "0.5"]) == 2
  err = capsys.readouterr().err
  assert err.splitlines() == [
    "error: --remove_unused_days 0.5: must be at least 1; a process reading an index marks "
    "it only once an hour."
  ]

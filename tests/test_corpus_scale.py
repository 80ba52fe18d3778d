"""The parts of benchmarks/corpus_scale.py (and of its corpus, benchmarks/harness/corpus.py)
that decide what it measures: the generated corpus must be line-aligned with news-like lengths
(a misaligned or empty-line corpus would measure another workload), and the /proc sampler must
read the memory of a live process. The benchmark itself runs for minutes and is never run
here."""

import argparse
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT))

from benchmarks import corpus_scale  # noqa: E402
from benchmarks.harness import corpus as _generated_corpus  # noqa: E402
from benchmarks.harness import process_memory as _process_memory  # noqa: E402


def _lines(path) -> list[str]:
  data = path.read_bytes()
  assert data.endswith(b"\n")
  return data.decode("utf-8").split("\n")[:-1]


@pytest.mark.parametrize("words_from", ["shared", "fallback"])
def test_generated_corpus_is_aligned_with_news_like_lengths(tmp_path, words_from):
  data_root = _generated_corpus.DEFAULT_DATA_ROOT if words_from == "shared" else tmp_path / "none"
  if words_from == "shared" and not (data_root / "news" / "en-de").is_dir():
    pytest.skip("no ../shared/data/news/en-de")
  prefix = tmp_path / "gen"
  stats = _generated_corpus.generate_corpus(prefix, 200, seed=1, data_root=data_root, chunk=64)
  source, target = _lines(tmp_path / "gen.en"), _lines(tmp_path / "gen.de")
  assert len(source) == len(target) == stats["pairs"] == 200
  source_words = np.array([len(line.split()) for line in source])
  target_words = np.array([len(line.split()) for line in target])
  assert source_words.min() >= 1 and target_words.min() >= 1
  assert source_words.max() <= _generated_corpus.MAX_WORDS
  assert stats["source_words"] == source_words.sum()
  assert stats["target_words"] == target_words.sum()
  assert stats["bytes"] == sum(len(line.encode()) + 1 for line in source + target)
  assert 18 <= source_words.mean() <= 32  # mean 25
  assert source_words.max() > 2 * source_words.mean()  # a long tail
  # The same seed gives the same corpus.
  _generated_corpus.generate_corpus(tmp_path / "again", 200, seed=1, data_root=data_root, chunk=64)
  assert (tmp_path / "again.en").read_bytes() == (tmp_path / "gen.en").read_bytes()


def test_novel_words_are_two_pool_words_written_together():
  """The Heaps tail of the generated corpus (benchmarks/harness/corpus.py render): each line
  keeps its word count, and the words not in the pool are each two pool words glued."""
  pool = _generated_corpus.pool_from_tokens("a bb ccc dddd a bb a".split())
  lengths = np.full(50, 10)
  text = _generated_corpus.render(pool, lengths, np.random.default_rng(0), novel=0.5)
  lines = text.decode().split("\n")
  assert lines[-1] == "" and [len(line.split(" ")) for line in lines[:-1]] == lengths.tolist()
  words = {"a", "bb", "ccc", "dddd"}
  glued = [w for line in lines[:-1] for w in line.split(" ") if w not in words]
  assert all(any(w == x + y for x in words for y in words) for w in glued)
  assert 0.4 < len(glued) / lengths.sum() < 0.6
  plain = _generated_corpus.render(pool, lengths, np.random.default_rng(0))
  assert set(plain.decode().split()) <= words


def test_tree_sampler_reads_this_process_and_a_child():
  sampler = _process_memory.TreeSampler(os.getpid())
  script = "import time; print('up', flush=True); time.sleep(30)"
  child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
  try:
    assert child.stdout.readline() == b"up\n"  # running Python, not a fork being replaced
    assert sampler.sample()
  finally:
    child.kill()
    child.wait()
    child.stdout.close()
  figures = sampler.gigabytes()
  assert figures["rss_gb_main"] > 0 and figures["rss_anon_gb_main"] > 0
  assert figures["rss_gb_worker_max"] > 0  # the child counts as a worker
  assert figures["rss_gb_total"] >= figures["rss_gb_main"] + figures["rss_gb_worker_max"] - 1e-3
  assert _process_memory.read_rss(child.pid) is None  # gone (reaped)


def test_sampler_of_a_finished_process_stops():
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  child.wait()
  sampler = _process_memory.TreeSampler(child.pid)
  assert not sampler.sample()
  assert sampler.gigabytes()["rss_gb_worker_max"] is None


@pytest.mark.parametrize("workers", [1, 2])
def test_tfds_dataset_opens_prepared_with_the_pairs_of_the_text_files(tmp_path, workers):
  """The synthetic TFDS dataset of `--source tfds` must be what the benchmark's training command
  reads: opened by the project's tfds source with the benchmark's overrides (so with no
  download), every line pair in file order, EN source and DE target, whichever process wrote
  which shard. Small blocks make the shard offsets cross block boundaries."""
  from benchmarks.harness import tfds_corpus as _tfds_corpus
  from transformer_mt.config import registry
  from transformer_mt.data import sources

  prefix = tmp_path / "gen"
  _generated_corpus.generate_corpus(prefix, 300, seed=2, data_root=tmp_path / "none", chunk=64)
  data_dir = tmp_path / "tfds"
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(_tfds_corpus, "BLOCK", 1000)
    written = _tfds_corpus.write_tfds_dataset(
      prefix, data_dir, workers=workers, held_out=40, num_shards=4
    )
  assert written["pairs"] == 300 and written["shards"] == 4
  assert written["dir"] == str(_tfds_corpus.dataset_dir(data_dir))
  assert written["dir"] == _tfds_corpus.builder(data_dir).data_dir
  assert _tfds_corpus.train_pairs(data_dir) == 300
  with pytest.raises(FileExistsError):  # never written over
    _tfds_corpus.write_tfds_dataset(prefix, data_dir)

  args = argparse.Namespace(vocab_size=100, sample_size=1000)
  keys = corpus_scale.overrides(args, "", "", 0, str(tmp_path), str(data_dir))
  config = registry.load_experiment(corpus_scale.EXPERIMENT, keys)
  assert (config.data.source, config.data.source_lang, config.data.target_lang) == (
    "tfds",
    "en",
    "de",
  )
  pairs = sources.load_pairs(config.data)
  expected = list(zip(_lines(tmp_path / "gen.en"), _lines(tmp_path / "gen.de")))
  assert len(pairs["train"]) == 300
  assert list(pairs["train"]) == expected
  assert pairs["train"].__getitems__([299, 0, 151]) == [expected[299], expected[0], expected[151]]
  assert list(pairs["validation"]) == list(pairs["test"]) == expected[:40]

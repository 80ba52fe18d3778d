"""A tokenizer trained on a prepared corpus is kept in its cache folder (data/tokenizer_cache.py)
and copied into each fresh workdir: byte-identical to one trained directly, trained again when
a setting or a corpus file changes, trained once by processes starting together, and trained
all the same when the cache folder cannot keep it. `run.py prepare` trains it ahead."""

import hashlib
import json
import logging
import os
import shutil
import threading
import time

import ml_collections
import numpy as np
import pytest

from transformer_mt import cli
from transformer_mt.data import prepared_corpus, text_files, tokenizer, tokenizer_cache


def write_corpus(folder, seed=0, lines=300):
  """`lines` generated sentence pairs as train.en / train.de: made-up words, enough of them
  for a vocabulary of 100 pieces."""
  rng = np.random.default_rng(seed)
  folder.mkdir(parents=True, exist_ok=True)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyzäöü"))
  for name in ("train.en", "train.de"):
    words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(300)]
    text = [" ".join(rng.choice(words, size=rng.integers(3, 12))) for _ in range(lines)]
    (folder / name).write_text("\n".join(text) + "\n")


def prepare(root, cache):
  files = text_files.corpus_files(["train"], "en", "de", root=root)
  corpus, _ = prepared_corpus.prepare(files, str(cache))
  return corpus


def settings(vocab_size=100):
  return ml_collections.ConfigDict(
    {"vocab_size": vocab_size, "model_type": "unigram", "sample_size": 400}
  )


def fresh(tmp_path, name):
  """A workdir (training makes it before the tokenizer); an existing one is kept (resumed)."""
  os.makedirs(tmp_path / name, exist_ok=True)
  return str(tmp_path / name)


def counting_trainer(monkeypatch):
  """Counts train_tokenizer calls (and still trains)."""
  calls = []
  train = tokenizer.train_tokenizer

  def counted(*args, **kwargs):
    calls.append(args[1:])
    return train(*args, **kwargs)

  monkeypatch.setattr(tokenizer, "train_tokenizer", counted)
  return calls


def cached_models(cache):
  return sorted(p.name for p in cache.iterdir() if p.name.startswith("tokenizer-"))


def test_the_cached_tokenizer_is_the_one_trained_directly(tmp_path, monkeypatch):
  write_corpus(tmp_path / "corpus")
  corpus, cache = prepare(tmp_path / "corpus", tmp_path / "cache"), tmp_path / "cache"
  direct = tokenizer.train_tokenizer(list(corpus), 100, "unigram", 400)
  calls = counting_trainer(monkeypatch)
  first = tokenizer.load_or_train(fresh(tmp_path, "w1"), corpus, settings())
  assert len(calls) == 1 and first.model_proto == direct.model_proto
  assert (tmp_path / "w1" / tokenizer.MODEL_FILENAME).read_bytes() == direct.model_proto
  models = cached_models(cache)
  assert [n.rsplit(".", 1)[1] for n in models] == ["json", "lock", "model"]
  described = json.loads((cache / models[0]).read_text())
  assert described["settings"]["vocab_size"] == 100 and described["settings"]["seed"] == 0
  assert described["files"] == [  # the files' contents, in order
    hashlib.sha256((tmp_path / "corpus" / name).read_bytes()).hexdigest()
    for name in ("train.en", "train.de")
  ]
  # A fresh workdir copies it: no training, its own file, the same bytes.
  again = tokenizer.load_or_train(fresh(tmp_path, "w2"), corpus, settings())
  assert len(calls) == 1 and again.model_proto == direct.model_proto
  assert (tmp_path / "w2" / tokenizer.MODEL_FILENAME).read_bytes() == direct.model_proto
  # A resumed workdir keeps its own, whatever the cache holds.
  (cache / models[2]).write_bytes(b"not read")
  resumed = tokenizer.load_or_train(fresh(tmp_path, "w1"), corpus, settings())
  assert resumed.model_proto == direct.model_proto and len(calls) == 1


def test_a_changed_setting_or_corpus_file_trains_a_new_one(tmp_path, monkeypatch):
  write_corpus(tmp_path / "corpus")
  cache = tmp_path / "cache"
  corpus = prepare(tmp_path / "corpus", cache)
  calls = counting_trainer(monkeypatch)
  tokenizer.load_or_train(fresh(tmp_path, "w1"), corpus, settings())
  smaller = tokenizer.load_or_train(fresh(tmp_path, "w2"), corpus, settings(vocab_size=90))
  assert len(calls) == 2 and smaller.vocab_size == 90
  assert len([n for n in cached_models(cache) if n.endswith(".model")]) == 2
  # The same corpus copied elsewhere, as a job staging its data on local disk does (new
  # paths, inodes and times): prepared again, its tokenizer found.
  shutil.copytree(tmp_path / "corpus", tmp_path / "staged", copy_function=shutil.copy)
  staged = prepare(tmp_path / "staged", cache)
  found = tokenizer.load_or_train(fresh(tmp_path, "w2b"), staged, settings())
  assert len(calls) == 2 and found.vocab_size == 100

  path = tmp_path / "corpus" / "train.en"
  stat = os.stat(path)
  write_corpus(tmp_path / "corpus", seed=1)  # same line count, other sentences
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
  changed = prepare(tmp_path / "corpus", cache)
  direct = tokenizer.train_tokenizer(list(changed), 100, "unigram", 400)
  retrained = tokenizer.load_or_train(fresh(tmp_path, "w3"), changed, settings())
  assert len(calls) == 4 and retrained.model_proto == direct.model_proto
  assert len([n for n in cached_models(cache) if n.endswith(".model")]) == 3


@pytest.mark.parametrize("blocked", [".model", ".lock"])
def test_a_cache_that_cannot_keep_it_still_trains(tmp_path, monkeypatch, caplog, blocked):
  write_corpus(tmp_path / "corpus")
  corpus = prepare(tmp_path / "corpus", tmp_path / "cache")
  model_path = tokenizer_cache.model_path(corpus, tokenizer.cache_settings(settings()))
  # A folder where the file should be: no writes there, even as root.
  os.mkdir(model_path.removesuffix(".model") + blocked)
  calls = counting_trainer(monkeypatch)
  with caplog.at_level(logging.WARNING):
    trained = tokenizer.load_or_train(fresh(tmp_path, "w"), corpus, settings())
  assert len(calls) == 1 and trained.vocab_size == 100
  assert (tmp_path / "w" / tokenizer.MODEL_FILENAME).read_bytes() == trained.model_proto
  assert "Cannot keep the tokenizer in the prepared corpus cache" in caplog.text
  assert not [n for n in os.listdir(tmp_path / "cache") if ".tmp-" in n]


def test_processes_starting_together_train_once(tmp_path):
  write_corpus(tmp_path / "corpus")
  corpus = prepare(tmp_path / "corpus", tmp_path / "cache")
  calls, results = [], []

  def train():
    calls.append(1)
    time.sleep(0.2)  # long enough for the other to wait on the lock (the count holds anyway)
    return b"model"

  def first_run():
    results.append(tokenizer_cache.load_or_train(corpus, {"vocab_size": 1}, train))

  threads = [threading.Thread(target=first_run) for _ in range(2)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert len(calls) == 1
  assert sorted(found for _, _, found in results) == [False, True]
  assert {proto for proto, _, _ in results} == {b"model"}


def test_prepare_command_trains_the_tokenizer_ahead(tmp_path, capsys, monkeypatch):
  write_corpus(tmp_path / "corpus")
  cache = tmp_path / "cache"
  argv = ["prepare", "--experiment", "news_ende_small", f"data.root='{tmp_path / 'corpus'}'"]
  argv += ["data.train_prefixes=['train']", "data.validation_prefixes=[]"]
  argv += ["data.test_prefixes=[]", f"data.prepared_dir='{cache}'"]
  argv += ["tokenizer.vocab_size=100", "tokenizer.sample_size=400"]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  model = [n for n in cached_models(cache) if n.endswith(".model")]
  assert len(model) == 1 and f"Tokenizer: {cache / model[0]}  vocab 100  trained now" in out
  assert cli.main(argv) == 0
  assert "vocab 100  already trained" in capsys.readouterr().out
  # The fresh workdir of a training run with the same settings trains nothing.
  calls = counting_trainer(monkeypatch)
  workdir = fresh(tmp_path, "w")
  trained = tokenizer.load_or_train(workdir, prepare(tmp_path / "corpus", cache), settings())
  assert not calls and trained.model_proto == (cache / model[0]).read_bytes()

  assert cli.main([*argv, f"init.from='{tmp_path / 'imported'}'"]) == 0
  assert "Tokenizer: none trained; init.from=" in capsys.readouterr().out
  # A tokenizer that cannot be trained fails the command (exit 2, one error line), after
  # the corpus summary: a job script that checks the exit code stops before the job.
  assert cli.main([*argv[:-2], "tokenizer.vocab_size=100000"]) == 2
  captured = capsys.readouterr()
  assert "training pairs in" in captured.out
  errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "The corpus is prepared, but no tokenizer" in errors[0]

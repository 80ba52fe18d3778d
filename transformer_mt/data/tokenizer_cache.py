"""Trained SentencePiece models kept beside a prepared corpus, so a fresh workdir on the same
corpus and tokenizer settings copies one instead of training it again.

Training samples up to `tokenizer.sample_size` sentences by random access, minutes at WMT size;
a sweep of fresh workdirs would pay it every trial. The model is a function of the corpus (the
SHA-256 of every file's bytes, in order: `PreparedCorpus.content_key`, so a copy of the corpus
at another path, as a job that stages its data on a node's local disk makes, finds it) and of
the settings the trainer is called with (`tokenizer.cache_settings`), so both are hashed into
its name, `tokenizer-HASH.model` in the prepared corpus's cache folder, with
`tokenizer-HASH.json` beside it saying what it was trained on. A changed file or setting names
another model, trained anew.

The first process to need one trains it under an exclusive flock on `tokenizer-HASH.lock`
(cache_writes.locked), so processes starting together train once, and writes it with
`text_files.write_atomically` (a temporary file, flushed to disk, then renamed): a model under
its final name is complete. A cache folder that cannot be written costs only the reuse: the
model is trained and returned all the same, with a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping

from transformer_mt.data import cache_writes, line_index_cache, prepared_corpus, text_files

# Bump when what is stored changes meaning (the key's layout or the files' contents).
CACHE_VERSION = 2  # 2: keyed by the files' contents, not their paths and metadata
_PREFIX = "tokenizer-"


def model_path(corpus: prepared_corpus.PreparedCorpus, settings: Mapping) -> str | None:
  """Where the model of `corpus` trained with `settings` is kept, or None for a corpus of no
  files (it has no cache folder)."""
  if not corpus.indexes:
    return None
  folder = os.path.dirname(corpus.indexes[0][0].index_dir)
  digest = hashlib.sha256(_key_json(corpus, settings).encode()).hexdigest()[:16]
  return os.path.join(folder, f"{_PREFIX}{digest}.model")


def load_or_train(
  corpus: prepared_corpus.PreparedCorpus, settings: Mapping, train: Callable[[], bytes]
) -> tuple[bytes, str | None, bool]:
  """The model of `corpus` and `settings`: the cached one, else `train()`'s, then stored.

  Args:
    settings: everything that changes the model, JSON-serializable; part of the key.
    train: trains the model (its serialized proto); called at most once.

  Returns:
    (model proto, its path in the cache or None when it could not be stored there, whether it
    came from the cache).
  """
  path = model_path(corpus, settings)
  if path is None:
    return train(), None, False
  proto = _read(path)
  if proto is not None:
    return proto, path, True
  with contextlib.ExitStack() as stack:
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      stack.enter_context(
        cache_writes.locked(path.removesuffix(".model") + ".lock", line_index_cache.cannot_write)
      )
    except (OSError, text_files.DataError) as e:
      _warn(path, e)
      return train(), None, False
    proto = _read(path)  # another process may have trained it meanwhile
    if proto is not None:
      return proto, path, True
    proto = train()
    try:
      # The description first: a model under its final name always has one.
      description = _key_json(corpus, settings)
      text_files.write_atomically(path.removesuffix(".model") + ".json", description)
      text_files.write_atomically(path, proto)
    except text_files.DataError as e:
      _warn(path, e)
      return proto, None, False
  return proto, path, False


def _key_json(corpus: prepared_corpus.PreparedCorpus, settings: Mapping) -> str:
  """What the model is trained on, as stored beside it and hashed into its name."""
  key = {
    "cache_version": CACHE_VERSION,
    "settings": dict(settings),
    "files": [sha256 for _, sha256 in corpus.content_key()],
  }
  return json.dumps(key, indent=1, sort_keys=True) + "\n"


def _read(path: str) -> bytes | None:
  try:
    with open(path, "rb") as f:
      return f.read()
  except OSError:
    return None


def _warn(path: str, error: Exception) -> None:
  logging.warning(
    "Cannot keep the tokenizer in the prepared corpus cache (%s): %s. Training goes on; the "
    "workdir keeps its own copy, and the next fresh workdir trains it again.",
    path,
    error,
  )

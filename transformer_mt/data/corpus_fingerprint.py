"""What a checkpoint's position in the training data refers to, so a resume over other data
is caught instead of continuing silently.

A checkpoint stores the data iterator's position in a shuffled stream. The shuffle is a
permutation of the pair count, and the pairs are read by index: if a training file changed
(another version of a corpus, a file added to a glob) the same position means other pairs, in
another order if the count changed, and the run would go on as if nothing happened. The
fingerprint saved beside the position is the training pairs' count, each prepared file's
content digest in order (prepared_corpus.content_key, with its path to name it), and a hash of
the tokenizer (other pieces make other rows). `differences` names what changed.

Content, not file metadata: on a cluster a corpus is often copied to a node's local disk at the
start of every job, and every copy has a new path, inode, mtime and ctime; a resume over such a
copy is over the same data. Checkpoints written before the digests (entries of path, size,
mtime, inode and ctime) are compared as they were then, by those fields.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from typing import Any

from transformer_mt.data import line_index_cache
from transformer_mt.data import tokenizer as tokenizers
from transformer_mt.runtime import errors

# How many changed files a message names before it counts the rest.
_NAMED = 3


class CorpusChanged(errors.BadValue):
  """A data iterator's state restored over other training data than it was saved on."""


def fingerprint(pairs: Sequence, tokenizer: Any) -> dict[str, Any]:
  """The training data's fingerprint: {"pairs", "files" (None for sources not read from
  prepared files: synthetic, TFDS), "tokenizer"}; JSON-serializable."""
  content_key = getattr(pairs, "content_key", None)
  files = tokenizers.to_files(tokenizer)
  digest = hashlib.sha256()
  for name in sorted(files):
    digest.update(name.encode() + b"\0" + files[name] + b"\0")
  return {
    "pairs": len(pairs),
    "files": [list(entry) for entry in content_key()] if content_key else None,
    "tokenizer": digest.hexdigest()[:16],
  }


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
  """What differs between the fingerprint a checkpoint saved and this run's, in words; []
  when nothing does."""
  changes = []
  if saved.get("pairs") != current.get("pairs"):
    changes.append(f"{saved.get('pairs')} training pairs then, {current.get('pairs')} now")
  files = _files_changed(saved.get("files") or [], current.get("files") or [])
  if files:
    changes.append(files)
  if saved.get("tokenizer") != current.get("tokenizer"):
    changes.append("another tokenizer")
  return changes


def check(saved: dict | None, current: dict | None, allow_changed: bool) -> None:
  """Raises CorpusChanged naming the changes, or with `allow_changed` warns, when the data
  differ from those a state was saved on. A state saved before fingerprints were (None) is
  taken as it is."""
  if saved is None or current is None:
    return
  changes = differences(saved, current)
  if not changes:
    return
  what = "; ".join(changes)
  if not allow_changed:
    raise CorpusChanged(
      f"The training data changed since this checkpoint was written ({what}): its position "
      "in the shuffled stream would now name other pairs. Restore the data, train into a new "
      "--workdir, or pass data.allow_changed_corpus=True to go on over the new data."
    )
  logging.warning(
    "The training data changed since this checkpoint was written (%s); going on over the new "
    "data (data.allow_changed_corpus=True): the stream continues from the same position, "
    "of another shuffle if the pair count changed.",
    what,
  )


def _files_changed(saved: list, current: list) -> str:
  """The files that changed, in words; "" when none did."""
  if all(len(entry) == 2 for entry in saved):
    return _contents_changed(saved, current)
  return _metadata_changed(saved, [path for path, _ in current])


def _contents_changed(saved: list, current: list) -> str:
  """Which files, in order, hold other bytes: file k then against file k now."""
  words = []
  for k in range(max(len(saved), len(current))):
    if k >= len(current):
      words.append(f"{saved[k][0]} gone")
    elif k >= len(saved):
      words.append(f"{current[k][0]} new")
    elif saved[k][1] != current[k][1]:
      path, then = current[k][0], saved[k][0]
      words.append(f"{path} holds other text" + (f" than {then} did" if then != path else ""))
  return _named(words)


def _metadata_changed(saved: list, current: list) -> str:
  """For a checkpoint of before the digests: which files' path, size, mtime, inode or ctime
  differ (`current`: the paths alone, the present metadata read here)."""
  current = [[path, *_state(path)] for path in current]
  if current == saved:
    return ""
  then = {entry[0]: entry[1:] for entry in saved}
  now = {entry[0]: entry[1:] for entry in current}
  fields = ("size", "mtime_ns", "inode", "ctime_ns")
  words = []
  for path in sorted(set(then) | set(now)):
    if path not in now:
      words.append(f"{path} gone")
    elif path not in then:
      words.append(f"{path} new")
    elif then[path] != now[path]:
      what = [f for f, a, b in zip(fields, then[path], now[path]) if a != b]
      words.append(f"{path} changed ({', '.join(what) or 'order'})")
  if not words:
    words.append("the training files in another order")
  return _named(words)


def _state(path: str) -> tuple:
  """The file's metadata as the prepared index keyed it (line_index_cache.file_state); () when
  it cannot be read."""
  try:
    return line_index_cache.file_state(os.stat(path))
  except OSError:
    return ()


def _named(words: list[str]) -> str:
  if not words:
    return ""
  more = len(words) - _NAMED
  named = "; ".join(words[:_NAMED]) + (f"; and {more} more" if more > 0 else "")
  return named

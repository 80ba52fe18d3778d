"""Line-aligned parallel text files supplied by the user: `PREFIX.SRC` / `PREFIX.TGT`.

Line i of the source file is the translation of line i of the target file, so the
only structure is the line itself. That makes silent misreads costly: one missing
line shifts every later pair, and a file in the wrong encoding either crashes deep
inside the pipeline or trains on mojibake. Every check here therefore fails early
with a `DataError` that names the file (and line), says what was wrong and what to
do about it.

Lines are split on b"\\n" only (never on the other characters `str.splitlines`
treats as breaks, such as U+2028 or \\x0c, which do occur inside sentences of web
text and would desynchronise the two sides). Only the line terminator ("\\n" or
"\\r\\n") is removed; empty lines are kept as "" so that line numbers stay aligned;
dropping them is the pipeline's job, done on both sides at once.
"""

from __future__ import annotations

import difflib
import glob
import json
import os
from collections.abc import Sequence
from typing import Any

from transformer_mt.runtime import errors

_BOM = "\ufeff"
_GLOB_CHARS = frozenset("*?[")
_MAX_SUGGESTIONS = 10

PathLike = str | os.PathLike


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
  """Writes `data` (UTF-8 text or bytes) so a crash leaves either the old file or the new
  one, never half of it: write a temporary file beside it, flush it to disk (a rename that
  reaches the disk before the data can leave an empty file after a power loss), then rename.
  A path that cannot be written (no such directory, no permission, a full disk) is one
  DataError naming it. The temporary name is unique across hosts (a shared folder, processes
  of two containers with one PID)."""
  from transformer_mt.data import cache_writes

  tmp = cache_writes.temporary_name(f"{os.fspath(path)}.tmp-")
  try:
    with open(tmp, "wb") as f:
      f.write(data.encode("utf-8") if isinstance(data, str) else data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise DataError(cannot_write(path, e)) from e


def cannot_write(path: str | os.PathLike, error: OSError) -> str:
  """The message of a file the command cannot write, with what to check."""
  return (
    f"Cannot write {os.fspath(path)}: {error.strerror or error}; check that its directory "
    "exists and is writable, and that the disk has space."
  )


def read_json(path: str | os.PathLike) -> Any:
  """The JSON value in `path`. A missing file is errors.MissingFile, one that is not JSON (or
  not UTF-8) a DataError, each naming the path."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise errors.MissingFile(f"{path} does not exist (or is not a file).")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
    raise DataError(f"{path} is not valid JSON ({e}); restore or recreate it.") from e
  except OSError as e:
    raise DataError(f"Cannot read {path}: {e.strerror or e}.") from e


class DataError(errors.BadValue):
  """A problem with the user's data files: the message says what, where and what to do."""


def read_lines(path: PathLike) -> list[str]:
  """All lines of a UTF-8 text file, without their "\\n" / "\\r\\n" terminators.

  The whole file is read as bytes and decoded in one call, which is the fast path
  for files of hundreds of MB; only if that fails is the position of the first bad
  byte turned into a line number for the error message. A final line without a
  newline counts as a line; a UTF-8 byte order mark at the start is dropped (it is
  invisible in editors and would otherwise become part of the first sentence).
  """
  path = os.fspath(path)
  check_is_file(path)
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:  # Permission denied, I/O errors: still the user's file to fix.
    raise DataError(f"Cannot read {path}: {e.strerror or e}.") from e
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise _decode_error(path, data, e) from None
  del data
  if text.startswith(_BOM):
    text = text[1:]
  lines = text.split("\n")
  if lines[-1] == "":  # The usual final newline (or an empty file): not an extra line.
    lines.pop()
  if "\r" in text:
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
  return lines


def read_parallel(source_path: PathLike, target_path: PathLike) -> list[tuple[str, str]]:
  """(source line, target line) pairs from two line-aligned UTF-8 files.

  Raises `DataError` for a missing file, a directory, invalid UTF-8, or files whose
  line counts differ (which means they are not aligned, so no pair can be trusted).
  """
  source_lines = read_lines(source_path)
  target_lines = read_lines(target_path)
  if len(source_lines) != len(target_lines):
    raise DataError(
      _count_mismatch_message(
        os.fspath(source_path), source_lines, os.fspath(target_path), target_lines
      )
    )
  return list(zip(source_lines, target_lines))


def corpus_files(
  prefixes: Sequence[str], source_lang: str, target_lang: str, root: PathLike | None = None
) -> list[tuple[str, str]]:
  """(source file, target file) paths: `PREFIX.source_lang`, `PREFIX.target_lang`.

  Relative prefixes are taken relative to `root` when it is given. A prefix may be a
  glob pattern (`news/en-de/newstest201[0-2]`); it expands to the sorted prefixes
  for which either language's file exists (either, not both, so that a corpus with
  one side missing is reported by `read_parallel` instead of silently skipped), and
  a pattern that matches nothing is a `DataError`. The result keeps the order of
  `prefixes` and lists each pair once. Plain prefixes are not checked for existence
  here; `read_parallel` does that with a better message.
  """
  if isinstance(prefixes, (str, os.PathLike)):  # A lone prefix, not a sequence of characters.
    prefixes = [prefixes]
  if not prefixes:
    raise DataError(
      "No corpus prefixes given: pass e.g. ['news/en-de/newstest2014'] for "
      f"the files newstest2014.{source_lang} and newstest2014.{target_lang}."
    )
  for name, lang in (("source_lang", source_lang), ("target_lang", target_lang)):
    if not lang or lang.startswith(".") or os.sep in lang:
      raise DataError(
        f"{name}={lang!r} is not a file suffix: pass the language code that "
        "ends the file names without the dot, e.g. 'en' for newstest2014.en "
        "or 'deu' for deu-eng.deu."
      )
  root = os.fspath(root) if root is not None else None
  pairs: list[tuple[str, str]] = []
  seen: set[tuple[str, str]] = set()
  for prefix in prefixes:
    prefix = os.fspath(prefix)
    for expanded in _expand_prefix(prefix, source_lang, target_lang, root):
      pair = (f"{expanded}.{source_lang}", f"{expanded}.{target_lang}")
      key = (os.path.abspath(pair[0]), os.path.abspath(pair[1]))
      if key not in seen:
        seen.add(key)
        pairs.append(pair)
  return pairs


def read_corpus(
  prefixes: Sequence[str], source_lang: str, target_lang: str, root: PathLike | None = None
) -> list[tuple[str, str]]:
  """All pairs of `corpus_files(prefixes, source_lang, target_lang, root)`, in that order."""
  pairs: list[tuple[str, str]] = []
  for source_path, target_path in corpus_files(prefixes, source_lang, target_lang, root):
    pairs.extend(read_parallel(source_path, target_path))
  return pairs


def _expand_prefix(prefix: str, source_lang: str, target_lang: str, root: str | None) -> list[str]:
  """The prefix itself (joined to root), or the sorted prefixes a glob pattern matches."""
  joined = prefix if root is None or os.path.isabs(prefix) else os.path.join(root, prefix)
  if not _GLOB_CHARS & set(prefix):
    for lang in (source_lang, target_lang):
      # "corpus.en" given as the prefix looks for "corpus.en.en"; say so instead of
      # reporting a missing file next to one that plainly exists.
      if (
        joined.endswith(f".{lang}")
        and os.path.isfile(joined)
        and not os.path.exists(f"{joined}.{lang}")
      ):
        raise DataError(
          f"Corpus prefix {prefix!r} ends with the language suffix '.{lang}': "
          f"give the prefix without it, {prefix[: -len(lang) - 1]!r}, and the "
          f"languages separately ({source_lang!r}, {target_lang!r})."
        )
    return [joined]
  # Glob relative to root with root_dir, so that glob characters in root itself
  # (e.g. a directory called "data[1]") are not taken as part of the pattern.
  glob_root = None if os.path.isabs(prefix) else root
  matches = set()
  for lang in (source_lang, target_lang):
    suffix = f".{lang}"
    for match in glob.glob(prefix + suffix, root_dir=glob_root):
      matches.add(match[: -len(suffix)])
  if not matches:
    where = f" under {root}" if glob_root is not None else ""
    raise DataError(
      f"Corpus pattern {prefix!r} matches no files{where}: looked for "
      f"{prefix}.{source_lang} and {prefix}.{target_lang}. Check the pattern "
      "and the languages; a pattern names the prefix, without the language "
      "suffix." + _directory_listing_hint(joined)
    )
  if glob_root is not None:
    return [os.path.join(glob_root, match) for match in sorted(matches)]
  return sorted(matches)


def check_is_file(path: str) -> None:
  """A DataError naming `path` (with the nearest file names) unless it is an existing file."""
  if os.path.isdir(path):
    raise DataError(
      f"{path} is a directory, but a text file with one sentence per line was "
      "expected: pass the file inside it (or, for corpora, the prefix of the "
      "file names, e.g. 'news/en-de/newstest2014' for newstest2014.en/.de)."
    )
  if not os.path.exists(path):
    message = f"No such file: {path}"
    if not os.path.isabs(path):
      message += f" (resolved to {os.path.abspath(path)})"
    raise DataError(message + "." + _directory_listing_hint(path))


def _directory_listing_hint(path: str) -> str:
  """' Files in DIR, closest names first: ...' so that a typo is obvious at a glance."""
  parent = os.path.dirname(path) or "."
  if not os.path.isdir(parent):
    return f" Its directory {parent} does not exist either."
  try:
    names = [entry.name for entry in os.scandir(parent) if entry.is_file()]
  except OSError:
    return ""
  if not names:
    return f" Its directory {parent} contains no files."
  closest = difflib.get_close_matches(os.path.basename(path), names, n=_MAX_SUGGESTIONS, cutoff=0.0)
  more = len(names) - len(closest)
  listing = ", ".join(closest) + (f" (and {more} more)" if more > 0 else "")
  return f" Files in {parent}, closest names first: {listing}."


def _decode_error(path: str, data: bytes, error: UnicodeDecodeError) -> DataError:
  """Turns the first undecodable byte offset into a line number and column for the user."""
  line_start = data.rfind(b"\n", 0, error.start) + 1
  return decode_error(
    path,
    line_number=data.count(b"\n", 0, error.start) + 1,
    column=error.start - line_start + 1,  # 1-based, like the line number and editors' columns.
    offset=error.start,
    bad=data[error.start : error.end],
    reason=error.reason,
    utf16=data.startswith((b"\xff\xfe", b"\xfe\xff")),
  )


def decode_error(
  path: str, line_number: int, column: int, offset: int, bad: bytes, reason: str, utf16: bool
) -> DataError:
  """The DataError of a file that is not UTF-8: where (1-based line and byte of the line,
  0-based file offset), which bytes, and the `iconv` command that converts it. Shared by
  `read_lines` and the chunked scan of data/prepared_corpus.py, so both say the same."""
  if utf16:
    encoding, note = "utf-16", " (it starts with a UTF-16 byte order mark)"
  else:
    encoding = "<enc>"
    note = (
      ", where <enc> is the file's encoding: often latin1 or cp1252 for Western "
      "European text; `file -i` can guess it"
    )
  return DataError(
    f"{path} is not valid UTF-8: line {line_number}, byte {column} of the line "
    f"(0-based file offset {offset}), bytes {bad.hex(' ')} ({reason}). "
    f"Convert it with `iconv -f {encoding} -t utf-8 {path} > {path}.utf8`{note}; "
    "then use the converted file."
  )


def _count_mismatch_message(
  source_path: str, source_lines: list[str], target_path: str, target_lines: list[str]
) -> str:
  longer, shorter = (
    (source_lines, target_lines)
    if len(source_lines) > len(target_lines)
    else (target_lines, source_lines)
  )
  return count_mismatch_message(
    source_path,
    len(source_lines),
    target_path,
    len(target_lines),
    extra_lines_empty=not any(longer[len(shorter) :]),
  )


def count_mismatch_message(
  source_path: str,
  source_count: int,
  target_path: str,
  target_count: int,
  extra_lines_empty: bool,
) -> str:
  """The message of two parallel files with different line counts; `extra_lines_empty`: the
  longer file's lines beyond the shorter's are all empty (then removing them is the fix).
  Shared with data/prepared_corpus.py, which knows the counts without the lines."""
  message = (
    f"The parallel files have different line counts: {source_path} has "
    f"{source_count} lines, {target_path} has {target_count}. Line i of "
    "one must be the translation of line i of the other, so check that both are "
    "the same version of the corpus and that neither was truncated or had lines "
    "added or removed (e.g. by a filter applied to one side only)."
  )
  if extra_lines_empty:
    longer_path = source_path if source_count > target_count else target_path
    message += (
      f" The extra {abs(source_count - target_count)} line(s) at the end of "
      f"{longer_path} are empty; if that is all, removing them fixes it."
    )
  return message

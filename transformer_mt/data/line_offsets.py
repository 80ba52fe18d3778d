"""One pass over a text file: the start offset of every line (the index line_index_cache.py
keeps), a check that it is UTF-8 as `text_files.read_lines` checks, and a digest of its bytes.

The digest is what the file's content is, wherever it lies: a corpus copied to a node's local
disk at the start of every job (new path, inode, mtime and ctime each time) is still the data a
checkpoint was written on (corpus_fingerprint.py), and only a change of content is a change.
SHA-256 runs at ~1.7 GB/s here (SHA-NI), a few seconds on the 11.6 GB of a 36M-pair corpus,
on bytes the scan reads anyway.

The file is read 16 MiB at a time, so memory stays small however large the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os

import numpy as np

from transformer_mt.data import text_files

CHUNK = 1 << 24  # bytes scanned at a time
_BOM = b"\xef\xbb\xbf"


@dataclasses.dataclass(frozen=True)
class Scanned:
  """What one pass over a file found, beside the offsets it wrote."""

  lines: int
  sha256: str  # hex digest of every byte of the file, a byte order mark included


def scan(path: str, offsets_path: str) -> Scanned:
  """Writes the int64 [lines + 1] offsets of `path` to `offsets_path` as .npy: the start of
  each line, then one past the end of the last line's terminator (file size + 1 when the last
  line has none, so that line i is always offsets[i] .. offsets[i + 1] - 1). Checks that the
  file is UTF-8, one block of whole lines at a time (a newline byte never occurs inside a
  multi-byte character, so blocks cut after one decode exactly as the whole file would)."""
  header_size = len(npy_header(10**18))
  digest = hashlib.sha256()
  with _open_to_read(path) as source, open(offsets_path, "wb") as out:
    out.write(b"\0" * header_size)  # rewritten once the count is known
    first = source.read(3)
    digest.update(first)
    start = len(_BOM) if first == _BOM else 0
    utf16 = first.startswith((b"\xff\xfe", b"\xfe\xff"))
    out.write(np.int64(start).tobytes())
    written, last = 1, start
    carry, base, lines_before = first, 0, 0  # base: file offset of carry[0]
    while True:
      try:
        block = source.read(CHUNK)
      except OSError as e:
        raise text_files.DataError(f"Cannot read {path}: {e.strerror or e}.") from e
      digest.update(block)
      end = not block
      buffer = carry + block
      cut = len(buffer) if end else buffer.rfind(b"\n") + 1
      if not end and cut == 0:  # no line ends in this block yet
        carry = buffer
        continue
      piece, carry = buffer[:cut], buffer[cut:]
      _check_utf8(path, piece, base, lines_before, utf16)
      starts = np.flatnonzero(np.frombuffer(piece, np.uint8) == 10).astype(np.int64) + (base + 1)
      write_offsets(out, starts)
      if len(starts):
        written, last = written + len(starts), int(starts[-1])
      lines_before += len(starts)
      base += cut
      if end:
        break
    if last != base:  # a final line without "\n": its end as if it had one
      write_offsets(out, np.array([base + 1], np.int64))
      written += 1
    header = npy_header(written)
    assert len(header) == header_size, (len(header), header_size)
    out.seek(0)
    out.write(header)
    out.flush()
    os.fsync(out.fileno())
  return Scanned(written - 1, digest.hexdigest())


def _open_to_read(path: str):
  """`open(path, "rb")`; failing, read_lines' DataError (not a cache folder's write error)."""
  try:
    return open(path, "rb")  # noqa: SIM115 (the caller's `with` closes it)
  except OSError as e:
    raise text_files.DataError(f"Cannot read {path}: {e.strerror or e}.") from e


def write_offsets(out, starts: np.ndarray) -> None:
  out.write(starts.astype("<i8", copy=False).tobytes())


def _check_utf8(path: str, piece: bytes, base: int, lines_before: int, utf16: bool) -> None:
  """Raises read_lines' DataError if `piece` (whole lines at file offset `base`, after
  `lines_before` lines) is not UTF-8."""
  try:
    piece.decode("utf-8")
  except UnicodeDecodeError as e:
    line_start = piece.rfind(b"\n", 0, e.start) + 1
    raise text_files.decode_error(
      path,
      line_number=lines_before + piece.count(b"\n", 0, e.start) + 1,
      column=e.start - line_start + 1,
      offset=base + e.start,
      bad=piece[e.start : e.end],
      reason=e.reason,
      utf16=utf16,
    ) from None


def npy_header(entries: int) -> bytes:
  """The .npy (version 1.0) header of an int64 [entries] array: padded to 128 bytes for any
  count below 10**19, so a placeholder of the same length can be written first."""
  header = io.BytesIO()
  np.lib.format.write_array_header_1_0(
    header, {"descr": "<i8", "fortran_order": False, "shape": (entries,)}
  )
  return header.getvalue()

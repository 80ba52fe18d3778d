"""Reading user-supplied parallel text: real WMT files, and the errors for bad input."""

import pathlib
import re

import pytest
import shared_data

from transformer_mt.data import text_files
from transformer_mt.data.text_files import DataError

# The shared data folder (../shared/data): skipped when absent, failed under CI.
DATA = shared_data.DIR


@pytest.mark.shared_data("news/en-de/newstest2014.en", "news/en-de/newstest2014.de")
def test_reads_newstest2014_en_de():
  prefix = DATA / "news" / "en-de" / "newstest2014"
  pairs = text_files.read_parallel(f"{prefix}.en", f"{prefix}.de")
  assert len(pairs) == 3003
  with open(f"{prefix}.en", encoding="utf-8") as f:
    first_english = f.readline().rstrip("\n")
  with open(f"{prefix}.de", encoding="utf-8") as f:
    last_german = f.readlines()[-1].rstrip("\n")
  assert pairs[0][0] == first_english and first_english
  assert pairs[-1][1] == last_german
  assert all(isinstance(s, str) and isinstance(t, str) for s, t in pairs)
  assert not any(s.endswith(("\n", "\r")) or t.endswith(("\n", "\r")) for s, t in pairs)
  # Same pairs through the prefix API, relative to root.
  assert text_files.read_corpus(["news/en-de/newstest2014"], "en", "de", root=str(DATA)) == pairs


@pytest.mark.shared_data(
  *(f"news/en-de/newstest201{year}.{lang}" for year in "012" for lang in ("en", "de"))
)
def test_glob_over_news_years_is_sorted_and_deduplicated():
  files = text_files.corpus_files(
    ["news/en-de/newstest201[0-2]", "news/en-de/newstest2011"], "en", "de", root=DATA
  )
  assert [pathlib.Path(s).name for s, _ in files] == [
    "newstest2010.en",
    "newstest2011.en",
    "newstest2012.en",
  ]
  assert [pathlib.Path(t).name for _, t in files] == [
    "newstest2010.de",
    "newstest2011.de",
    "newstest2012.de",
  ]
  pairs = text_files.read_corpus(["news/en-de/newstest201[0-2]"], "en", "de", root=DATA)
  expected = sum(len(text_files.read_parallel(s, t)) for s, t in files)
  assert len(pairs) == expected > 6000


@pytest.mark.shared_data("tatoeba/deu-eng.deu", "tatoeba/deu-eng.eng")
def test_tatoeba_three_letter_codes():
  pairs = text_files.read_corpus([str(DATA / "tatoeba" / "deu-eng")], "deu", "eng")
  assert len(pairs) == 17565


@pytest.mark.shared_data("news/en-de/newstest2014.en")
def test_prefix_with_language_suffix_is_explained():
  with pytest.raises(
    DataError, match=r"ends with the language suffix '\.en'.*'news/en-de/newstest2014'"
  ):
    text_files.corpus_files(["news/en-de/newstest2014.en"], "en", "de", root=DATA)


def test_missing_file_names_path_and_suggests_close_name(tmp_path):
  for name in ("newstest2014.en", "newstest2014.de", "train.en", "train.de"):
    (tmp_path / name).write_text("a\n", encoding="utf-8")
  missing = tmp_path / "newstest2104.en"
  with pytest.raises(DataError) as info:
    text_files.read_parallel(missing, tmp_path / "newstest2014.de")
  message = str(info.value)
  assert str(missing) in message
  # The closest existing name comes first in the listing.
  assert re.search(r"closest names first: newstest2014\.en, ", message), message


def test_missing_parent_directory_is_reported(tmp_path):
  with pytest.raises(DataError, match="does not exist either"):
    text_files.read_lines(tmp_path / "nowhere" / "x.en")


def test_directory_instead_of_file(tmp_path):
  (tmp_path / "corpus.en").mkdir()
  (tmp_path / "corpus.de").write_text("a\n", encoding="utf-8")
  with pytest.raises(DataError, match=re.escape(str(tmp_path / "corpus.en")) + " is a directory"):
    text_files.read_parallel(tmp_path / "corpus.en", tmp_path / "corpus.de")


def test_different_line_counts_name_both_files_and_counts(tmp_path):
  source, target = tmp_path / "c.en", tmp_path / "c.de"
  source.write_text("a\nb\nc\n", encoding="utf-8")
  target.write_text("x\ny\n", encoding="utf-8")
  with pytest.raises(DataError) as info:
    text_files.read_parallel(source, target)
  message = str(info.value)
  assert f"{source} has 3 lines" in message and f"{target} has 2" in message


def test_invalid_utf8_names_file_line_and_iconv(tmp_path):
  path = tmp_path / "latin1.de"
  path.write_bytes("eins\nzwei\nGrüße aus Köln\n".encode("latin-1"))
  with pytest.raises(DataError) as info:
    text_files.read_lines(path)
  message = str(info.value)
  assert str(path) in message
  assert "line 3, byte 3 of the line" in message  # "Gr" then the latin-1 "ü" (0xfc).
  assert "bytes fc" in message and f"iconv -f <enc> -t utf-8 {path} >" in message


def test_crlf_and_missing_final_newline(tmp_path):
  source, target = tmp_path / "w.en", tmp_path / "w.de"
  source.write_bytes(b"Hello\r\nWorld\r\n")
  target.write_bytes(b"Hallo\r\nWelt")  # No newline after the last line: still a line.
  assert text_files.read_parallel(source, target) == [("Hello", "Hallo"), ("World", "Welt")]


def test_only_line_terminators_are_stripped(tmp_path):
  path = tmp_path / "t.en"
  # A lone \r, a form feed and U+2028 inside a line are content, not line breaks, and
  # surrounding spaces are kept; a leading UTF-8 byte order mark is dropped.
  path.write_bytes("\ufeff a\rb \nc\x0cd\u2028e\n".encode("utf-8"))
  assert text_files.read_lines(path) == [" a\rb ", "c\x0cd\u2028e"]


def test_empty_lines_are_kept(tmp_path):
  source, target = tmp_path / "e.en", tmp_path / "e.de"
  source.write_text("one\n\nthree\n\n", encoding="utf-8")
  target.write_text("eins\nzwei\n\n\n", encoding="utf-8")
  assert text_files.read_parallel(source, target) == [
    ("one", "eins"),
    ("", "zwei"),
    ("three", ""),
    ("", ""),
  ]
  empty = tmp_path / "empty.en"
  empty.write_bytes(b"")
  assert text_files.read_lines(empty) == []


def test_glob_matching_nothing(tmp_path):
  (tmp_path / "newstest2014.en").write_text("a\n", encoding="utf-8")
  with pytest.raises(DataError, match=r"'newstest19\*' matches no files.*newstest2014\.en"):
    text_files.corpus_files(["newstest19*"], "en", "de", root=tmp_path)


def test_glob_with_one_side_missing_is_reported_not_skipped(tmp_path):
  (tmp_path / "a.en").write_text("x\n", encoding="utf-8")
  (tmp_path / "a.de").write_text("y\n", encoding="utf-8")
  (tmp_path / "b.en").write_text("x\n", encoding="utf-8")
  with pytest.raises(DataError, match=re.escape(str(tmp_path / "b.de"))):
    text_files.read_corpus(["*"], "en", "de", root=tmp_path)


def test_lone_string_prefix_and_bad_language(tmp_path):
  assert text_files.corpus_files("c", "en", "de", root=tmp_path) == [
    (str(tmp_path / "c.en"), str(tmp_path / "c.de"))
  ]
  with pytest.raises(DataError, match="without the dot"):
    text_files.corpus_files(["c"], ".en", "de")
  with pytest.raises(DataError, match="No corpus prefixes"):
    text_files.corpus_files([], "en", "de")

"""FsmtTokenizer == transformers' FSMTTokenizer, ids and text, on real news sentences.

A small FSMT tokenizer is built (tests/hf_kinds.py's `hf_dirs`) as fairseq's WMT19 ones are:
Moses-tokenized English and German (2,000 lines each of newstest2014, not the ones compared)
give joint BPE merges (learned by `tokenizers`' BpeTrainer with fastBPE's `</w>`), and each
language its own vocabulary of the pieces seen at least twice (<s> <pad> </s> <unk> at ids
0..3), so some pieces and characters of the compared sentences are unknown. transformers'
FSMTTokenizer reads those files and `save_pretrained`s them; we read its directory and must give
the same ids and the same decoded text.

Select with `-m interop`; skipped without transformers (>= 5) or the shared news data
(under CI a skip fails: tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

transformers = pytest.importorskip(
  "transformers", minversion="5.18", reason="needs transformers>=5.18: pip install -e '.[interop]'"
)
import hf_kinds  # noqa: E402

from transformer_mt.data import fsmt_tokenizer  # noqa: E402
from transformer_mt.data.fsmt_tokenizer import FsmtTokenizer, read_fsmt_tokenizer  # noqa: E402

pytestmark = pytest.mark.interop

hf_dirs = hf_kinds.hf_dirs  # the fixture: the en->de and de->en tokenizer directories
_lines = hf_kinds.news2014_lines  # (lang, rows): lines of newstest2014
# The compared lines of newstest2014 (none of them trained the tokenizer: hf_kinds.TRAIN).
COMPARED = slice(0, 300)
# Text Moses and BPE treat specially: unicode punctuation FSMT replaces, control characters
# it drops, characters outside the vocabularies, escaped markup, dashes, an empty line.
EDGE_CASES = [
  "",
  "a",
  "Hello，world。  Really？ （yes）！ “quoted” «guillemets» 100％ … done",
  "tab\there, zero\u200bwidth, bell\x07 and non\u00a0breaking 1\u00a0000 spaces",
  "Emoji 😀 and 漢字 and Ωμέγα, <b>bold</b> & 'quotes' -- well-known state-of-the-art",
  "Straße, Größe, naïve café, ﬁ ligature, ＡＢＣ１２３",
]


def _hf(directory) -> transformers.FSMTTokenizer:
  return transformers.FSMTTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("src,tgt", [("en", "de"), ("de", "en")])
def test_encode_matches_transformers(hf_dirs, src, tgt):
  ours, config = read_fsmt_tokenizer(str(hf_dirs[src, tgt]))
  theirs = _hf(hf_dirs[src, tgt])
  texts = _lines(src, COMPARED) + EDGE_CASES
  expected = [theirs(text)["input_ids"] for text in texts]
  got = ours.encode(texts)
  assert [i for i, (a, b) in enumerate(zip(got, expected)) if a != b] == []
  assert config["langs"] == [src, tgt]
  assert (ours.vocab_size, ours.target_vocab_size) == (theirs.src_vocab_size, theirs.tgt_vocab_size)
  assert (ours.bos_id, ours.pad_id, ours.eos_id, ours.unk_id) == (0, 1, 2, 3)
  # The test means something: the vocabularies leave some pieces unknown.
  assert sum(row.count(ours.unk_id) for row in got) > 0


def test_decode_matches_transformers(hf_dirs):
  """Target-vocabulary ids (German, numbered by the de->en tokenizer's source side) decode
  to en->de FSMTTokenizer.decode(ids, skip_special_tokens=True)."""
  ours, _ = read_fsmt_tokenizer(str(hf_dirs["en", "de"]))
  theirs, target_side = _hf(hf_dirs["en", "de"]), _hf(hf_dirs["de", "en"])
  rows = [target_side(text)["input_ids"] for text in _lines("de", COMPARED) + EDGE_CASES]
  # Model output that is no sentence: pieces in any order (words cut mid-way), and special
  # ids (bos, pad, unk) among them.
  rng = np.random.default_rng(0)
  rows += [
    [int(i) for i in rng.integers(0, ours.target_vocab_size, size=12) if i != ours.eos_id] + [2]
    for _ in range(50)
  ]
  expected = [theirs.decode(ids, skip_special_tokens=True) for ids in rows]
  got = [ours.decode(ids) for ids in rows]
  assert [i for i, (a, b) in enumerate(zip(got, expected)) if a != b] == []
  # Decoding stops at the first EOS; what comes after is the next sentence, or padding.
  assert ours.decode(rows[0] + rows[1]) == expected[0]
  assert ours.pieces(rows[0][:2]) == theirs.convert_ids_to_tokens(rows[0][:2])


def test_lower_case_matches_transformers(hf_dirs, tmp_path):
  directory = tmp_path / "lower"
  shutil.copytree(hf_dirs["en", "de"], directory)
  config = json.loads((directory / "tokenizer_config.json").read_text())
  (directory / "tokenizer_config.json").write_text(json.dumps(dict(config, do_lower_case=True)))
  ours, _ = read_fsmt_tokenizer(str(directory))
  texts = _lines("en", slice(0, 50))
  assert ours.encode(texts) == [_hf(directory)(text)["input_ids"] for text in texts]
  assert ours.encode(["ABC"]) != read_fsmt_tokenizer(str(hf_dirs["en", "de"]))[0].encode(["ABC"])


def test_files_round_trip(hf_dirs):
  ours, _ = read_fsmt_tokenizer(str(hf_dirs["en", "de"]))
  again = FsmtTokenizer.from_files(ours.files())
  texts = _lines("en", slice(0, 100)) + EDGE_CASES
  encoded = ours.encode(texts)
  assert again.encode(texts) == encoded
  assert [again.decode(ids) for ids in encoded] == [ours.decode(ids) for ids in encoded]
  assert again.files() == ours.files()
  assert (again.source_lang, again.target_lang) == ("en", "de")


def test_missing_file_and_unsupported_settings(hf_dirs, tmp_path):
  directory = tmp_path / "broken"
  shutil.copytree(hf_dirs["en", "de"], directory)
  (directory / "merges.txt").unlink()
  with pytest.raises(FileNotFoundError, match=r"merges\.txt.*save_pretrained"):
    read_fsmt_tokenizer(str(directory))

  shutil.copy(hf_dirs["en", "de"] / "merges.txt", directory / "merges.txt")
  config_path = directory / fsmt_tokenizer.TOKENIZER_CONFIG
  config = json.loads(config_path.read_text())
  config_path.write_text(json.dumps(dict(config, clean_up_tokenization_spaces=True)))
  with pytest.raises(ValueError, match="clean_up_tokenization_spaces"):
    read_fsmt_tokenizer(str(directory))
  added = dict(config["added_tokens_decoder"], **{"9999": {"content": "<new>"}})
  config_path.write_text(json.dumps(dict(config, added_tokens_decoder=added)))
  with pytest.raises(ValueError, match="<new>"):
    read_fsmt_tokenizer(str(directory))
  config_path.write_text(json.dumps(dict(config, langs=["en"])))
  with pytest.raises(ValueError, match="langs"):
    read_fsmt_tokenizer(str(directory))

  # One id per special token: the model has one eos id for both sides.
  config_path.write_text(json.dumps(config))
  target_vocab = json.loads((directory / "vocab-tgt.json").read_text())
  target_vocab["</s>"] = len(target_vocab)
  (directory / "vocab-tgt.json").write_text(json.dumps(target_vocab))
  with pytest.raises(ValueError, match=r"eos token '</s>' must have one id"):
    read_fsmt_tokenizer(str(directory))

"""The language-tag capability and the one check of the language flags (data/tokenizer.py).

`has_language_tags` tells a multilingual import (LanguageTagTokenizer) from our SentencePiece
tokenizer and FSMT's (which names its languages but has no tags); `check_language_flags` and
`require_codes` give each caller's one error line. Fast: a real SentencePiece tokenizer trained
on helpers.PAIRS and a LanguageTagTokenizer over a tiny word-level `tokenizers`
pipeline (the one test_hf_languages builds needs transformers and a trained model).
"""

import types

import pytest
import tokenizers
from helpers import PAIRS

from transformer_mt.data import fsmt_tokenizer
from transformer_mt.data import tokenizer as tokenizers_module
from transformer_mt.data.multilingual_tokenizers import LanguageTagTokenizer
from transformer_mt.runtime import errors

CODES = ("de_DE", "en_XX", "fr_XX", "ro_RO")


@pytest.fixture(scope="module")
def sentencepiece():
  return tokenizers_module.train_tokenizer(PAIRS, vocab_size=45)


@pytest.fixture(scope="module")
def tagged() -> LanguageTagTokenizer:
  """An mBART-cc25-like tokenizer: words, then </s> and the source code."""
  vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4}
  vocab.update({code: 5 + i for i, code in enumerate(CODES)})
  pipeline = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  pipeline.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  settings = {
    "language_codes": list(CODES),
    "source_tag": "suffix",
    "clean_up_tokenization_spaces": False,
    "eos": "</s>",
    "pad": "<pad>",
    "unk": "<unk>",
  }
  return LanguageTagTokenizer("mbart", pipeline.to_str(), settings)


def test_only_language_tag_tokenizers_have_tags(sentencepiece, tagged):
  assert tokenizers_module.has_language_tags(tagged)
  assert tokenizers_module.has_language_tags(tagged.with_languages("en_XX", "de_DE"))
  assert tagged.with_languages("en_XX", None).encode(["hello world"]) == [[3, 4, 1, 6]]
  assert not tokenizers_module.has_language_tags(sentencepiece)
  assert not tokenizers_module.has_language_tags(types.SimpleNamespace())
  # Partly alike is not enough: `languages` alone, or FSMT's source_lang/target_lang.
  assert not tokenizers_module.has_language_tags(types.SimpleNamespace(languages=CODES))
  specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
  fsmt = fsmt_tokenizer.FsmtTokenizer(specials, specials, "", ("en", "de"))
  assert fsmt.source_lang and not tokenizers_module.has_language_tags(fsmt)


@pytest.mark.parametrize(
  "given, flags",
  [
    ({"--src_lang": "en", "--tgt_lang": None}, "--src_lang"),
    ({"--src_lang": "", "--tgt_lang": "de"}, "--tgt_lang"),
    ({"--src_lang": "en", "--tgt_lang": "de"}, "--src_lang and --tgt_lang"),
  ],
)
def test_flags_for_a_model_without_tags_are_one_line(sentencepiece, given, flags):
  with pytest.raises(errors.BadValue) as raised:
    tokenizers_module.check_language_flags(sentencepiece, given, "no tags here; drop the flag.")
  assert str(raised.value) == f"{flags}: no tags here; drop the flag."
  assert isinstance(raised.value, errors.UserError) and "\n" not in str(raised.value)


def test_flags_pass_where_they_may(sentencepiece, tagged):
  # No codes for a model without tags; any codes for a model with them (it checks them itself).
  tokenizers_module.check_language_flags(sentencepiece, {"--src_lang": None, "--tgt_lang": ""}, "")
  tokenizers_module.check_language_flags(tagged, {"--src_lang": "xx", "--tgt_lang": "yy"}, "")


def _message(missing: str, examples: str) -> str:
  return f"pass {missing} (codes such as {examples})."


@pytest.mark.parametrize(
  "source, target, missing",
  [
    (None, "de_DE", "--src_lang"),
    ("en_XX", "", "--tgt_lang"),
    ("", None, "--src_lang and --tgt_lang"),
  ],
)
def test_missing_codes_are_named(tagged, source, target, missing):
  codes = {"--src_lang": source, "--tgt_lang": target}
  with pytest.raises(errors.BadValue) as raised:
    tokenizers_module.require_codes(tagged, codes, _message)
  assert str(raised.value) == f"pass {missing} (codes such as de_DE, en_XX, fr_XX)."
  assert isinstance(raised.value, errors.UserError)
  tokenizers_module.require_codes(tagged, {"--src_lang": "en_XX", "--tgt_lang": "de_DE"}, _message)

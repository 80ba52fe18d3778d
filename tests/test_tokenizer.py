"""The joint SentencePiece vocabulary: fixed special ids, round trips, reuse from the workdir."""

import ml_collections
import pytest
from helpers import PAIRS

from transformer_mt.data import input_pipeline, tokenizer
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_special_ids_and_detokenized_round_trip(model_type):
  tok = tokenizer.train_tokenizer(PAIRS, vocab_size=45, model_type=model_type)
  assert (tok._sp.pad_id(), tok._sp.eos_id(), tok._sp.bos_id()) == (PAD_ID, EOS_ID, BOS_ID)
  ids = tok.encode(["Die Katze saß auf der Matte."])[0]
  assert ids[-1] == EOS_ID and PAD_ID not in ids[:-1]
  assert tok.decode(ids + [PAD_ID, PAD_ID]) == "Die Katze saß auf der Matte."
  assert tok.decode([BOS_ID] + ids) == "Die Katze saß auf der Matte."


def test_unknown_model_type_is_rejected():
  with pytest.raises(ValueError, match="model_type='word'"):
    tokenizer.train_tokenizer(PAIRS, vocab_size=45, model_type="word")


def test_workdir_tokenizer_is_reused(tmp_path, monkeypatch):
  config = ml_collections.ConfigDict(
    {"vocab_size": 45, "model_type": "unigram", "sample_size": 1000}
  )
  first = tokenizer.load_or_train(str(tmp_path), PAIRS, config)
  assert (tmp_path / tokenizer.MODEL_FILENAME).exists()
  monkeypatch.setattr(
    tokenizer,
    "train_tokenizer",
    lambda *a, **k: pytest.fail("retrained although the workdir had one"),
  )
  again = tokenizer.load_or_train(str(tmp_path), PAIRS, config)
  assert again.model_proto == first.model_proto


def test_empty_and_overlong_pairs_are_counted():
  tok = tokenizer.train_tokenizer(PAIRS, vocab_size=45)
  counts = input_pipeline.FilterCounts()
  keep = input_pipeline.KeepPair(max_len=30, counts=counts)
  tokenize = input_pipeline.TokenizePair(tok)
  verdicts = [
    keep(tokenize(pair))
    for pair in [PAIRS[0], ("", "Die Katze."), ("The cat.", "   "), ("The cat " * 20, "Katze")]
  ]
  assert verdicts == [True, False, False, False]
  assert (counts.seen, counts.empty, counts.too_long) == (4, 2, 1)

"""One SentencePiece vocabulary shared by source and target, trained once per workdir.

Ids are fixed across every experiment: pad = 0 (so masks are `ids != 0`), eos = 1,
bos = 2 (the decoder's first input), unk = 3. The serialized model travels inside
every checkpoint, so a checkpoint directory is enough to translate.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from transformer_mt.text_files import write_atomically

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
MODEL_FILENAME = "tokenizer.model"


class Tokenizer:
  """Text <-> ids. Encoded sentences end with EOS; decoding stops at the first EOS."""

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    if (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id()) != (PAD_ID, EOS_ID, BOS_ID):
      raise ValueError(
        "SentencePiece model has ids pad/eos/bos = "
        f"{self._sp.pad_id()}/{self._sp.eos_id()}/{self._sp.bos_id()}; "
        f"expected {PAD_ID}/{EOS_ID}/{BOS_ID}. Retrain it with transformer_mt."
      )

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    return [ids + [EOS_ID] for ids in self._sp.encode(list(texts), out_type=int)]

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID)]
    return self._sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self._sp.id_to_piece(int(i)) for i in ids]

  @classmethod
  def load(cls, path: str | os.PathLike) -> Tokenizer:
    with open(path, "rb") as f:
      return cls(f.read())

  def save(self, path: str | os.PathLike) -> None:
    """Writes atomically: a crash leaves either no file or a complete one."""
    write_atomically(path, self.model_proto)


def train_tokenizer(
  pairs: Sequence[tuple[str, str]],
  vocab_size: int,
  model_type: str = "unigram",
  sample_size: int = 1_000_000,
  seed: int = 0,
) -> Tokenizer:
  """Trains a joint vocabulary on up to `sample_size` sentences drawn from both sides."""
  if model_type not in ("unigram", "bpe"):
    raise ValueError(f"tokenizer.model_type={model_type!r} must be 'unigram' or 'bpe'")
  rng = np.random.default_rng(seed)
  num_pairs = min(len(pairs), max(1, sample_size // 2))
  chosen = rng.choice(len(pairs), size=num_pairs, replace=False)
  sentences = [side for i in sorted(chosen) for side in pairs[i] if side]
  model = io.BytesIO()
  logging.info(
    "Training a %s SentencePiece vocabulary of %d on %d sentences.",
    model_type,
    vocab_size,
    len(sentences),
  )
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=model,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=1.0,
      pad_id=PAD_ID,
      eos_id=EOS_ID,
      bos_id=BOS_ID,
      unk_id=UNK_ID,
      input_sentence_size=0,
      shuffle_input_sentence=False,
      num_threads=os.cpu_count() or 1,
      minloglevel=2,
    )
  except RuntimeError as e:
    raise ValueError(
      f"Could not train a SentencePiece vocabulary of size {vocab_size} on "
      f"{len(sentences)} sentences; change tokenizer.vocab_size as SentencePiece "
      f"says: {e}"
    ) from e
  return Tokenizer(model.getvalue())


def load_or_train(workdir: str, pairs: Sequence[tuple[str, str]], tokenizer_config) -> Tokenizer:
  """Reuses `workdir/tokenizer.model` when present (resumed runs), else trains and saves it."""
  path = os.path.join(workdir, MODEL_FILENAME)
  if os.path.exists(path):
    tokenizer = Tokenizer.load(path)
    logging.info("Loaded tokenizer %s (vocab %d).", path, tokenizer.vocab_size)
    return tokenizer
  tokenizer = train_tokenizer(
    pairs, tokenizer_config.vocab_size, tokenizer_config.model_type, tokenizer_config.sample_size
  )
  tokenizer.save(path)
  return tokenizer

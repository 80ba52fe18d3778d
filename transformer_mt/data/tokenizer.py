"""Text <-> ids: our trained SentencePiece vocabulary, or an imported model's own.

`Tokenizer`: one SentencePiece vocabulary shared by source and target, trained once per
workdir. Ids are fixed across every experiment: pad = 0 (so masks are `ids != 0`), eos = 1,
bos = 2 (the decoder's first input), unk = 3.

`VocabTokenizer`: a Hugging Face Marian (OPUS-MT) tokenizer, for imported checkpoints
(`run.py import`). Two SentencePiece models cut source and target text into pieces and one
vocabulary (vocab.json) numbers the pieces, with the model's own pad/eos/unk ids. The other
imported kinds have modules of their own (fsmt_tokenizer.py, hf_tokenizers.py); `to_files` /
`from_files` store and rebuild any of them.

All meet `AnyTokenizer` (`encode`, `encode_targets`, `decode`, `pieces`, `vocab_size`,
`pad_id`, `eos_id`), so translation, training and evaluation take any of them. Multilingual
imports (mBART, NLLB) also meet `LanguageTags`; `has_language_tags` tells them apart, and
`check_language_flags` / `require_codes` are the one place the language flags are checked.
The files travel inside every checkpoint, so a checkpoint directory is enough to translate.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeGuard, runtime_checkable

import numpy as np
import sentencepiece as spm

from transformer_mt.data import multilingual_tokenizers as hf_tokenizers
from transformer_mt.data import prepared_corpus, tokenizer_cache
from transformer_mt.data.fsmt_tokenizer import FsmtTokenizer
from transformer_mt.data.multilingual_tokenizers import LanguageTagTokenizer
from transformer_mt.data.text_files import write_atomically
from transformer_mt.runtime import errors

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
MODEL_FILENAME = "tokenizer.model"
# SentencePiece encodes a list on a thread pool it starts on every call: ~90 us of thread
# start-up and system time, against ~7 us to encode one short sentence as a string. The
# training pipeline encodes one sentence per call, so lists shorter than this go one by one.
_THREADED_ENCODE_MIN = 64


def _encode_with(processor: spm.SentencePieceProcessor, texts: Sequence[str], out_type) -> list:
  """`processor.encode(texts)`, without the thread pool where it costs more than it saves."""
  texts = list(texts)
  if len(texts) < _THREADED_ENCODE_MIN:
    return [processor.encode(text, out_type=out_type) for text in texts]
  return processor.encode(texts, out_type=out_type)


class Tokenizer:
  """Text <-> ids. Encoded sentences end with EOS; decoding stops at the first EOS."""

  pad_id, eos_id = PAD_ID, EOS_ID

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    if (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id()) != (PAD_ID, EOS_ID, BOS_ID):
      raise errors.BadValue(
        "SentencePiece model has ids pad/eos/bos = "
        f"{self._sp.pad_id()}/{self._sp.eos_id()}/{self._sp.bos_id()}; "
        f"expected {PAD_ID}/{EOS_ID}/{BOS_ID}. Retrain it with transformer_mt."
      )

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    return [ids + [EOS_ID] for ids in _encode_with(self._sp, texts, int)]

  # One vocabulary for both sides.
  encode_targets = encode

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


# The files of a VocabTokenizer, as Hugging Face's MarianTokenizer names them, plus the names of
# its special tokens.
SOURCE_SPM, TARGET_SPM, VOCAB_FILENAME = "source.spm", "target.spm", "vocab.json"
SPECIAL_TOKENS_FILENAME = "special_tokens.json"
VOCAB_TOKENIZER_FILES = (SOURCE_SPM, TARGET_SPM, VOCAB_FILENAME, SPECIAL_TOKENS_FILENAME)
DEFAULT_SPECIAL_TOKENS = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}
# SentencePiece's word-boundary mark, a space once decoded.
_WORD_BOUNDARY = "\u2581"


class VocabTokenizer:
  """Marian's tokenizer: SentencePiece pieces numbered by a vocabulary of the model's own.

  Encodes as MarianTokenizer does (source SentencePiece pieces, each looked up in the
  vocabulary, unknown ones as unk, then EOS) and decodes as its
  `decode(ids, skip_special_tokens=True)` does (pad, eos and unk dropped, the rest joined by
  the target SentencePiece model), stopping at the first EOS like `Tokenizer`.
  Not covered: `>>lang<<` target-language tags and separate source/target vocabularies.

  Args:
    source_proto, target_proto: the serialized SentencePiece models (source.spm, target.spm).
    vocab: piece -> id (vocab.json).
    special_tokens: the pieces of "eos", "unk" and "pad" (default Marian's).
  """

  def __init__(
    self,
    source_proto: bytes,
    target_proto: bytes,
    vocab: dict[str, int],
    special_tokens: dict[str, str] | None = None,
  ):
    self.source_proto, self.target_proto = source_proto, target_proto
    self.vocab = dict(vocab)
    self.special_tokens = dict(DEFAULT_SPECIAL_TOKENS, **(special_tokens or {}))
    missing = [p for p in self.special_tokens.values() if p not in self.vocab]
    if missing:
      raise errors.BadValue(f"The vocabulary lacks the special tokens {missing}.")
    self._source = spm.SentencePieceProcessor(model_proto=source_proto)
    self._target = spm.SentencePieceProcessor(model_proto=target_proto)
    self._pieces = {i: piece for piece, i in self.vocab.items()}
    self.pad_id = self.vocab[self.special_tokens["pad"]]
    self.eos_id = self.vocab[self.special_tokens["eos"]]
    self.unk_id = self.vocab[self.special_tokens["unk"]]

  @property
  def vocab_size(self) -> int:
    return max(self.vocab.values()) + 1

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    return self._encode(self._source, texts)

  def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
    """Target-language texts cut by the target SentencePiece model (MarianTokenizer's
    `text_target`): the references of fine-tuning."""
    return self._encode(self._target, texts)

  def _encode(self, processor: spm.SentencePieceProcessor, texts: Sequence[str]) -> list[list[int]]:
    pieces = _encode_with(processor, texts, str)
    return [[self.vocab.get(p, self.unk_id) for p in row] + [self.eos_id] for row in pieces]

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[: ids.index(self.eos_id)]
    skipped = (self.pad_id, self.eos_id, self.unk_id)
    pieces = [self._pieces[i] for i in ids if i not in skipped and i in self._pieces]
    # A piece the target model lacks comes back as it is, its boundary marks still in it.
    return self._target.decode_pieces(pieces).replace(_WORD_BOUNDARY, " ").strip()

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self._pieces.get(int(i), self.special_tokens["unk"]) for i in ids]

  def files(self) -> dict[str, bytes]:
    """File name -> contents: what `from_files` reads back (a checkpoint's tokenizer item)."""
    return {
      SOURCE_SPM: self.source_proto,
      TARGET_SPM: self.target_proto,
      VOCAB_FILENAME: json.dumps(self.vocab, ensure_ascii=False, indent=0).encode(),
      SPECIAL_TOKENS_FILENAME: json.dumps(self.special_tokens).encode(),
    }

  @classmethod
  def from_files(cls, files: dict[str, bytes]) -> VocabTokenizer:
    """The tokenizer of `files()`' output; the special-tokens file may be left out."""
    special = files.get(SPECIAL_TOKENS_FILENAME)
    return cls(
      files[SOURCE_SPM],
      files[TARGET_SPM],
      json.loads(files[VOCAB_FILENAME]),
      json.loads(special) if special is not None else None,
    )


# Imported tokenizers stored beside a marker naming their kind (Marian's predate the marker
# and are told apart by their files): kind -> class with `kind`, `FILES`, `files()` and
# `from_files(files)`. A new kind is one line here.
TOKENIZER_KINDS: dict[str, type] = {
  **{kind: LanguageTagTokenizer for kind in hf_tokenizers.KINDS},
  FsmtTokenizer.KIND: FsmtTokenizer,
}
# The marker: {"kind": ...}.
KIND_FILENAME = "tokenizer_kind.json"


class AnyTokenizer(Protocol):
  """What translation, evaluation, training and checkpoints take: any of the tokenizers above
  (ours, Marian's, FSMT's, mBART's / NLLB's). A protocol rather than a union of the classes,
  so a module that only encodes and decodes need not know which kinds exist."""

  pad_id: int
  eos_id: int

  @property
  def vocab_size(self) -> int: ...

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    """Source texts as ids, each ending with EOS."""
    ...

  def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
    """Target texts as the decoder is trained to produce them (training references)."""
    ...

  def decode(self, ids: Iterable[int]) -> str:
    """Text of target ids, stopping at the first EOS."""
    ...

  def pieces(self, ids: Iterable[int]) -> list[str]: ...


@runtime_checkable
class LanguageTags(Protocol):
  """The capability of a multilingual import (`LanguageTagTokenizer`): language codes that tag
  the source and choose the target, set per translation direction with `with_languages`.
  Checked at run time by `has_language_tags`, so callers ask for the capability instead of a
  class or an attribute name."""

  kind: str
  languages: tuple[str, ...]
  source_lang: str | None
  target_lang: str | None

  def with_languages(self, source_lang: str | None, target_lang: str | None) -> LanguageTags: ...

  def language_id(self, code: str, flag: str = "language") -> int: ...

  def target_ids(self) -> tuple[int | None, int | None]: ...


def has_language_tags(tokenizer: object) -> TypeGuard[LanguageTags]:
  """Whether `tokenizer` takes language codes (mBART, NLLB); other models take none."""
  return isinstance(tokenizer, LanguageTags)


def check_language_flags(
  tokenizer: object, given: Mapping[str, str | None], no_tags_tail: str
) -> None:
  """Refuses language codes for a model without language tags.

  Args:
    given: flag (e.g. "--src_lang") -> the code given for it, or None / "" if none was.
    no_tags_tail: what the error says after the flags: why, and what to do instead.

  Raises:
    ValueError: "{flags}: {no_tags_tail}", naming every flag given a code, when `tokenizer`
      has no language tags. A model with tags checks its codes itself (`language_id`).
  """
  if has_language_tags(tokenizer):
    return
  flags = [flag for flag, code in given.items() if code]
  if flags:
    raise errors.BadValue(f"{' and '.join(flags)}: {no_tags_tail}")


def require_codes(
  tokenizer: LanguageTags,
  codes: Mapping[str, str | None],
  missing_message: Callable[[str, str], str],
) -> None:
  """Refuses a multilingual model's direction without both its language codes.

  Args:
    codes: where each code comes from (a flag or a config key) -> the code, or None / "".
    missing_message: the error line, given the names of the missing codes ("--src_lang and
      --tgt_lang") and three of the model's codes as examples ("ar_AR, cs_CZ, de_DE").

  Raises:
    ValueError: with `missing_message`'s line when any code is missing.
  """
  missing = [name for name, code in codes.items() if not code]
  if missing:
    examples = ", ".join(tokenizer.languages[:3])
    raise errors.BadValue(missing_message(" and ".join(missing), examples))


def kind_named(marker: bytes, where: str = "the tokenizer") -> str:
  """The kind a marker file names, checked to be one this version reads."""
  kind = json.loads(marker).get("kind")
  if kind not in TOKENIZER_KINDS:
    raise errors.BadValue(
      f"{where} names the tokenizer kind {kind!r}, which this version cannot read (known: "
      f"{sorted(TOKENIZER_KINDS)})."
    )
  return kind


def to_files(tokenizer: AnyTokenizer) -> dict[str, bytes]:
  """File name -> contents of any tokenizer: what `from_files` reads back."""
  kind = getattr(tokenizer, "kind", None)
  if kind is not None:
    if kind not in TOKENIZER_KINDS:
      raise ValueError(f"No file format for tokenizer kind {kind!r}.")
    return {**tokenizer.files(), KIND_FILENAME: json.dumps({"kind": kind}).encode()}
  if isinstance(tokenizer, VocabTokenizer):
    return tokenizer.files()
  return {MODEL_FILENAME: tokenizer.model_proto}


def from_files(files: dict[str, bytes]) -> AnyTokenizer:
  """The tokenizer of `to_files`' output: by its kind marker, else Marian's files, else ours."""
  if KIND_FILENAME in files:
    return TOKENIZER_KINDS[kind_named(files[KIND_FILENAME])].from_files(files)
  if VOCAB_FILENAME in files:
    return VocabTokenizer.from_files(files)
  return Tokenizer(files[MODEL_FILENAME])


def required_files(names: Iterable[str], marker: bytes | None = None) -> tuple[str, ...]:
  """The files a tokenizer stored as `names` cannot be read without (`marker`: the contents
  of its kind marker, if any)."""
  if marker is not None:
    return (KIND_FILENAME, *TOKENIZER_KINDS[kind_named(marker)].FILES)
  if any(name in VOCAB_TOKENIZER_FILES for name in names):
    return VOCAB_TOKENIZER_FILES
  return (MODEL_FILENAME,)


def train_tokenizer(
  pairs: Sequence[tuple[str, str]],
  vocab_size: int,
  model_type: str = "unigram",
  sample_size: int = 1_000_000,
  seed: int = 0,
) -> Tokenizer:
  """Trains a joint vocabulary on up to `sample_size` sentences drawn from both sides."""
  if model_type not in ("unigram", "bpe"):
    raise errors.BadValue(f"tokenizer.model_type={model_type!r} must be 'unigram' or 'bpe'")
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
    raise errors.BadValue(
      f"Could not train a SentencePiece vocabulary of size {vocab_size} on "
      f"{len(sentences)} sentences; change tokenizer.vocab_size as SentencePiece "
      f"says: {e}"
    ) from e
  return Tokenizer(model.getvalue())


def load_or_train(workdir: str, pairs: Sequence[tuple[str, str]], tokenizer_config) -> Tokenizer:
  """`workdir/tokenizer.model` when present (resumed runs); else, for a prepared corpus, the
  model kept in its cache folder for these settings (tokenizer_cache.py), else a new one, trained
  (and kept there for the next fresh workdir). Either of the last two is saved to the workdir,
  which stays self-contained."""
  path = os.path.join(workdir, MODEL_FILENAME)
  if os.path.exists(path):
    tokenizer = Tokenizer.load(path)
    logging.info("Loaded tokenizer %s (vocab %d).", path, tokenizer.vocab_size)
    return tokenizer
  if isinstance(pairs, prepared_corpus.PreparedCorpus):
    tokenizer, _, _ = cached_tokenizer(pairs, tokenizer_config)
  else:
    tokenizer = _train(pairs, tokenizer_config)
  tokenizer.save(path)
  return tokenizer


# Bump when train_tokenizer's sampling or trainer call changes the model it makes: models kept
# in a prepared corpus's cache under the old number are then trained again.
TRAINER_VERSION = 1
# The seed of the sample of pairs the vocabulary is trained on.
SAMPLE_SEED = 0


def cache_settings(tokenizer_config) -> dict:
  """Everything that changes the model trained from a given corpus: the key of a cached one."""
  return {
    "trainer_version": TRAINER_VERSION,
    "sentencepiece": spm.__version__,
    "vocab_size": int(tokenizer_config.vocab_size),
    "model_type": str(tokenizer_config.model_type),
    "sample_size": int(tokenizer_config.sample_size),
    "seed": SAMPLE_SEED,
  }


def cached_tokenizer(
  corpus: prepared_corpus.PreparedCorpus, tokenizer_config
) -> tuple[Tokenizer, str | None, bool]:
  """The tokenizer of `corpus` and `tokenizer_config` from the corpus's cache folder, trained
  and kept there if not yet (`run.py prepare` calls it ahead of a job): (tokenizer, its path
  there or None if it could not be kept, whether it came from the cache)."""
  proto, path, found = tokenizer_cache.load_or_train(
    corpus, cache_settings(tokenizer_config), lambda: _train(corpus, tokenizer_config).model_proto
  )
  tokenizer = Tokenizer(proto)
  if found:
    logging.info(
      "Loaded tokenizer %s (vocab %d) from the prepared corpus cache.", path, tokenizer.vocab_size
    )
  elif path:
    logging.info("Stored the tokenizer in the prepared corpus cache: %s.", path)
  return tokenizer, path, found


def _train(pairs: Sequence[tuple[str, str]], tokenizer_config) -> Tokenizer:
  return train_tokenizer(
    pairs,
    tokenizer_config.vocab_size,
    tokenizer_config.model_type,
    tokenizer_config.sample_size,
    SAMPLE_SEED,
  )

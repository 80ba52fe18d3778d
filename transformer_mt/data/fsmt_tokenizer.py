"""Text <-> ids for imported FSMT (fairseq WMT19) models, as transformers' FSMTTokenizer does.

FSMT cuts text in two stages: Moses (punctuation normalisation, then tokenization into
words) and fastBPE-style BPE (each word split into characters, the last one marked with
`</w>`, then the merges of merges.txt applied in rank order). Source and target have their
own vocabularies (vocab-src.json, vocab-tgt.json; one merges.txt for both), as the model
has separate source and target embeddings: `encode` numbers pieces with the source
vocabulary, `decode` reads ids of the target vocabulary.

Both stages come from maintained libraries: sacremoses for Moses (its normaliser's
`pre_replace_unicode_punct` and `post_remove_control_chars` are the two extra Moses scripts
FSMTTokenizer runs around it) and the `tokenizers` package's BPE model for the merges.

Where this differs from FSMTTokenizer (none of it occurs in real text or learned merges):
* A special token written in the input text ("</s>") is Moses-escaped and cut into pieces;
  FSMTTokenizer turns it into the special id.
* `decode` stops at the first EOS and drops ids outside the target vocabulary;
  FSMTTokenizer decodes past EOS and writes an out-of-range id as "<unk>".
* The BPE models agree on merges files in which each merge joins pieces that earlier merges
  (or single characters) make, as every learned merges file does. FSMTTokenizer merges every
  occurrence of the best pair at once, `tokenizers` one at a time, taking a better pair
  the first merge made before the second occurrence: with "ab a" ranked above "a b" (a
  hand-written file), "abab" is "ab ab" for FSMTTokenizer and "aba b" here.
* Control characters are those of `regex`'s \\p{C} instead of Python's unicodedata
  category C: the same unless the two libraries follow different Unicode versions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import tokenizers

from transformer_mt.runtime import errors

if TYPE_CHECKING:
  import sacremoses

KIND = "fsmt"
# The files of a `save_pretrained` directory, as FSMTTokenizer names them.
SOURCE_VOCAB, TARGET_VOCAB, MERGES = "vocab-src.json", "vocab-tgt.json", "merges.txt"
HF_FILES = (SOURCE_VOCAB, TARGET_VOCAB, MERGES)
TOKENIZER_CONFIG = "tokenizer_config.json"
# Ours: languages, lower-casing and special tokens (what tokenizer_config.json says of them).
SETTINGS = "fsmt_settings.json"
# FSMTTokenizer's defaults; it appends its `sep_token` (</s>) as the end of a sentence.
DEFAULT_SPECIAL_TOKENS = {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>"}
# tokenizer_config.json's names for them.
_CONFIG_KEYS = {"bos": "bos_token", "pad": "pad_token", "eos": "sep_token", "unk": "unk_token"}
# fastBPE's end-of-word mark on the last piece of a word; a space once decoded.
END_OF_WORD = "</w>"
# The BPE model's own name for a character it cannot start from. It has a space, which no
# Moses word has, so it never names a piece of the vocabularies and is looked up as unk.
_BPE_UNK = " unk "


def parse_merges(text: str) -> list[tuple[str, str]]:
  """The merges of merges.txt in rank order, as FSMTTokenizer ranks them.

  It drops the text after the last newline, keeps the first two fields of a line (fastBPE
  may add a count) and, for a merge listed twice, the later rank.
  """
  ranks: dict[tuple[str, str], int] = {}
  for rank, line in enumerate(text.split("\n")[:-1]):
    fields = line.split()
    if len(fields) >= 2:
      ranks[(fields[0], fields[1])] = rank
  return sorted(ranks, key=ranks.__getitem__)


class FsmtTokenizer:
  """FSMT's tokenizer: Moses words cut by BPE; source and target vocabularies of their own.

  Encodes as FSMTTokenizer's `tok(texts)["input_ids"]` does (pieces numbered by the source
  vocabulary, unknown ones as unk, then EOS) and decodes as its
  `decode(ids, skip_special_tokens=True)` does (target pieces joined, `</w>` as a space, Moses
  detokenization), stopping at the first EOS like the other tokenizers.

  Args:
    source_vocab, target_vocab: piece -> id (vocab-src.json, vocab-tgt.json).
    merges: the text of merges.txt.
    langs: (source, target) language codes, for Moses.
    do_lower_case: lower-case the text before tokenizing it.
    special_tokens: the pieces of "bos", "pad", "eos" and "unk" (default FSMT's). Each must
      have the same id in both vocabularies, as the model has one id for each.
  """

  KIND = kind = KIND
  # A checkpoint's tokenizer item: the Hugging Face files and our settings.
  FILES = (*HF_FILES, SETTINGS)

  def __init__(
    self,
    source_vocab: dict[str, int],
    target_vocab: dict[str, int],
    merges: str,
    langs: Sequence[str],
    do_lower_case: bool = False,
    special_tokens: dict[str, str] | None = None,
  ):
    if len(langs) != 2 or not all(isinstance(lang, str) and lang for lang in langs):
      raise errors.BadValue(f"langs must be two language codes (source, target), got {langs!r}.")
    self.source_vocab, self.target_vocab = dict(source_vocab), dict(target_vocab)
    self.merges = merges
    self.source_lang, self.target_lang = langs
    self.do_lower_case = bool(do_lower_case)
    self.special_tokens = dict(DEFAULT_SPECIAL_TOKENS, **(special_tokens or {}))
    special_ids = {}
    for kind, piece in self.special_tokens.items():
      ids = {self.source_vocab.get(piece), self.target_vocab.get(piece)}
      if None in ids or len(ids) != 1:
        raise errors.BadValue(
          f"The {kind} token {piece!r} must have one id in both vocabularies; it has "
          f"{self.source_vocab.get(piece)} (source) and {self.target_vocab.get(piece)} (target)."
        )
      special_ids[kind] = ids.pop()
    self.bos_id, self.pad_id = special_ids["bos"], special_ids["pad"]
    self.eos_id, self.unk_id = special_ids["eos"], special_ids["unk"]
    self._special_ids = frozenset(special_ids.values())
    self._target_pieces = {i: piece for piece, i in self.target_vocab.items()}

    self._normalizer, self._moses = _moses_pipeline(self.source_lang)
    # The target side, for fine-tuning's references (FSMTTokenizer has no target pipeline).
    self._target_normalizer, self._target_moses = _moses_pipeline(self.target_lang)
    import sacremoses  # here, not at the top: see _moses_pipeline

    self._detokenizer = sacremoses.MosesDetokenizer(lang=self.target_lang)
    self._bpe = _bpe_tokenizer(parse_merges(merges), self.source_vocab)

  @property
  def vocab_size(self) -> int:
    """Ids of the source vocabulary: the model's `vocab_size` (FSMT's src_vocab_size)."""
    return max(self.source_vocab.values()) + 1

  source_vocab_size = vocab_size

  @property
  def target_vocab_size(self) -> int:
    """Ids of the target vocabulary: the model's `target_vocab_size` (tgt_vocab_size)."""
    return max(self.target_vocab.values()) + 1

  def words(self, text: str, target: bool = False) -> list[str]:
    """The Moses words of `text`, as FSMTTokenizer cuts them before BPE (with the target
    language's rules when `target`)."""
    if self.do_lower_case:
      text = text.lower()
    normalizer, moses = (
      (self._target_normalizer, self._target_moses) if target else (self._normalizer, self._moses)
    )
    text = normalizer.normalize(text)
    words = moses.tokenize(text, aggressive_dash_splits=True, return_str=False, escape=True)
    return [word for word in words if word]

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    """Source-vocabulary ids of each text, ending with EOS."""
    return self._encode(texts, target=False)

  def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
    """Target-vocabulary ids of each target-language text, ending with EOS: the references
    of fine-tuning, cut as the source side is (one merges file serves both)."""
    return self._encode(texts, target=True)

  def _encode(self, texts: Sequence[str], target: bool) -> list[list[int]]:
    encodings = self._bpe.encode_batch(
      [self.words(text, target) for text in texts], is_pretokenized=True, add_special_tokens=False
    )
    vocab, unk = (self.target_vocab if target else self.source_vocab), self.unk_id
    return [[vocab.get(p, unk) for p in e.tokens] + [self.eos_id] for e in encodings]

  def decode(self, ids: Iterable[int]) -> str:
    """The text of target-vocabulary ids, up to the first EOS, special ids skipped."""
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[: ids.index(self.eos_id)]
    pieces = [
      self._target_pieces[i] for i in ids if i not in self._special_ids and i in self._target_pieces
    ]
    # FSMTTokenizer.convert_tokens_to_string: pieces glued, each `</w>` ends a word.
    text = "".join(p.replace(" ", "").replace(END_OF_WORD, " ") for p in pieces)
    return self._detokenizer.detokenize(text.split())

  def pieces(self, ids: Iterable[int]) -> list[str]:
    """The target-vocabulary pieces of `ids` (what `decode` reads); unk for unknown ids."""
    return [self._target_pieces.get(int(i), self.special_tokens["unk"]) for i in ids]

  def files(self) -> dict[str, bytes]:
    """File name -> contents: what `from_files` reads back (a checkpoint's tokenizer item)."""
    settings = dict(
      langs=[self.source_lang, self.target_lang],
      do_lower_case=self.do_lower_case,
      special_tokens=self.special_tokens,
    )
    return {
      SOURCE_VOCAB: _json_bytes(self.source_vocab),
      TARGET_VOCAB: _json_bytes(self.target_vocab),
      MERGES: self.merges.encode("utf-8"),
      SETTINGS: _json_bytes(settings),
    }

  @classmethod
  def from_files(cls, files: dict[str, bytes]) -> FsmtTokenizer:
    """The tokenizer of `files()`' output."""
    settings = json.loads(files[SETTINGS])
    return cls(
      json.loads(files[SOURCE_VOCAB]),
      json.loads(files[TARGET_VOCAB]),
      files[MERGES].decode("utf-8"),
      settings["langs"],
      settings.get("do_lower_case", False),
      settings.get("special_tokens"),
    )


def _moses_pipeline(lang: str) -> tuple[sacremoses.MosesPunctNormalizer, sacremoses.MosesTokenizer]:
  """FSMTTokenizer.moses_pipeline: replace-unicode-punctuation, normalize-punctuation,
  remove-non-printing-char; then the tokenizer (called with the options it passes).

  sacremoses is imported only when an FSMT tokenizer is built: its import compiles Moses's
  regular expressions (~0.6 s), which commands that score no BLEU (translate, score, plot, ...)
  would otherwise pay at start-up (evaluation/moses_master.py, BLEU's tokenizer, does the same)."""
  import sacremoses

  normalizer = sacremoses.MosesPunctNormalizer(
    lang=lang, pre_replace_unicode_punct=True, post_remove_control_chars=True
  )
  return normalizer, sacremoses.MosesTokenizer(lang=lang)


def _bpe_tokenizer(merges: list[tuple[str, str]], vocab: dict[str, int]) -> tokenizers.Tokenizer:
  """A `tokenizers` BPE that cuts a word into the pieces FSMTTokenizer.bpe cuts it into.

  FSMT's merges may make pieces its source vocabulary lacks (merges.txt serves the target
  too); FSMTTokenizer keeps such a piece and looks it up as unk. `tokenizers` needs every
  piece a merge makes in its vocabulary, so the BPE model gets a vocabulary of its own
  (every piece of the source vocabulary and of the merges), and its pieces are numbered
  with the source vocabulary afterwards. A character in none of them it names `_BPE_UNK`,
  one per character, as FSMTTokenizer keeps each unknown character a piece of its own.
  """
  pieces = dict.fromkeys([_BPE_UNK, *vocab])
  for a, b in merges:
    pieces.update(dict.fromkeys((a, b, a + b)))
  model = tokenizers.models.BPE(
    vocab={piece: i for i, piece in enumerate(pieces)},
    merges=merges,
    unk_token=_BPE_UNK,
    end_of_word_suffix=END_OF_WORD,
    fuse_unk=False,
  )
  # No normalizer or pre-tokenizer: the words come from Moses, one BPE word each.
  return tokenizers.Tokenizer(model)


def _json_bytes(value) -> bytes:
  return json.dumps(value, ensure_ascii=False, indent=0).encode("utf-8")


def _token_text(value) -> str | None:
  """A special token from tokenizer_config.json: a string, or an AddedToken dict."""
  return value.get("content") if isinstance(value, dict) else value


def _read_json(path: str):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except ValueError as e:  # bad JSON or bad UTF-8
    raise errors.BadValue(f"{path} is not valid JSON ({e}); save the tokenizer again.") from e


def read_fsmt_tokenizer(directory: str) -> tuple[FsmtTokenizer, dict]:
  """(tokenizer, tokenizer_config.json) of an FSMT `save_pretrained` directory.

  Raises:
    FileNotFoundError: a tokenizer file is missing.
    ValueError: the tokenizer uses a setting this one does not reproduce.
  """
  missing = [
    n for n in (*HF_FILES, TOKENIZER_CONFIG) if not os.path.exists(os.path.join(directory, n))
  ]
  if missing:
    raise errors.MissingFile(
      f"{directory} lacks the FSMT tokenizer files {missing} (save the tokenizer into the "
      "same directory with tokenizer.save_pretrained)."
    )
  config = _read_json(os.path.join(directory, TOKENIZER_CONFIG))
  langs = config.get("langs")
  if not (isinstance(langs, list) and len(langs) == 2):
    raise errors.BadValue(
      f"{directory}/{TOKENIZER_CONFIG}: 'langs' must list the source and target language "
      f'(e.g. ["en", "de"]), got {langs!r}.'
    )
  if config.get("clean_up_tokenization_spaces"):
    raise errors.BadValue(
      f"{directory}/{TOKENIZER_CONFIG} sets clean_up_tokenization_spaces, which is not "
      "supported; set it to false (FSMTTokenizer's default: Moses already detokenizes)."
    )
  special_tokens = {
    kind: _token_text(config[key])
    for kind, key in _CONFIG_KEYS.items()
    if _token_text(config.get(key)) is not None
  }
  source_vocab = _read_json(os.path.join(directory, SOURCE_VOCAB))
  target_vocab = _read_json(os.path.join(directory, TARGET_VOCAB))
  with open(os.path.join(directory, MERGES), encoding="utf-8") as f:
    merges = f.read()
  try:
    tokenizer = FsmtTokenizer(
      source_vocab,
      target_vocab,
      merges,
      langs,
      bool(config.get("do_lower_case", False)),
      special_tokens,
    )
  except ValueError as e:
    raise errors.BadValue(f"{directory}: {e}") from e
  # transformers lists the special tokens as added tokens at their vocabulary ids. Others,
  # added with add_tokens, are matched in the text before Moses runs: not reproduced.
  source_pieces = {i: piece for piece, i in tokenizer.source_vocab.items()}
  added = {int(i): _token_text(t) for i, t in (config.get("added_tokens_decoder") or {}).items()}
  unsupported = sorted(
    piece
    for i, piece in added.items()
    if piece not in tokenizer.special_tokens.values() or source_pieces.get(i) != piece
  )
  if unsupported:
    raise errors.BadValue(
      f"{directory}/{TOKENIZER_CONFIG} adds the tokens {unsupported}; tokens added to FSMT's "
      "vocabularies are not supported. Import the tokenizer as the model was trained."
    )
  return tokenizer, config

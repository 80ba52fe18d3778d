"""Tokenizers of imported multilingual models (mBART-cc25, mBART-50, NLLB-200): text <-> ids
with fairseq language tags.

These models mark every sentence with a language code (`en_XX`, `eng_Latn`, ...) and pick
the target language with one too, so one checkpoint translates between many languages.
`LanguageTagTokenizer` cuts text into pieces with the `tokenizers` library (the Rust pipeline
transformers 5 itself runs, saved as tokenizer.json) and places the tags as transformers
does with `src_lang` set:

  mBART-cc25 (MBartTokenizer)                     pieces </s> src_code
  mBART-50 (MBart50Tokenizer), NLLB (NllbTokenizer)  src_code pieces </s>
  NLLB with legacy_behaviour=True                 pieces </s> src_code

On the target side mBART-cc25 starts decoding from the target code; mBART-50 and NLLB start
from </s> and force the target code as the first generated token (transformers'
`forced_bos_token_id`). `target_ids` says which.

The pipeline is taken at import time from the transformers tokenizer (`read_tokenizer`),
not from the tokenizer.json file as saved: transformers 5 rebuilds parts of it in each
class's constructor (mBART-cc25's has no normalizer, whatever the file says), and what it
runs is what must be matched. Translating needs only `tokenizers`.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Sequence

import tokenizers

from transformer_mt.data import text_files
from transformer_mt.runtime import errors

# Our kinds, by the transformers tokenizer class that writes them (`tokenizer_class` in
# tokenizer_config.json; "...Fast" names are older saves of the same tokenizer).
KIND_OF_CLASS = {
  "MBartTokenizer": "mbart",
  "MBart50Tokenizer": "mbart50",
  "NllbTokenizer": "nllb",
}
KINDS = tuple(KIND_OF_CLASS.values())
# The kinds each Hugging Face model_type can come with.
KINDS_OF_MODEL_TYPE = {"mbart": ("mbart", "mbart50"), "m2m_100": ("nllb",)}
# Files of a LanguageTagTokenizer in a checkpoint: the pipeline and our settings.
TOKENIZER_JSON = "tokenizer.json"
SETTINGS_FILENAME = "language_tags.json"
FILES = (TOKENIZER_JSON, SETTINGS_FILENAME)
# A language code among the special tokens: en_XX, zh_CN (mBART), eng_Latn, zho_Hans (NLLB).
_LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}_[A-Z][A-Za-z]{1,3}$")
# Where each kind puts the source code (see the module docstring).
_SOURCE_TAG = {"mbart": "suffix", "mbart50": "prefix", "nllb": "prefix"}


class LanguageTagTokenizer:
  """Text <-> ids of an imported mBART / NLLB model, language tags included.

  `encode` gives what transformers' tokenizer gives with `src_lang` set, `decode` what its
  `decode(ids, skip_special_tokens=True)` gives, stopping at the first EOS like our other
  tokenizers. The languages are set with `with_languages`; without a source language
  `encode` refuses.

  Args:
    kind: "mbart", "mbart50" or "nllb".
    tokenizer_json: the `tokenizers` pipeline, serialized.
    settings: "language_codes" (list), "source_tag" ("prefix" or "suffix"),
      "clean_up_tokenization_spaces" (bool), and the "eos", "pad", "unk" tokens.
  """

  FILES = FILES

  def __init__(
    self,
    kind: str,
    tokenizer_json: str,
    settings: dict,
    source_lang: str | None = None,
    target_lang: str | None = None,
  ):
    if kind not in KINDS:
      raise errors.BadValue(f"Unknown language-tag tokenizer kind {kind!r}; known: {list(KINDS)}.")
    self.kind, self.tokenizer_json, self.settings = kind, tokenizer_json, dict(settings)
    self._tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
    # Sentences are tagged here; transformers turns padding and truncation off per call too.
    self._tokenizer.post_processor = None
    self._tokenizer.no_padding()
    self._tokenizer.no_truncation()
    self.languages = tuple(settings["language_codes"])
    ids = {name: self._tokenizer.token_to_id(settings[name]) for name in ("eos", "pad", "unk")}
    missing = [settings[name] for name, i in ids.items() if i is None]
    missing += [code for code in self.languages if self._tokenizer.token_to_id(code) is None]
    if missing:
      raise errors.BadValue(f"The {kind} tokenizer lacks the tokens {missing}.")
    self.eos_id, self.pad_id, self.unk_id = ids["eos"], ids["pad"], ids["unk"]
    self.source_lang, self.target_lang = source_lang, target_lang
    for flag, code in (("--src_lang", source_lang), ("--tgt_lang", target_lang)):
      if code is not None:
        self.language_id(code, flag)

  @property
  def vocab_size(self) -> int:
    return self._tokenizer.get_vocab_size(with_added_tokens=True)

  def language_id(self, code: str, flag: str = "language") -> int:
    """The id of language `code`; a ValueError naming the closest codes if it has none."""
    if code in self.languages:
      return self._tokenizer.token_to_id(code)
    close = difflib.get_close_matches(code, self.languages, n=5, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else f"e.g. {', '.join(self.languages[:5])}"
    raise errors.BadValue(
      f"{flag} {code!r} is not a language code of this {self.kind} model ({hint}; "
      f"{len(self.languages)} codes in all)."
    )

  def with_languages(self, source_lang: str | None, target_lang: str | None):
    """The same tokenizer translating `source_lang` -> `target_lang` (codes checked)."""
    return LanguageTagTokenizer(
      self.kind, self.tokenizer_json, self.settings, source_lang, target_lang
    )

  def target_ids(self) -> tuple[int | None, int | None]:
    """(decoder start id or None to keep the model's, forced first token or None) of the
    target language: mBART-cc25 starts from the code, the others force it after </s>."""
    if self.target_lang is None:
      raise errors.BadValue(f"No target language set for this {self.kind} model: pass --tgt_lang.")
    target = self.language_id(self.target_lang, "--tgt_lang")
    return (target, None) if self.kind == "mbart" else (None, target)

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    if self.source_lang is None:
      raise errors.BadValue(f"No source language set for this {self.kind} model: pass --src_lang.")
    code = self.language_id(self.source_lang, "--src_lang")
    encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
    if self.settings["source_tag"] == "suffix":
      return [e.ids + [self.eos_id, code] for e in encoded]
    return [[code] + e.ids + [self.eos_id] for e in encoded]

  def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of target-language texts as the decoder is trained to produce them, ending with
    EOS: after the decoder start, mBART-cc25 begins with the first piece (its start is the
    target code); mBART-50 and NLLB begin with the target code (the token they force)."""
    decoder_start_id, forced_first_id = self.target_ids()
    encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
    prefix = [] if forced_first_id is None else [forced_first_id]
    return [prefix + e.ids + [self.eos_id] for e in encoded]

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[: ids.index(self.eos_id)]
    text = self._tokenizer.decode(ids, skip_special_tokens=True)
    return clean_up_tokenization(text) if self.settings["clean_up_tokenization_spaces"] else text

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self._tokenizer.id_to_token(int(i)) or self.settings["unk"] for i in ids]

  def files(self) -> dict[str, bytes]:
    """File name -> contents: what `from_files` reads back (a checkpoint's tokenizer item)."""
    settings = dict(self.settings, kind=self.kind)
    return {
      TOKENIZER_JSON: self.tokenizer_json.encode(),
      SETTINGS_FILENAME: json.dumps(settings, ensure_ascii=False, indent=0).encode(),
    }

  @classmethod
  def from_files(cls, files: dict[str, bytes]) -> LanguageTagTokenizer:
    settings = json.loads(files[SETTINGS_FILENAME])
    return cls(settings.pop("kind"), files[TOKENIZER_JSON].decode(), settings)


def clean_up_tokenization(text: str) -> str:
  """transformers' `clean_up_tokenization` (spaces before punctuation and English clitics),
  applied by its `decode` when the tokenizer config sets clean_up_tokenization_spaces."""
  for before, after in (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
  ):
    text = text.replace(before, after)
  return text


def _read_json(path: str) -> dict:
  return text_files.read_json(path)


def tokenizer_kind(directory: str, model_type: str) -> tuple[str, str]:
  """(kind, transformers class name) of the tokenizer saved in `directory`.

  Raises:
    ValueError: M2M100's own tokenizer, or any tokenizer that is not mBART's or NLLB's.
    FileNotFoundError: no tokenizer files.
  """
  config_path = os.path.join(directory, "tokenizer_config.json")
  tokenizer_class = None
  if os.path.exists(config_path):
    tokenizer_class = _read_json(config_path).get("tokenizer_class")
  elif os.path.exists(os.path.join(directory, "vocab.json")):  # M2M100Tokenizer's files
    tokenizer_class = "M2M100Tokenizer"
  if tokenizer_class is None:
    raise errors.MissingFile(
      f"{directory} lacks tokenizer_config.json (with its tokenizer_class): save the tokenizer "
      "into the same directory with tokenizer.save_pretrained."
    )
  name = tokenizer_class.removesuffix("Fast")
  if name == "M2M100Tokenizer":
    raise errors.BadValue(
      f"{directory} holds an M2M100Tokenizer: of the m2m_100 models only NLLB-200 (with its "
      "NllbTokenizer) can be imported."
    )
  kind = KIND_OF_CLASS.get(name)
  allowed = KINDS_OF_MODEL_TYPE.get(model_type, ())
  if kind not in allowed:
    expected = [c for c, k in KIND_OF_CLASS.items() if k in allowed]
    raise errors.BadValue(
      f"{directory}: a {model_type} model with the tokenizer {tokenizer_class!r} cannot be "
      f"imported; supported: {expected}."
    )
  return kind, name


def read_tokenizer(directory: str, model_type: str) -> LanguageTagTokenizer:
  """The LanguageTagTokenizer of a `save_pretrained` directory, read once with transformers
  (the interop extra) so that its pipeline is the one transformers runs."""
  kind, class_name = tokenizer_kind(directory, model_type)
  if not os.path.exists(os.path.join(directory, TOKENIZER_JSON)):
    raise errors.MissingFile(
      f"{directory} lacks {TOKENIZER_JSON}: save the tokenizer with transformers >= 5 "
      "(tokenizer.save_pretrained writes it)."
    )
  try:
    import transformers
  except ImportError as e:
    raise errors.BadValue(
      f"Importing a {model_type} model reads its tokenizer with transformers: "
      "pip install -e '.[interop]'."
    ) from e
  hf_tokenizer = getattr(transformers, class_name).from_pretrained(directory)
  backend = hf_tokenizer.backend_tokenizer
  special = sorted(
    {t for t in hf_tokenizer.all_special_tokens if _LANGUAGE_CODE.match(t)},
    key=backend.token_to_id,
  )
  if not special:
    raise errors.BadValue(f"{directory}: the {class_name} has no language codes.")
  source_tag = _SOURCE_TAG[kind]
  if kind == "nllb" and getattr(hf_tokenizer, "legacy_behaviour", False):
    source_tag = "suffix"
  settings = {
    "language_codes": special,
    "source_tag": source_tag,
    # transformers skips the clean-up for BPE models (NLLB's) whatever the config says.
    "clean_up_tokenization_spaces": bool(hf_tokenizer.clean_up_tokenization_spaces)
    and (
      type(backend.model).__name__ != "BPE"
      or bool(
        getattr(
          hf_tokenizer,
          "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
          False,
        )
      )
    ),
    "eos": str(hf_tokenizer.eos_token),
    "pad": str(hf_tokenizer.pad_token),
    "unk": str(hf_tokenizer.unk_token),
  }
  return LanguageTagTokenizer(kind, backend.to_str(), settings)

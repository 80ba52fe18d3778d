"""The tiny Hugging Face tokenizers, models and fine-tuning run that several interop test files
build on, moved here from the test files that first built them (so that test files import this
module, not one another):

- the FSMT tokenizer directories (`hf_dirs`, built from newstest2014 as fairseq's WMT19 ones
  are; test_fsmt_tokenizer.py says how) and fairseq's special ids;
- the SentencePiece models and the tiny mBART-cc25 / mBART-50 / NLLB models imported with
  their language codes (`sentencepiece_models`, `KINDS`, `build_and_import`; test_hf_languages.py
  says how);
- the local training files and the overrides of a short fine-tuning run of an import
  (`data_root`, `finetune_overrides`; test_finetune_import.py).

A test file imports this module after skipping itself without the interop extra
(`hf_fakes.require_interop()`) or without transformers; the fixtures are bound in the test
module (`hf_dirs = hf_kinds.hf_dirs`), as hf_fakes' are.
"""

from __future__ import annotations

import collections
import io
import json
import pathlib
import shutil

import hf_fakes
import numpy as np
import pytest
import sacremoses
import sentencepiece as spm
import shared_data
import tokenizers

from transformer_mt import cli
from transformer_mt.commands.paths import absolute_override

transformers = pytest.importorskip(
  "transformers", minversion="5.18", reason="needs transformers>=5.18: pip install -e '.[interop]'"
)

# --- FSMT: tokenizer directories built from news text (test_fsmt_tokenizer.py) ---

NEWS = "news/en-de/newstest2014"  # under ../shared/data (tests/shared_data.py)
SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
# The lines the BPE merges and vocabularies are learned from; the compared ones are others.
TRAIN = slice(500, 2500)


def news2014_lines(lang: str, rows: slice) -> list[str]:
  """Lines `rows` of NEWS in `lang` ("en" or "de")."""
  path = shared_data.require(f"{NEWS}.{lang}") / f"{NEWS}.{lang}"
  return path.read_text(encoding="utf-8").splitlines()[rows]


def _moses_words(lines: list[str], lang: str) -> list[list[str]]:
  moses = sacremoses.MosesTokenizer(lang=lang)
  return [moses.tokenize(line, aggressive_dash_splits=True, escape=True) for line in lines]


def _vocab(bpe: tokenizers.Tokenizer, words: list[list[str]]) -> dict[str, int]:
  """A fairseq dictionary: specials, then the pieces seen at least twice, most frequent first."""
  counts = collections.Counter(
    piece for e in bpe.encode_batch(words, is_pretokenized=True) for piece in e.tokens
  )
  vocab = dict(SPECIALS)
  for piece, count in counts.most_common():
    if count >= 2:
      vocab.setdefault(piece, len(vocab))
  return vocab


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """save_pretrained directories of an en->de FSMTTokenizer and its de->en mirror."""
  en, de = (
    _moses_words(news2014_lines("en", TRAIN), "en"),
    _moses_words(news2014_lines("de", TRAIN), "de"),
  )
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE(end_of_word_suffix="</w>"))
  trainer = tokenizers.trainers.BpeTrainer(
    vocab_size=1500, end_of_word_suffix="</w>", show_progress=False
  )
  bpe.train_from_iterator([" ".join(w) for w in en + de], trainer)
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  merges = json.loads(bpe.to_str())["model"]["merges"]
  raw = tmp_path_factory.mktemp("fsmt_files")
  (raw / "merges.txt").write_text("".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
  for lang, words in (("en", en), ("de", de)):
    (raw / f"{lang}.json").write_text(json.dumps(_vocab(bpe, words)), encoding="utf-8")

  dirs = {}
  for src, tgt in (("en", "de"), ("de", "en")):
    hf = transformers.FSMTTokenizer(
      langs=[src, tgt],
      src_vocab_file=str(raw / f"{src}.json"),
      tgt_vocab_file=str(raw / f"{tgt}.json"),
      merges_file=str(raw / "merges.txt"),
    )
    dirs[src, tgt] = tmp_path_factory.mktemp(f"fsmt_{src}_{tgt}")
    hf.save_pretrained(dirs[src, tgt])
  return dirs


# --- mBART-cc25, mBART-50, NLLB: tiny models imported with their codes (test_hf_languages.py) ---

# Target tokens both decoders generate at most (the forced language code included).
MAX_NEW_TOKENS = 16
# The SentencePiece models' vocabulary size.
PIECES = 300
# The lengths (EOS excluded) of the targets each model learns for the translated sentences
# (`translated_lines`), after the target code: some reach MAX_NEW_TOKENS, so are cut there.
TARGET_LENGTHS = (5, 11, 17, 7, 13, 4, 9, 15)

# kind -> (transformers class, SentencePiece model type, model_type, source, target code,
# extra from_pretrained arguments). NLLB gets three of its codes (the class would add none to
# a bare SentencePiece model); the mBART classes always add their 25 / 52. clean-up is on
# where transformers applies it (unigram mBART-50) and where it ignores it (BPE NLLB).
KINDS = {
  "mbart": ("MBartTokenizer", "unigram", "mbart", "en_XX", "de_DE", {}),
  "mbart50": (
    "MBart50Tokenizer",
    "unigram",
    "mbart",
    "en_XX",
    "de_DE",
    {"clean_up_tokenization_spaces": True},
  ),
  "nllb": (
    "NllbTokenizer",
    "bpe",
    "m2m_100",
    "eng_Latn",
    "deu_Latn",
    {
      "additional_special_tokens": ["eng_Latn", "deu_Latn", "fra_Latn"],
      "clean_up_tokenization_spaces": True,
    },
  ),
}


@pytest.fixture(scope="module")
def sentencepiece_models(tmp_path_factory) -> dict[str, pathlib.Path]:
  """model type -> a SentencePiece model trained on English and German news lines."""
  lines = hf_fakes.news_lines("en", 0, 1500) + hf_fakes.news_lines("de", 0, 1500)
  directory = tmp_path_factory.mktemp("spm")
  paths = {}
  for model_type in ("unigram", "bpe"):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines),
      model_writer=model,
      vocab_size=PIECES,
      model_type=model_type,
      character_coverage=1.0,
      minloglevel=2,
    )
    paths[model_type] = directory / f"{model_type}.model"
    paths[model_type].write_bytes(model.getvalue())
  return paths


def translated_lines() -> list[str]:
  """The sentences test_imported_workdir_translates_like_generate translates."""
  return [line for line in hf_fakes.news_lines("en", 2400, 2500) if len(line) < 60][:8]


def _hf_model(kind: str, model_type: str, tokenizer, decoder_start: int | None):
  """A tiny model whose vocabulary is the tokenizer's (source code set), trained to translate
  `translated_lines` into random targets, read after the decoder start and target code as
  test_hf_languages' `_generate` gives them."""
  common = dict(
    hf_fakes.SIZES,
    max_position_embeddings=256,
    vocab_size=len(tokenizer),
    pad_token_id=tokenizer.pad_token_id,
    eos_token_id=tokenizer.eos_token_id,
    bos_token_id=0,
    decoder_start_token_id=decoder_start,
  )
  if model_type == "mbart":
    config = transformers.MBartConfig(activation_function="gelu", **common)
  else:
    config = transformers.M2M100Config(**common)
  import torch

  torch.manual_seed(0)
  model = transformers.AutoModelForSeq2SeqLM.from_config(config)
  target_id = tokenizer.convert_tokens_to_ids(KINDS[kind][4])
  # mBART-cc25 starts from the target code; mBART-50 and NLLB from EOS, the code forced next.
  prefix = [target_id] if kind == "mbart" else [tokenizer.eos_token_id, target_id]
  # Pieces only (fairseq's ids 4 to PIECES - 1): not its specials 0-3, nor the language codes
  # that follow the pieces.
  targets = hf_fakes.random_targets(np.random.default_rng(0), range(4, PIECES), TARGET_LENGTHS)
  sources = tokenizer(translated_lines()).input_ids
  return hf_fakes.train_to_translate(model, sources, targets, prefix)


def build_and_import(kind: str, sentencepiece_models, tmp_path_factory) -> tuple:
  """(save_pretrained directory, imported workdir) of a tiny model of `kind`, imported with
  its source and target codes (test_hf_import_kinds.py fine-tunes these)."""
  class_name, spm_type, model_type, source, target, extra = KINDS[kind]
  files = tmp_path_factory.mktemp(f"{kind}_files")
  shutil.copy(sentencepiece_models[spm_type], files / "sentencepiece.bpe.model")
  tokenizer = getattr(transformers, class_name).from_pretrained(files, **extra, src_lang=source)
  # mBART-cc25's config names no decoder start (it is the target code); the others start at EOS.
  model = _hf_model(
    kind, model_type, tokenizer, None if kind == "mbart" else tokenizer.eos_token_id
  )
  directory = tmp_path_factory.mktemp(f"{kind}-tiny")
  model.save_pretrained(directory)
  tokenizer.save_pretrained(directory)
  workdir = tmp_path_factory.mktemp(f"{kind}-imported") / "workdir"
  argv = ["import", "--from", f"hf:{directory}", "--workdir", str(workdir)]
  argv += ["--src_lang", source, "--tgt_lang", target, f"decode.max_len={MAX_NEW_TOKENS}"]
  assert cli.main(argv) == 0
  return directory, workdir


def hf_tokenizer(kind: str, directory, **languages):
  """transformers' tokenizer of `kind` saved in `directory`."""
  return getattr(transformers, KINDS[kind][0]).from_pretrained(directory, **languages)


# --- Fine-tuning an import on local news pairs (test_finetune_import.py) ---


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
  """train.{en,de}: ~200 short pairs of newstest2013 (short: the tiny vocabulary cuts words
  into many pieces, and longer pairs would exceed data.max_len)."""
  root = tmp_path_factory.mktemp("local_data")
  pairs = [
    (en, de)
    for en, de in zip(hf_fakes.news_lines("en", 0, 1000), hf_fakes.news_lines("de", 0, 1000))
    if 0 < len(en) < 70 and 0 < len(de) < 70
  ]
  assert len(pairs) >= 150
  for side, lang in enumerate(("en", "de")):
    text = "".join(pair[side] + "\n" for pair in pairs)
    (root / f"train.{lang}").write_text(text, encoding="utf-8")
  return root


def finetune_overrides(imported, data_root, num_steps: int) -> list[str]:
  """A short fine-tuning of the import in `imported` on `data_root`'s pairs: greedy, no
  validation, a checkpoint every 10 steps."""
  return [
    f"init.from={imported}",
    "data.source='local'",
    f"data.root={data_root}",
    "data.train_prefixes=['train']",
    "data.validation_prefixes=[]",
    "data.test_prefixes=[]",
    "data.max_len=64",
    "model.dropout_rate=0.1",  # the experiment's dropout applies: resuming must replay it
    f"train.num_steps={num_steps}",
    "train.batch_tokens=512",
    "train.warmup_steps=1",
    "train.lr_scale=0.1",
    "train.log_every=1",
    "train.eval_every=0",
    "train.bleu_every=0",
    "train.checkpoint_every=10",
    "decode.beam_size=1",
    "decode.max_len=16",
  ]


def cli_overrides(overrides: list[str]) -> list[str]:
  """The overrides as the CLI passes them on (paths made absolute)."""
  return [absolute_override(o) for o in overrides]

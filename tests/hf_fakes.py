"""Tiny Hugging Face translation models for the interop tests, shared by the test files.

A random model's greedy output is one token repeated whatever the source: a decoder that
ignored the source, or broke its cache after the first step, would still match `generate`
on it. `train_to_translate` trains a tiny model with torch (~2 s) to translate the very
sources a test decodes into random targets of their own (`random_targets`: distinct tokens,
different lengths; `repeating_targets`: one token recurring, followed by a different one each
time), so what it writes depends on the source and on earlier steps; `assert_varied` checks
that of the outputs before any comparison with `generate`. (Teaching such a model a general
task, copying, takes minutes to learn reliably; memorizing ~10 sentences takes ~100 steps.)

Two module-scoped fixtures live here too: `trained`, one tiny trained model of each type for
the greedy and beam tests (test_hf_models, test_hf_beam), and `marian_dir`, a tiny trained
MarianMTModel and a real MarianTokenizer saved with `save_pretrained` for the Marian tests.
torch, transformers and sentencepiece (the interop extra) are imported where used, so that a
test file can import this module first and skip itself with `require_interop()` when they
are missing.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import numpy as np
import pytest
import shared_data

from transformer_mt.interop import hf_convert

# 2+2 layers, d_model 16, 4 heads: the size of every tiny model of the interop tests.
SIZES = dict(
  d_model=16,
  encoder_layers=2,
  decoder_layers=2,
  encoder_attention_heads=4,
  decoder_attention_heads=4,
  encoder_ffn_dim=32,
  decoder_ffn_dim=32,
  max_position_embeddings=64,
  dropout=0.0,
)


def untrained_sizes(layers: int) -> dict:
  """SIZES with 2 heads, 32 positions, `layers` encoder and decoder layers, and the model's own
  dropout: the random models that are compared untrained (test_hf_weights, test_sampling)."""
  sizes = dict(
    SIZES,
    encoder_layers=layers,
    decoder_layers=layers,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    max_position_embeddings=32,
  )
  del sizes["dropout"]
  return sizes


# The news text the interop tests train their tokenizers on and translate.
NEWS = "news/en-de/newstest2013"  # under ../shared/data (tests/shared_data.py)

# Full-batch Adam steps and learning rate of `train_to_translate`: measured to reproduce
# every target of ten sentences greedily, for each model type (loss <= 0.07).
TRAIN_STEPS = 100
LEARNING_RATE = 1e-2
# What each compared output row must hold: distinct tokens other than the special ones.
MIN_DISTINCT = 3
# The period of the recurring token of `repeating_targets`. Every other position made the
# trained mBART model's beam search prefer that token repeated (a near-constant row).
REPEAT_EVERY = 3


def news_lines(lang: str, start: int, stop: int) -> list[str]:
  """Lines [start, stop) of NEWS in `lang` ("en" or "de")."""
  path = shared_data.require(f"{NEWS}.{lang}") / f"{NEWS}.{lang}"
  return path.read_text(encoding="utf-8").splitlines()[start:stop]


def require_interop():
  """(torch, transformers): skips the calling test module (at collection) or test without
  them, or with transformers older than 5.18."""
  torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[interop]'")
  reason = "needs transformers>=5.18: pip install -e '.[interop]'"
  transformers = pytest.importorskip("transformers", minversion="5.18", reason=reason)
  return torch, transformers


def generate(model, inputs, max_new_tokens: int, suppress_tokens, num_beams: int = 1, **switches):
  """transformers' `generate` (no gradients) of `inputs` (a tokenizer's output), with the
  generation switches we do not have turned off: no sampling, no minimum length, no EOS
  forced at the last step; `suppress_tokens`: the ids our decoding never emits. `switches`:
  the rest (language tokens, early stopping, length penalty)."""
  import torch

  with torch.no_grad():
    return model.generate(
      **inputs,
      **switches,
      num_beams=num_beams,
      do_sample=False,
      max_new_tokens=max_new_tokens,
      min_length=0,
      suppress_tokens=suppress_tokens,
      forced_eos_token_id=None,
    )


def hf_config(model_type: str):
  """Tiny configs with the published models' switches (opus-mt, wmt19, mbart-large, m2m100)."""
  import transformers

  if model_type == "marian":  # opus-mt: swish, scaled embeddings, pad = decoder start, eos 0
    return transformers.MarianConfig(
      vocab_size=99,
      decoder_vocab_size=99,
      pad_token_id=98,
      eos_token_id=0,
      decoder_start_token_id=98,
      activation_function="swish",
      scale_embedding=True,
      **SIZES,
    )
  if model_type == "fsmt":  # wmt19: separate source and target vocabularies
    return transformers.FSMTConfig(
      langs=["en", "ru"], src_vocab_size=99, tgt_vocab_size=87, activation_function="relu", **SIZES
    )
  if model_type == "mbart":
    return transformers.MBartConfig(
      vocab_size=99, decoder_start_token_id=2, activation_function="gelu", **SIZES
    )
  return transformers.M2M100Config(vocab_size=99, decoder_start_token_id=2, **SIZES)


def random_targets(rng, ids: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
  """One target per length: distinct tokens drawn from `ids`, no EOS."""
  return [[int(t) for t in rng.choice(np.asarray(ids), n, replace=False)] for n in lengths]


def repeating_targets(rng, ids: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
  """One target per length, no EOS: a token of the row's own at every REPEAT_EVERY-th position
  and distinct tokens between (a b c a d e a ...), so the same token is followed by different
  ones within a row: a decoder must tell its occurrences apart by what came before (its cache)
  or by position. Measured: on `random_targets`, a trained FSMT model whose decoder cache was
  zeroed from position 2 on still wrote every target greedily; on these it does not."""
  rows = []
  for n in lengths:
    repeated, *others = (int(t) for t in rng.choice(np.asarray(ids), n, replace=False))
    others = iter(others)
    rows.append([repeated if i % REPEAT_EVERY == 0 else next(others) for i in range(n)])
  return rows


def greedy_misleading_targets(rng, ids: Sequence[int], lengths: Sequence[int]) -> list:
  """For each length, several targets for one source, so that the locally best first token
  leads to a worse sequence: three targets start with token a and then part ways (a x1 ...,
  a x2 ..., a x3 ...), two are one target starting with token b (b y ... twice). Trained on
  them, a model gives a ~3/5 and b ~2/5 first; after a each x ~1/3, after b y ~1: greedy writes
  a x.. (probability ~0.2), beam search b y .. (~0.4). Returns, per length, the list of its
  targets (the same length; repeated ones listed twice)."""
  rows = []
  for n in lengths:
    a, b, *rest = (int(t) for t in rng.choice(np.asarray(ids), n + 6, replace=False))
    x1, x2, x3, *tail = rest
    path_b = [b, *tail[: n - 1]]
    rows.append([[a, x, *tail[1 : n - 1]] for x in (x1, x2, x3)] + [path_b, path_b])
  return rows


def train_to_translate(
  model, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], prefix=None
):
  """Trains `model` in place, full batch, to translate each source (ids, EOS and language
  codes included, no padding) into its target (then EOS). Returns it in eval mode.

  Args:
    prefix: what the decoder reads before the first target token: its decoder start token
      (the default), then any forced token (mBART-50's and NLLB's target language code).
  """
  import torch

  config = model.config
  pad_id, eos_id = config.pad_token_id, config.eos_token_id
  prefix = [config.decoder_start_token_id] if prefix is None else list(prefix)
  rows, width = len(sources), max(map(len, targets)) + len(prefix)
  inputs = np.full((rows, max(map(len, sources))), pad_id)  # [rows, source_len]
  decoder_inputs = np.full((rows, width), pad_id)  # [rows, len(prefix) + target_len]
  labels = np.full((rows, width), -100)  # cross_entropy's ignore_index; the prefix is given
  for row, (source, target) in enumerate(zip(sources, targets)):
    inputs[row, : len(source)] = source
    decoder_inputs[row, : len(prefix) + len(target)] = [*prefix, *target]
    labels[row, len(prefix) - 1 : len(prefix) + len(target)] = [*target, eos_id]
  torch.manual_seed(0)
  # Position tables stay as they are: FSMT saves its sinusoidal one, which we check on import.
  trained = [p for name, p in model.named_parameters() if "embed_positions" not in name]
  optimizer = torch.optim.Adam(trained, lr=LEARNING_RATE)
  model.train()
  threads = torch.get_num_threads()
  torch.set_num_threads(1)  # tiny matrices: a second thread only waits (measured 2-7x slower)
  for _ in range(TRAIN_STEPS):
    logits = model(
      input_ids=torch.tensor(inputs),
      attention_mask=torch.tensor(inputs != pad_id),
      decoder_input_ids=torch.tensor(decoder_inputs),
      use_cache=False,
    ).logits  # [rows, width, target_vocab]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.tensor(labels).flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  torch.set_num_threads(threads)
  return model.eval()


def until_eos(tokens, eos_id: int) -> list[int]:
  tokens = [int(t) for t in tokens]
  return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens


def assert_varied(rows, special: Sequence[int], eos_id: int) -> None:
  """Outputs worth comparing: rows (token ids, cut after EOS) that are not all equal and each
  hold at least MIN_DISTINCT distinct tokens other than `special`."""
  rows = [tuple(until_eos(row, eos_id)) for row in rows]
  assert len(set(rows)) == len(rows) > 1, f"rows repeat: {rows}"
  for row in rows:
    assert len(set(row) - set(special)) >= MIN_DISTINCT, f"a near-constant row: {rows}"


# The tiny Marian model and tokenizer of the Marian tests (`marian_dir`). The newstest2013 lines
# that test_hf_import.py's test_imported_workdir_translates_like_generate translates, and the
# lengths (EOS excluded) of the targets the model learns for them: some longer than that
# file's MAX_NEW_TOKENS, so cut there.
MARIAN_TRANSLATED = (2000, 2008)
MARIAN_TARGET_LENGTHS = (5, 11, 18, 7, 14, 4, 20, 9)


def _sentencepiece(lines: list[str]) -> bytes:
  import sentencepiece as spm

  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(lines),
    model_writer=model,
    vocab_size=150,
    model_type="unigram",
    character_coverage=1.0,
    minloglevel=2,
  )
  return model.getvalue()


def _marian_vocab(*protos: bytes) -> dict[str, int]:
  """OPUS-MT's layout: </s> 0, <unk> 1, the pieces of both models, <pad> last."""
  import sentencepiece as spm

  vocab = {"</s>": 0, "<unk>": 1}
  for proto in protos:
    processor = spm.SentencePieceProcessor(model_proto=proto)
    for i in range(processor.get_piece_size()):
      if not (processor.is_control(i) or processor.is_unknown(i)):
        vocab.setdefault(processor.id_to_piece(i), len(vocab))
  vocab["<pad>"] = len(vocab)
  return vocab


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
  """A save_pretrained directory: a tiny MarianMTModel trained to translate the lines
  MARIAN_TRANSLATED into random targets, and its real tokenizer. The fixture of the Marian
  tests (test_hf_import, test_hf_scoring, test_hf_weights, test_finetune_import): each module
  that names it builds its own, as when they imported it from test_hf_import."""
  torch, transformers = require_interop()
  files = tmp_path_factory.mktemp("marian_files")
  source, target = (
    _sentencepiece(news_lines("en", 0, 200)),
    _sentencepiece(news_lines("de", 0, 200)),
  )
  vocab = _marian_vocab(source, target)
  (files / "source.spm").write_bytes(source)
  (files / "target.spm").write_bytes(target)
  (files / "vocab.json").write_text(json.dumps(vocab))
  tokenizer = transformers.MarianTokenizer(
    source_spm=str(files / "source.spm"),
    target_spm=str(files / "target.spm"),
    vocab=str(files / "vocab.json"),
  )
  config = transformers.MarianConfig(
    vocab_size=len(vocab),
    decoder_vocab_size=len(vocab),
    pad_token_id=vocab["<pad>"],
    eos_token_id=vocab["</s>"],
    decoder_start_token_id=vocab["<pad>"],
    activation_function="swish",
    scale_embedding=True,
    **dict(SIZES, max_position_embeddings=512),
  )
  torch.manual_seed(0)
  model = transformers.MarianMTModel(config)
  sources = tokenizer(news_lines("en", *MARIAN_TRANSLATED)).input_ids  # EOS-terminated, unpadded
  ordinary = [
    i for i in range(len(vocab)) if i not in (vocab["</s>"], vocab["<unk>"], vocab["<pad>"])
  ]
  targets = random_targets(np.random.default_rng(0), ordinary, MARIAN_TARGET_LENGTHS)
  train_to_translate(model, sources, targets)
  directory = tmp_path_factory.mktemp("opus-mt-tiny")
  model.save_pretrained(directory)
  tokenizer.save_pretrained(directory)
  return directory


# The tiny trained models of the greedy and beam tests (test_hf_models, test_hf_beam).


def saved_and_read_back(model_type: str, model, tmp_path_factory):
  """(model_type, HF model, our config, our params): `model` saved and read back by us."""
  directory = tmp_path_factory.mktemp(model_type)
  model.save_pretrained(directory)
  config, params = hf_convert.load_pretrained(str(directory))
  return model_type, model, config.replace(deterministic=True), params


def ordinary_ids(config, vocab_size: int) -> np.ndarray:
  """The ids of a vocabulary that are no special token (of our config or fairseq's 0-3)."""
  special = {config.pad_id, config.eos_id, config.decoder_start_id, 0, 1, 2, 3}
  return np.array([t for t in range(vocab_size) if t not in special])


# Row lengths (EOS included) of the sources the greedy and the beam test decode, padded, and
# of the targets `trained` learns for them: some end before the tests' 12 steps, some do not.
GREEDY_LENGTHS = (7, 5, 9, 6)
BEAM_LENGTHS = (7, 4, 2, 9, 5, 3)
TRAINED_TARGET_LENGTHS = (4, 9, 13, 6, 7, 5, 11, 8, 14, 6)


def decoded_sources(config, lengths) -> np.ndarray:
  """int64 [len(lengths), max(lengths)]: the sources of the greedy or the beam test."""
  seed = 0 if lengths == GREEDY_LENGTHS else 1
  return random_batch(config, lengths, config.vocab_size, np.random.default_rng(seed))


@pytest.fixture(scope="module", params=hf_convert.SUPPORTED_MODEL_TYPES)
def trained(request, tmp_path_factory):
  """A tiny model of each type trained to translate the greedy test's sources into targets in
  which one token recurs, followed each time by another (repeating_targets), and the beam
  test's into targets whose best first token is a trap for greedy decoding
  (greedy_misleading_targets): what it writes depends on the source and on the tokens before,
  and beam search finds what greedy does not (measured: greedy differs from beam-4 on 4-6 of
  the 6 rows, by type). The fixture of test_hf_models and test_hf_beam (each builds its own)."""
  torch, transformers = require_interop()
  model_type = request.param
  torch.manual_seed(0)
  model = transformers.AutoModelForSeq2SeqLM.from_config(hf_config(model_type))
  config = hf_convert.config_from_hf(model.config.to_dict())
  ids = ordinary_ids(config, config.output_vocab_size)
  greedy_sources, beam_sources = (
    [[int(t) for t in row if t != config.pad_id] for row in decoded_sources(config, lengths)]
    for lengths in (GREEDY_LENGTHS, BEAM_LENGTHS)
  )
  rng = np.random.default_rng(2)
  sources = list(greedy_sources)
  targets = repeating_targets(rng, ids, TRAINED_TARGET_LENGTHS[: len(GREEDY_LENGTHS)])
  # The beam test's sources: targets on which the best first token is a trap for greedy.
  for source, choices in zip(
    beam_sources, greedy_misleading_targets(rng, ids, TRAINED_TARGET_LENGTHS[len(GREEDY_LENGTHS) :])
  ):
    sources += [source] * len(choices)
    targets += choices
  train_to_translate(model, sources, targets)
  return saved_and_read_back(model_type, model, tmp_path_factory)


def random_batch(config, lengths, vocab, rng, start=None):
  """int64 [len(lengths), max(lengths) (+1)] padded rows: random ordinary tokens ending with
  EOS, with `start` (the decoder start token) first when given."""
  ordinary = ordinary_ids(config, vocab)
  offset = start is not None
  rows = np.full((len(lengths), max(lengths) + offset), config.pad_id, np.int64)
  for row, length in enumerate(lengths):
    tokens = list(rng.choice(ordinary, length - 1)) + [config.eos_id]
    rows[row, offset : offset + length] = tokens
    if offset:
      rows[row, 0] = start
  return rows


def special_ids(config) -> tuple[int, ...]:
  return config.pad_id, config.eos_id, config.decoder_start_id

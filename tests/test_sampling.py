"""Sampling: the drawn frequencies match a known distribution (χ², and the test fails for a
wrong temperature or a wrong top-p cut), the filtering equals transformers' `generate`, and
the samples of a line depend on its seed, line and sample index alone (1 and 8 devices,
any batch size).
"""

import argparse
import functools
import re

import hf_fakes
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import scipy.stats
from helpers import init_params, tiny_model_config

from transformer_mt import cli
from transformer_mt.commands import translate as translate_command
from transformer_mt.data import tokenizer
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import sampling
from transformer_mt.decoding.sampling import SamplingSettings
from transformer_mt.decoding.translator import Translator
from transformer_mt.runtime import sharding

# A toy model's next-token distribution (ids: PAD 0, EOS 1, BOS 2, then content). Sorted by
# probability: 3 .30, 4 .20, 5 .15, 6 .12, 7 .08, 8 .06, EOS .05, 9 .04; cumulative .30,
# .50, .65, .77, .85, .91, .96, 1: top-p 0.7 keeps {3, 4, 5, 6}, token 6 crossing 0.7.
PROBS = np.array([0.0, 0.05, 0.0, 0.30, 0.20, 0.15, 0.12, 0.08, 0.06, 0.04])
with np.errstate(divide="ignore"):
  LOGITS = np.log(PROBS).astype(np.float32)  # -inf for PAD and BOS
DRAWS = 20_000
P_VALUE = 1e-3


def expected_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
  """The filtered distribution, computed independently of sampling.py: top-p as "the most
  probable tokens while the mass before them is below p" (descending order)."""
  z = np.asarray(logits, np.float64) / temperature
  keep = np.isfinite(z)
  if top_k:
    keep &= z >= np.sort(z[keep])[::-1][min(top_k, keep.sum()) - 1]
  probs = np.where(keep, np.exp(z - z[keep].max()), 0.0)
  probs /= probs.sum()
  if top_p < 1:
    order = np.argsort(-probs)
    mass_before = np.cumsum(probs[order]) - probs[order]
    keep[order[mass_before >= top_p]] = False
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
  return probs


def chi_square(counts, probs):
  """(statistic, critical value at p = 0.001) of `counts` against `probs`; infinite when a
  token outside the distribution's support was drawn."""
  support = probs > 0
  if counts[~support].any():
    return np.inf, scipy.stats.chi2.ppf(1 - P_VALUE, support.sum() - 1)
  test = scipy.stats.chisquare(counts[support], DRAWS * probs[support])
  return test.statistic, scipy.stats.chi2.ppf(1 - P_VALUE, support.sum() - 1)


def toy_step(tokens, position, cache):
  """The toy model: the same next-token logits whatever came before."""
  return jnp.broadcast_to(jnp.asarray(LOGITS), (tokens.shape[0], len(LOGITS))), cache


@functools.partial(jax.jit, static_argnames="settings")
def draw_first_tokens(seed, settings):
  """int32 [DRAWS]: the first token of DRAWS rows (= DRAWS lines), in one jitted call."""
  keys = sampling.row_keys(seed, jnp.arange(DRAWS), jnp.zeros(DRAWS, jnp.int32))
  return sampling.sample(toy_step, {"unused": jnp.zeros(())}, keys, settings, max_len=1)[:, 0]


@functools.cache
def first_token_counts(settings, seed=0):
  """int [vocab]: how often each token came first (cached: several tests read the same draws)."""
  tokens = np.asarray(draw_first_tokens(np.uint32(seed), settings))
  return np.bincount(tokens, minlength=len(LOGITS))


@pytest.mark.parametrize(
  "settings",
  [
    SamplingSettings(),
    SamplingSettings(temperature=0.7),
    SamplingSettings(temperature=1.5, top_k=4),
    SamplingSettings(top_p=0.7),
    SamplingSettings(temperature=1.3, top_k=6, top_p=0.8),
  ],
  ids=["plain", "temperature", "top_k", "top_p", "all"],
)
def test_frequencies_match_the_filtered_distribution(settings):
  counts = first_token_counts(settings)
  probs = expected_probs(LOGITS, settings.temperature, settings.top_k, settings.top_p)
  statistic, critical = chi_square(counts, probs)
  assert statistic < critical, (counts, probs)
  assert counts[PAD_ID] == counts[BOS_ID] == 0


def test_chi_square_fails_for_a_wrong_temperature_or_top_p_cut():
  """The same draws against a wrong distribution: the statistic is far above the bound."""
  counts = first_token_counts(SamplingSettings(temperature=0.7))
  statistic, critical = chi_square(counts, expected_probs(LOGITS, temperature=1.0))
  assert statistic > 20 * critical
  statistic, _ = chi_square(counts, expected_probs(LOGITS, temperature=0.8))
  assert statistic > 5 * critical

  counts = first_token_counts(SamplingSettings(top_p=0.7))
  assert set(np.flatnonzero(counts)) == {3, 4, 5, 6}  # the token crossing 0.7 included

  def renormalized(ids):
    return np.where(np.isin(np.arange(len(PROBS)), ids), PROBS, 0) / PROBS[ids].sum()

  statistic, critical = chi_square(counts, renormalized([3, 4, 5]))  # boundary excluded
  assert statistic == np.inf
  statistic, critical = chi_square(counts, renormalized([3, 4, 5, 6, 7]))  # one too many
  assert statistic > 20 * critical
  statistic, critical = chi_square(counts, renormalized([3, 4, 5, 6]))
  assert statistic < critical


def test_seed_fixes_the_draws_and_changes_them():
  settings = SamplingSettings(temperature=0.7)
  again = np.bincount(np.asarray(draw_first_tokens(np.uint32(0), settings)), minlength=len(LOGITS))
  np.testing.assert_array_equal(first_token_counts(settings), again)
  assert not np.array_equal(first_token_counts(settings), first_token_counts(settings, seed=1))


@pytest.mark.parametrize(
  "settings",
  [
    SamplingSettings(temperature=0.6),
    SamplingSettings(top_k=5),
    SamplingSettings(top_p=0.5),
    SamplingSettings(temperature=1.7, top_k=20, top_p=0.9),
  ],
)
def test_warp_logits_equals_transformers_generate(settings):
  """`generate(do_sample=True)` of a tiny random Marian model: its processed scores at each
  step equal `warp_logits` of its raw logits (with its pad id masked, as ours masks PAD)."""
  torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[interop]'")
  transformers = pytest.importorskip("transformers", minversion="5.18")
  torch.manual_seed(0)
  config = transformers.MarianConfig(
    vocab_size=64,
    decoder_vocab_size=64,
    pad_token_id=63,
    eos_token_id=0,
    decoder_start_token_id=63,
    **hf_fakes.untrained_sizes(layers=1),
  )
  model = transformers.MarianMTModel(config).eval()
  with torch.no_grad():  # top-p 0.5 then keeps about 7 of 64 tokens: a cut mid-distribution
    for parameter in model.parameters():
      parameter.normal_(0, 0.5)
  inputs = torch.tensor([[5, 9, 12, 7, 0], [11, 4, 0, 63, 63]])
  out = model.generate(
    inputs,
    attention_mask=inputs != 63,
    do_sample=True,
    temperature=settings.temperature,
    top_k=settings.top_k,
    top_p=settings.top_p,
    max_new_tokens=4,
    min_new_tokens=4,  # no early EOS: every step has both rows
    bad_words_ids=[[63]],
    forced_eos_token_id=None,
    output_scores=True,
    output_logits=True,
    return_dict_in_generate=True,
  )
  for raw, processed in zip(out.logits, out.scores):
    raw = raw.numpy()
    raw[:, [63, 0]] = -np.inf  # bad_words_ids (PAD) and min_new_tokens (EOS) come first
    ours = np.asarray(sampling.warp_logits(jnp.asarray(raw), settings))
    theirs = processed.numpy()
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
    kept = np.isfinite(theirs)
    if settings.top_k or settings.top_p < 1:  # the filters cut inside the distribution
      assert kept.sum(axis=1).min() >= 2 and kept.sum(axis=1).max() < 62
    np.testing.assert_allclose(ours[kept], theirs[kept], rtol=1e-6, atol=1e-6)


# A tiny random Transformer with a tokenizer for the Translator-level tests.
PAIRS = [
  ("the cat sat on the mat", "die katze sass auf der matte"),
  ("a dog barks at night", "ein hund bellt in der nacht"),
  ("the bird sings in the tree", "der vogel singt im baum"),
] * 20
LINES = [
  "the cat sat on the mat",
  "",
  "a dog",
  "the bird sings in the tree at night and the dog barks on the mat",
  "night",
  "the cat sings",
  "a bird sat in the tree",
]


@pytest.fixture(scope="module")
def model():
  tok = tokenizer.train_tokenizer(PAIRS, vocab_size=60, model_type="bpe")
  config = tiny_model_config(
    vocab_size=tok.vocab_size, num_heads=2, num_encoder_layers=1, num_decoder_layers=1
  )
  params = init_params(config)
  return tok, config, params


def make_translator(model, devices, batch_size, **kwargs):
  tok, config, params = model
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}), devices
  )
  return Translator(
    params=params,
    model_config=config,
    tokenizer=tok,
    mesh=mesh,
    batch_size=batch_size,
    extra_len=4,
    max_target_len=16,
    **kwargs,
  )


def test_same_samples_on_1_and_8_devices_and_any_batch_size(model, cpu_devices):
  """A line's samples depend on (seed, line, sample index), not on its row, batch or device."""
  settings = SamplingSettings(temperature=1.5, top_p=0.95)
  eight = make_translator(model, cpu_devices, batch_size=8)
  one = make_translator(model, cpu_devices[:1], batch_size=3)
  on_eight = eight.sample(LINES, num_samples=3, settings=settings, seed=5)
  on_one = one.sample(LINES, num_samples=3, settings=settings, seed=5)
  assert on_eight == on_one
  assert on_eight[1] == ["", "", ""]  # the empty line
  # A line's samples differ from each other, and from another seed's: the draws are random.
  assert all(len(set(texts)) > 1 for index, texts in enumerate(on_eight) if LINES[index])
  assert one.sample(LINES, 3, settings, seed=6) != on_one
  # The same line elsewhere in the input (another line index) gets other samples.
  moved = one.sample(LINES[::-1], 3, settings, seed=5)[::-1]
  assert moved != on_one


def test_sampled_rows_obey_the_length_rule_and_never_emit_suppressed_ids(model):
  """At a high temperature the random model would emit PAD and BOS often; none comes, the
  forced first token does, and each row stops at its source length + extra_len."""
  tok, config, params = model
  translator = make_translator(model, jax.devices()[:1], batch_size=16)
  sources = sorted((ids for ids in translator.encode_sources(LINES) if ids), key=len) * 2
  inputs, max_lengths, max_len = translator.padded_batch(sources)
  outputs = np.asarray(
    sampling.sample_decode(
      params,
      jnp.asarray(inputs),
      np.uint32(0),
      jnp.arange(len(inputs)),
      jnp.zeros(len(inputs), jnp.int32),
      config,
      max_len,
      SamplingSettings(temperature=5.0),
      max_lengths=jnp.asarray(max_lengths),
      forced_first_id=7,
    )
  )
  reached_limit = 0
  for row, ids in enumerate(outputs[: len(sources)]):
    assert ids[0] == 7
    length = max_len - (ids == PAD_ID).sum()
    assert length <= len(sources[row]) + translator.extra_len
    body = ids[:length]
    assert not np.isin(body, [PAD_ID, BOS_ID]).any()
    assert (body[:-1] != EOS_ID).all() and (ids[length:] == PAD_ID).all()
    reached_limit += length == max_lengths[row] and body[-1] != EOS_ID
  assert reached_limit > 0  # the limit was tested, not only EOS
  assert (outputs[len(sources) :] == PAD_ID).all()  # padding rows: nothing


def _translate_args(**flags):
  args = dict(sample=False, beam=None, num_samples=None, temperature=None, top_k=None, top_p=None)
  return argparse.Namespace(**{**args, "seed": None, **flags})


def test_translate_output_formats(model):
  translator = make_translator(model, jax.devices()[:1], batch_size=3)
  settings = SamplingSettings(temperature=1.5)
  options = translate_command.sampling_options(
    _translate_args(sample=True, temperature=1.5, num_samples=3)
  )
  text = translate_command.translations_text(translator, LINES, options, progress=False)
  samples = translator.sample(LINES, 3, settings, seed=0)
  expected = [f"{i}\t{n}\t{samples[i][n]}" for i in range(len(LINES)) for n in range(3)]
  assert text.splitlines() == expected
  options = translate_command.sampling_options(_translate_args(sample=True, temperature=1.5))
  text = translate_command.translations_text(translator, LINES, options, progress=False)
  assert text.split("\n")[:-1] == [texts[0] for texts in translator.sample(LINES, 1, settings)]
  assert sampling.samples_tsv([["a\tb\nc"], [""]]) == "0\t0\ta b c\n1\t0\t\n"


@pytest.mark.parametrize(
  "flags, message",
  [
    (["--top_p", "0.5"], "--top_p only apply to sampling"),
    (["--sample", "--beam", "4"], "--beam 4 with --sample"),
    (["--sample", "--temperature", "0"], "--temperature 0.0: must be a positive"),
    (["--sample", "--top_k", "-1"], "--top_k -1"),
    (["--sample", "--top_p", "1.5"], r"--top_p 1.5: must be in \(0, 1\]"),
    (["--sample", "--num_samples", "0"], "--num_samples 0"),
    (["--sample", "--seed", "-3"], "--seed -3"),
  ],
)
def test_bad_sampling_flags_are_one_line(tmp_path, capsys, flags, message):
  """Refused before the checkpoint is read: the workdir here does not even exist."""
  assert cli.main(["translate", "--workdir", str(tmp_path / "none"), *flags]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and err.startswith("error: ")
  assert re.search(message, err), err

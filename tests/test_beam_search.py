"""Beam search against brute-force enumeration on toy models, and against greedy decoding.

The toy models (as in t5x's decoding_test) have a fixed, known next-token distribution
per sentence: a Markov table indexed by the previous token, or by the previous two
tokens with the older one read back from the cache (which catches cache rows that do
not follow their beams). PAD and BOS get probability 0, so the hypotheses are sequences
over the content tokens {3, 4} ending in EOS, or forced-finished at the sentence's max
length (without EOS). The "fairseq" pool is checked against a plain transcription of
fairseq 0.9's SequenceGenerator (`fairseq_reference`) and on hand-built tables, one per rule.
The float64 references (brute force and the transcriptions) are in tests/beam_references.py.

The tables are arguments of the jitted search (`toy_search`): a search compiles once per static
setting and shape, and tests whose settings agree share its program.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from beam_references import (
  CONTENT,
  VOCAB,
  brute_force,
  fairseq_reference,
  reference_search,
)

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import beam_rows
from transformer_mt.decoding import beam_search as bs

A, B = CONTENT


def markov_tables(seeds, order=1, eos_bias=0.0, scale=1.5):
  """Logits [sentence] + [vocab] * order + [vocab], one table per seed; -inf for PAD and BOS."""
  tables = []
  for seed in seeds:
    rng = np.random.default_rng(seed)
    bias = rng.uniform(-1.0, 2.0) if eos_bias is None else eos_bias
    logits = rng.normal(size=(VOCAB,) * order + (VOCAB,)) * scale
    logits[..., EOS_ID] += bias
    logits[..., [PAD_ID, BOS_ID]] = -np.inf
    tables.append(logits)
  return np.stack(tables).astype(np.float32)


def toy_model(tables, max_len):
  """(step fn, initial cache) for sentences with first- or second-order tables.

  tables: [batch, V, V] (context: the previous token) or [batch, V, V, V] (the two
  previous tokens). The cache holds each row's sentence id, int32 [batch], which must
  follow the beams; the fed tokens, `history` int32 [batch, max_len]; and a scalar step
  counter `index` that beam search must neither expand nor gather.
  """
  tables = jnp.asarray(tables)
  batch = tables.shape[0]
  cache = {
    "sentence": jnp.arange(batch, dtype=jnp.int32),
    "history": jnp.full((batch, max_len), PAD_ID, jnp.int32),
    "index": jnp.array(0, jnp.int32),
  }

  def step(tokens, position, cache):
    sentence, history, index = cache["sentence"], cache["history"], cache["index"]
    if tables.ndim == 3:
      logits = tables[sentence, tokens]
    else:
      two_back = jnp.where(index == 0, BOS_ID, history[:, jnp.maximum(index - 1, 0)])
      logits = tables[sentence, two_back, tokens]
    # NaN logits if the counter and the position disagree: the scores would show it.
    logits = jnp.where(position == index, logits, jnp.nan)
    return logits, dict(cache, history=history.at[:, index].set(tokens), index=index + 1)

  return step, cache


# beam_search's defaults for the options the tests vary: a search's static settings are
# normalized with them, so that equal settings share one compiled search.
SEARCH_DEFAULTS = dict(
  early_stopping=True, always_gather=False, length_penalty="gnmt", candidate_pool="beam"
)


@functools.cache
def toy_search(beam, max_len, alpha, settings):
  """beam_search over `toy_model`, jitted once per static configuration (`settings`: sorted
  (name, value) pairs): (tables, max_lengths) -> output; jit compiles it once per shape."""

  def search(tables, max_lengths):
    step, cache = toy_model(tables, max_len)
    return bs.beam_search(
      step, cache, tables.shape[0], beam, max_len, alpha=alpha, max_lengths=max_lengths,
      **dict(settings),
    )  # fmt: skip

  return jax.jit(search)


def run_toy(tables, beam, max_len, alpha, max_lengths=None, **options):
  """beam_search's outputs (NumPy) for the toy model of `tables`; `options` are beam_search's
  (early_stopping, always_gather, length_penalty, candidate_pool, ...). Without max_lengths
  every sentence may run to max_len."""
  tables = jnp.asarray(tables, jnp.float32)
  if max_lengths is None:
    max_lengths = [max_len] * tables.shape[0]
  settings = tuple(sorted({**SEARCH_DEFAULTS, **options}.items()))
  out = toy_search(beam, max_len, alpha, settings)(tables, jnp.asarray(max_lengths, jnp.int32))
  return jax.tree.map(np.asarray, out)


def second_order(tables):
  """First-order tables [batch, V, V] as second-order ones [batch, V, V, V] (the token two
  back ignored): the same distributions, searched by the second-order model's program."""
  tables = np.asarray(tables)
  return np.broadcast_to(tables[:, None], (tables.shape[0], VOCAB) + tables.shape[1:])


def padded(seq, max_len):
  return list(seq) + [PAD_ID] * (max_len - len(seq))


def check_exhaustive(alpha, length_penalty="gnmt", candidate_pool="beam"):
  """With a beam as large as the hypothesis space the search is exhaustive: every pool
  keeps all candidates (at most 24 per step) and lets every ending one finish ("fairseq":
  none ends at the first step, and every one ends with EOS). Two first-order tables (searched
  as second-order ones that ignore the older token) and two second-order ones, in one batch;
  the brute force reads each in its own order."""
  first, second = markov_tables(seeds=[1, 11], order=1), markov_tables(seeds=[2, 12], order=2)
  tables = list(first) + list(second)
  max_len, max_lengths = 4, [3, 4, 3, 4]
  search = dict(length_penalty=length_penalty, candidate_pool=candidate_pool)
  out = run_toy(
    np.concatenate([second_order(first), second]),
    beam=32,
    max_len=max_len,
    alpha=alpha,
    max_lengths=max_lengths,
    **search,
  )
  for b, max_length in enumerate(max_lengths):
    expected = brute_force(
      tables[b], max_length, alpha, length_penalty, fairseq=candidate_pool == "fairseq"
    )
    found = out.all_scores[b] > -np.inf
    # 15 and 31 hypotheses ("fairseq": 6 and 14); the rest of the beam is empty.
    assert found.sum() == len(expected)
    # The first-order model has exact ties (A A B A and A B A A use the same transitions),
    # so compare sorted scores, and each returned sequence with its own brute-force score.
    np.testing.assert_allclose(
      out.all_scores[b, : len(expected)], [s for s, _ in expected], atol=1e-5, rtol=1e-5
    )
    truth = {seq: score for score, seq in expected}
    returned = [tuple(int(t) for t in seq if t != PAD_ID) for seq in out.all_sequences[b][found]]
    assert sorted(returned) == sorted(truth)
    for seq, score in zip(returned, out.all_scores[b][found]):
      np.testing.assert_allclose(score, truth[seq], atol=1e-5, rtol=1e-5)
    assert out.scores[b] == out.all_scores[b, 0]
    np.testing.assert_allclose(truth[returned[0]], expected[0][0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_large_beam_equals_brute_force(alpha):
  check_exhaustive(alpha)


@pytest.mark.parametrize(
  "length_penalty, candidate_pool, alpha",
  [
    ("power", "beam", 1.0),
    ("gnmt", "2beam", 0.6),
    ("power", "hf", 1.0),
    ("power", "hf", -0.5),
    ("power", "fairseq", 1.0),
  ],
)
def test_large_beam_equals_brute_force_for_every_pool_and_penalty(
  length_penalty, candidate_pool, alpha
):
  check_exhaustive(alpha, length_penalty, candidate_pool)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_small_beam_scores_are_exact(alpha):
  """A small beam may miss hypotheses, but each one it returns carries its true score. (The
  tables and the search of test_skipping_unneeded_reorders_changes_nothing: one program.)"""
  tables = markov_tables(seeds=[3, 7, 11], order=2, eos_bias=None)
  out = run_toy(tables, beam=3, max_len=6, alpha=alpha)
  for b, table in enumerate(tables):
    truth = {seq: score for score, seq in brute_force(table, 6, alpha)}
    for seq, score in zip(out.all_sequences[b], out.all_scores[b]):
      seq = tuple(int(t) for t in seq if t != PAD_ID)
      np.testing.assert_allclose(score, truth[seq], atol=1e-5, rtol=1e-5)
    assert np.all(out.all_scores[b, :-1] >= out.all_scores[b, 1:])


FAIRSEQ_SEEDS = [1, 8, 53, 60]
# The transcription tests' sentences: 5 tables for the pools of `reference_search`, then the
# fairseq ones and two more with shorter limits. One batch, so that the tests share searches.
TRANSCRIPTION_SEEDS = [224, 264, 102, 20, 21] + FAIRSEQ_SEEDS + [2, 3]
TRANSCRIPTION_MAX_LENGTHS = [5] * 5 + [5, 5, 5, 5, 4, 2]


def transcription_tables():
  return markov_tables(seeds=TRANSCRIPTION_SEEDS, order=2, eos_bias=None, scale=2.0)


@pytest.mark.parametrize("candidate_pool", ["beam", "2beam", "hf"])
@pytest.mark.parametrize("length_penalty, alpha", [("gnmt", 0.6), ("power", 1.0), ("power", -0.5)])
def test_small_beam_follows_a_plain_transcription(candidate_pool, length_penalty, alpha):
  """Beams too small to be exhaustive return exactly what the pool's procedure, written out
  in plain Python, returns: which candidates finish, which stay live, in what order."""
  # With beam 2, the first five tables make every two pools disagree on at least one sentence
  # under every penalty (an EOS ranked between beam and 2 * beam; a live beam "beam" loses).
  # The others are the fairseq tests' (`TRANSCRIPTION_TABLES`), two of them with shorter
  # limits: the searches with "power" and alpha 1 are test_fairseq_pool_differs_from_2beam_and_hf's.
  tables = transcription_tables()
  beam, max_len = 2, 5
  out = run_toy(
    tables,
    beam=beam,
    max_len=max_len,
    alpha=alpha,
    max_lengths=TRANSCRIPTION_MAX_LENGTHS,
    length_penalty=length_penalty,
    candidate_pool=candidate_pool,
  )
  for b, (table, max_length) in enumerate(zip(tables, TRANSCRIPTION_MAX_LENGTHS)):
    expected = reference_search(table, beam, max_length, alpha, length_penalty, candidate_pool)
    found = out.all_scores[b] > -np.inf
    returned = [tuple(int(t) for t in seq if t != PAD_ID) for seq in out.all_sequences[b][found]]
    assert returned == [seq for _, seq in expected], b
    np.testing.assert_allclose(
      out.all_scores[b][found], [score for score, _ in expected], atol=1e-5, rtol=1e-5
    )


def first_order_table(rows):
  """Logits [VOCAB, VOCAB] from {context token: {next token: probability}}; EOS and PAD
  continue with EOS, everything else has probability 0."""
  probs = np.zeros((VOCAB, VOCAB))
  for context, row in rows.items():
    for token, p in row.items():
      probs[context, token] = p
  probs[[PAD_ID, EOS_ID], EOS_ID] = 1.0
  with np.errstate(divide="ignore"):
    return np.log(probs).astype(np.float32)


# EOS is second at step 0: "2beam" finishes it (p 0.3) and nothing later beats it at
# alpha 0; "beam" never sees it, "hf" drops it (rank 1 of 2), and both return A EOS (0.25).
EOS_SECOND = first_order_table(
  {BOS_ID: {A: 0.5, EOS_ID: 0.3, B: 0.2}, A: {EOS_ID: 0.5, A: 0.25, B: 0.25}, B: {EOS_ID: 1.0}}
)
# EOS is first at step 0 (p 0.4, score log 0.4 / 1): "beam" with one beam stops there (it
# is greedy); "2beam" and "hf" keep A alive, and A EOS (p 0.3465, score log 0.3465 / 2)
# wins under the power penalty with alpha 1.
EOS_FIRST = first_order_table(
  {BOS_ID: {EOS_ID: 0.4, A: 0.35, B: 0.25}, A: {EOS_ID: 0.99, A: 0.005, B: 0.005}, B: {EOS_ID: 1}}
)


@pytest.mark.parametrize(
  "table, length_penalty, alpha, expected",
  [
    (EOS_SECOND, "gnmt", 0.0, {"beam": (A, EOS_ID), "2beam": (EOS_ID,), "hf": (A, EOS_ID)}),
    (EOS_FIRST, "power", 1.0, {"beam": (EOS_ID,), "2beam": (A, EOS_ID), "hf": (A, EOS_ID)}),
  ],
)
def test_pools_differ_where_their_definitions_say(table, length_penalty, alpha, expected):
  for candidate_pool, best in expected.items():
    out = run_toy(
      table[None],
      beam=1,
      max_len=4,
      alpha=alpha,
      length_penalty=length_penalty,
      candidate_pool=candidate_pool,
    )
    np.testing.assert_array_equal(out.sequences[0], padded(best, 4), err_msg=candidate_pool)
    reference = reference_search(table, 1, 4, alpha, length_penalty, candidate_pool)
    assert reference[0][1] == best, candidate_pool
    np.testing.assert_allclose(out.scores[0], reference[0][0], rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_beats_greedy_when_greedy_is_wrong(alpha):
  """The likelier first token (A, 0.6) only leads to flat continuations; B then EOS wins."""
  probs = np.zeros((VOCAB, VOCAB))
  probs[BOS_ID, [A, B]] = 0.6, 0.4
  probs[A, [EOS_ID, A, B]] = 0.35, 0.33, 0.32  # greedy: A EOS, p = 0.21
  probs[B, [EOS_ID, A, B]] = 0.9, 0.05, 0.05  # best: B EOS, p = 0.36
  probs[[PAD_ID, EOS_ID], EOS_ID] = 1.0
  with np.errstate(divide="ignore"):
    table = np.log(probs).astype(np.float32)
  greedy = run_toy(table[None], beam=1, max_len=4, alpha=alpha)
  np.testing.assert_array_equal(greedy.sequences[0], [A, EOS_ID, PAD_ID, PAD_ID])
  beam = run_toy(table[None], beam=4, max_len=4, alpha=alpha)
  np.testing.assert_array_equal(beam.sequences[0], [B, EOS_ID, PAD_ID, PAD_ID])
  np.testing.assert_allclose(beam.scores[0], np.log(0.36) / (7 / 6) ** alpha, rtol=1e-5)
  np.testing.assert_allclose(beam.scores[0], brute_force(table, 4, alpha)[0][0], rtol=1e-5)


@pytest.mark.parametrize(
  "alpha, length_penalty, candidate_pool",
  [
    (0.0, "gnmt", "beam"),
    (0.6, "gnmt", "beam"),
    (-0.5, "gnmt", "beam"),
    (0.6, "power", "hf"),
    (-0.5, "power", "hf"),
    (0.6, "power", "2beam"),
    (1.0, "power", "fairseq"),
  ],
)
def test_early_stopping_changes_nothing(alpha, length_penalty, candidate_pool):
  """Stopping once no live beam can beat the worst of the best finished loses nothing: the
  early-stopped search returns what the pool's plain transcription, run for every step
  (`reference_search`, `fairseq_reference`), returns.

  The tables (random EOS bias) finish within a few steps. For alpha 0.6 (both penalties)
  they include cases where a live beam behind the worst finished score on log-prob alone
  still overtakes it thanks to the length penalty: stopping on `log-prob <= worst
  finished`, without dividing by lp(max length), returns different hypotheses there.
  (With power and alpha 1 the exact bound, p / 8, is too loose to stop before max_len.)
  "fairseq" stops a sentence once beam_size have finished: nothing can enter a full set.
  The search without early stopping runs every step (test_accelerator_loop_options_change_nothing).
  """
  tables = markov_tables(seeds=[6, 64, 193, 273], eos_bias=None, scale=2.0)
  max_len = 8
  options = dict(length_penalty=length_penalty, candidate_pool=candidate_pool)
  early = run_toy(tables, beam=2, max_len=max_len, alpha=alpha, **options)
  assert early.num_steps < max_len
  for b, table in enumerate(tables):
    if candidate_pool == "fairseq":
      expected = fairseq_reference(table, 2, max_len, alpha)
    else:
      expected = reference_search(table, 2, max_len, alpha, length_penalty, candidate_pool)
    check_against(early, b, expected)


def test_per_sentence_max_lengths():
  # EOS is rare: hypotheses run to their limit. (Second-order tables that ignore the older
  # token: the program of test_skipping_unneeded_reorders_changes_nothing's random tables.)
  tables = second_order(markov_tables(seeds=[4, 5, 6], eos_bias=-4.0))
  max_len, max_lengths = 6, [2, 5, 0]
  out = run_toy(tables, beam=3, max_len=max_len, alpha=0.6, max_lengths=max_lengths)
  assert np.all(np.isfinite(out.scores))  # no sentence comes back without a hypothesis
  for b, max_length in enumerate(max_lengths):
    found = out.all_sequences[b][out.all_scores[b] > -np.inf]
    assert np.all(found[:, max_length:] == PAD_ID), (b, found)
  assert np.all(out.sequences[0, :2] != PAD_ID)  # forced finish at exactly 2 tokens
  assert np.all(out.sequences[1, :5] != PAD_ID)
  np.testing.assert_array_equal(out.sequences[2], [PAD_ID] * max_len)  # max length 0: empty
  assert out.scores[2] == 0.0


# A small random-init Transformer, as in tests/test_decode.py.
def sticky_table(stay=0.9):
  """Second-order logits under which each beam's best extension repeats its last token and
  stays ahead of every other candidate: after step 0 (where all beams extend the empty
  prefix) no beam ever changes parent."""
  probs = np.full((VOCAB, VOCAB, VOCAB), 1e-9)
  probs[:, BOS_ID, [A, B]] = 0.6, 0.4
  for token in CONTENT:
    probs[:, token, token] = stay
    probs[:, token, EOS_ID] = probs[:, token, A + B - token] = (1.0 - stay) / 2
  probs[:, [PAD_ID, EOS_ID], EOS_ID] = 1.0
  logits = np.log(probs / probs.sum(axis=-1, keepdims=True))
  logits[..., [PAD_ID, BOS_ID]] = -np.inf
  return logits.astype(np.float32)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_skipping_unneeded_reorders_changes_nothing(alpha):
  """Reordering the cache only when some beam changed parent == reordering it at every step.

  The sticky model never reorders after step 0, so the search copies the cache once; the
  random second-order tables (which read the previous token back from the cache) reorder
  at most steps. Both give exactly what the always-gather reference path gives.
  """
  max_len = 6
  sticky = run_toy(sticky_table()[None], beam=2, max_len=max_len, alpha=alpha)
  sticky_reference = run_toy(
    sticky_table()[None], beam=2, max_len=max_len, alpha=alpha, always_gather=True
  )
  np.testing.assert_array_equal(sticky.sequences[0], [A] * max_len)  # forced finish, no EOS
  assert sticky.num_steps == max_len and sticky.num_reorders == 1
  assert sticky_reference.num_reorders == max_len
  tables = markov_tables(seeds=[3, 7, 11], order=2, eos_bias=None)
  mixed = run_toy(tables, beam=3, max_len=max_len, alpha=alpha)
  mixed_reference = run_toy(tables, beam=3, max_len=max_len, alpha=alpha, always_gather=True)
  assert 1 <= mixed.num_reorders < mixed.num_steps
  for out, reference in ((sticky, sticky_reference), (mixed, mixed_reference)):
    for name in ("sequences", "scores", "all_sequences", "all_scores", "num_steps"):
      np.testing.assert_array_equal(getattr(out, name), getattr(reference, name), err_msg=name)


# What beam_search returns, all of it but the cache reorder count.
OUTPUT_FIELDS = ("sequences", "scores", "all_sequences", "all_scores", "all_log_probs", "num_steps")

# The loop-option and shrinking-batch tests search the same 16 sentences (beam 3, up to 16
# tokens), each pool under its own penalty, so that each shares the other's programs: the
# shrinking test's whole batch with stop_check_every 1 and 3 is the loop test's reference and
# one of its variants. The second-order tables read the previous token back from the cache
# rows, so a reorder that went wrong, or a sentence that moved with another's rows, shows.
# Sentences end at different steps (maximum lengths 0 to 16, EOS unlikely before them).
LOOP_TABLES = dict(seeds=range(100, 116), order=2, eos_bias=-2.0)
LOOP_MAX_LEN, LOOP_MAX_LENGTHS = 16, [16, 1, 4, 16, 2, 12, 6, 3, 16, 5, 7, 0, 14, 8, 2, 10]
LOOP_PENALTIES = {"beam": ("gnmt", 0.6), "2beam": ("power", 0.6), "hf": ("power", 1.0)}
LOOP_PENALTIES["fairseq"] = ("power", 1.0)


def loop_search(candidate_pool, **options):
  length_penalty, alpha = LOOP_PENALTIES[candidate_pool]
  return run_toy(
    markov_tables(**LOOP_TABLES),
    beam=3,
    max_len=LOOP_MAX_LEN,
    alpha=alpha,
    max_lengths=LOOP_MAX_LENGTHS,
    candidate_pool=candidate_pool,
    length_penalty=length_penalty,
    **options,
  )


@pytest.mark.parametrize(
  "candidate_pool, length_penalty, alpha, early_stopping",
  [
    ("beam", "gnmt", 0.6, True),
    ("2beam", "power", 0.6, True),
    ("hf", "power", 1.0, True),
    ("fairseq", "power", 1.0, True),
    ("beam", "gnmt", 0.6, False),
    ("fairseq", "power", 1.0, False),
  ],
)
def test_accelerator_loop_options_change_nothing(
  candidate_pool, length_penalty, alpha, early_stopping
):
  """Reordering at every step without a cond (conditional_reorder=False), and reading the
  stopping condition every 3 or 5 steps (stop_check_every; 5 together with the first): the
  default loop's hypotheses, scores, log-probs and step count, for every pool. max_len 16 is
  no multiple of 3 or 5: without early stopping the last iteration runs past it (those steps
  must be discarded); with it the searches end at a step count that neither 3 nor 5
  divides, so steps taken after the end must be discarded too."""
  assert LOOP_PENALTIES[candidate_pool] == (length_penalty, alpha)
  reference = loop_search(candidate_pool, early_stopping=early_stopping)
  assert reference.num_steps % 3 != 0 and reference.num_steps % 5 != 0
  if not early_stopping:
    assert reference.num_steps == LOOP_MAX_LEN  # every step
  for variant in (
    dict(conditional_reorder=False),
    dict(stop_check_every=3),
    dict(conditional_reorder=False, stop_check_every=5),
  ):
    out = loop_search(candidate_pool, early_stopping=early_stopping, **variant)
    for name in OUTPUT_FIELDS:
      np.testing.assert_array_equal(getattr(out, name), getattr(reference, name), err_msg=name)
    if variant.get("conditional_reorder") is False:  # a copy at every step
      assert out.num_reorders == out.num_steps
    else:
      assert out.num_reorders == reference.num_reorders


@pytest.mark.parametrize("candidate_pool", bs.CANDIDATE_POOLS)
@pytest.mark.parametrize("stop_check_every", [1, 3])
def test_shrinking_batch_changes_nothing(candidate_pool, stop_check_every):
  """A batch that shrinks as its sentences finish (16 -> 4 -> 1 sentences, their
  cache rows, pending reorders and maximum lengths moved down with them) gives every
  sentence, at its own place, the hypotheses, scores and log-probs of the whole batch run to
  the end, in as many steps, for every pool (`LOOP_TABLES`: the batch does shrink, fewer
  sentence-steps are decoded)."""
  options = dict(stop_check_every=stop_check_every)
  whole = loop_search(candidate_pool, **options)
  shrunk = loop_search(candidate_pool, shrink_batch=True, **options)
  for name in OUTPUT_FIELDS:
    np.testing.assert_array_equal(getattr(shrunk, name), getattr(whole, name), err_msg=name)
  assert whole.sentence_steps == len(LOOP_MAX_LENGTHS) * whole.num_steps
  assert shrunk.sentence_steps < whole.sentence_steps
  # The rows of the sentences that finished stay in the batch until it shrinks, so a smaller
  # batch reorders at no more steps than the whole one.
  assert shrunk.num_reorders <= whole.num_reorders


def test_shrinking_stops_at_the_device_multiple():
  """min_batch (the data-parallel device count) bounds the shrinking: each batch size a
  multiple of it, so every stage splits evenly over the devices."""
  assert beam_rows.shrink_sizes(32) == (32, 8, 2)
  assert beam_rows.shrink_sizes(128, min_batch=8) == (128, 32, 8)
  assert beam_rows.shrink_sizes(64, min_batch=8) == (64, 16)
  assert beam_rows.shrink_sizes(24, min_batch=8) == (24,)
  assert beam_rows.shrink_sizes(48, min_batch=3) == (48, 12, 3)
  assert beam_rows.shrink_sizes(1) == (1,)
  # The Translator's floor: no stage under 8 sentences (each is one more compilation).
  assert beam_rows.shrink_sizes(64, smallest=8) == (64, 16)
  assert beam_rows.shrink_sizes(128, min_batch=2, smallest=8) == (128, 32, 8)
  with pytest.raises(ValueError, match="does not split"):
    beam_rows.shrink_sizes(12, min_batch=8)
  tables = markov_tables(seeds=range(200, 216), order=2, eos_bias=-2.0)
  options = dict(alpha=0.6, max_lengths=[9, 1, 2, 1, 3, 2, 1, 2, 1, 1, 2, 3, 1, 2, 1, 2])
  whole = run_toy(tables, beam=2, max_len=9, **options)
  # On 2 devices: 16 -> 4 sentences (a batch of 1 would not split over them).
  floor = run_toy(tables, beam=2, max_len=9, shrink_batch=True, min_batch=2, **options)
  for name in OUTPUT_FIELDS:
    np.testing.assert_array_equal(getattr(floor, name), getattr(whole, name), err_msg=name)
  # Never fewer than 4 sentences a step: at least 4 * the steps, fewer than 16 * them.
  assert whole.num_steps > 3
  assert 4 * whole.num_steps <= floor.sentence_steps < whole.sentence_steps


def returned_hypotheses(out, b):
  """[(score, seq)] of sentence b's non-empty slots, in the order returned."""
  found = out.all_scores[b] > -np.inf
  seqs = [tuple(int(t) for t in seq if t != PAD_ID) for seq in out.all_sequences[b][found]]
  return list(zip(out.all_scores[b][found], seqs))


def check_against(out, b, expected):
  returned = returned_hypotheses(out, b)
  assert [seq for _, seq in returned] == [seq for _, seq in expected], b
  np.testing.assert_allclose(
    [score for score, _ in returned], [score for score, _ in expected], atol=1e-5, rtol=1e-5
  )


@pytest.mark.parametrize("beam, lenpen", [(2, 1.0), (2, 0.6), (3, 1.0)])
def test_fairseq_pool_follows_a_transcription_of_fairseq(beam, lenpen):
  """Every hypothesis "fairseq" returns, its order and its score are what the transcription
  of fairseq's SequenceGenerator returns, per-sentence length limits included."""
  tables, max_len, max_lengths = transcription_tables(), 5, TRANSCRIPTION_MAX_LENGTHS
  out = run_toy(
    tables,
    beam=beam,
    max_len=max_len,
    alpha=lenpen,
    max_lengths=max_lengths,
    length_penalty="power",
    candidate_pool="fairseq",
  )
  for b, (table, max_length) in enumerate(zip(tables, max_lengths)):
    check_against(out, b, fairseq_reference(table, beam, max_length, lenpen))


def test_fairseq_pool_differs_from_2beam_and_hf():
  """On the FAIRSEQ_SEEDS tables (within the transcription batch: its searches)."""
  tables = transcription_tables()
  best = {
    pool: run_toy(
      tables,
      beam=2,
      max_len=5,
      alpha=1.0,
      max_lengths=TRANSCRIPTION_MAX_LENGTHS,
      length_penalty="power",
      candidate_pool=pool,
    ).sequences
    for pool in ("fairseq", "2beam", "hf")
  }
  for b in range(5, 5 + len(FAIRSEQ_SEEDS)):
    table = tables[b]
    expected = padded(fairseq_reference(table, 2, 5, 1.0)[0][1], 5)
    np.testing.assert_array_equal(best["fairseq"][b], expected)
    assert not np.array_equal(best["2beam"][b], expected), b
    assert not np.array_equal(best["hf"][b], expected), b


def search_one(table, beam, pool, max_len=4, max_lengths=None):
  return run_toy(
    np.broadcast_to(table, (1 if max_lengths is None else len(max_lengths),) + table.shape),
    beam=beam,
    max_len=max_len,
    alpha=1.0,
    max_lengths=max_lengths,
    length_penalty="power",
    candidate_pool=pool,
  )


def test_fairseq_pool_never_ends_at_the_first_step():
  """min_len 1: EOS (p 0.9 first) is -inf at the first step, set after the log-softmax, so A
  keeps its log-prob log 0.1 (not log 1, as masking the logits would give)."""
  table = first_order_table({BOS_ID: {EOS_ID: 0.9, A: 0.1}, A: {EOS_ID: 1.0}})
  fairseq, hf = search_one(table, 2, "fairseq"), search_one(table, 2, "hf")
  np.testing.assert_array_equal(fairseq.sequences[0], padded((A, EOS_ID), 4))
  np.testing.assert_allclose(fairseq.scores[0], np.log(0.1) / 2, rtol=1e-6)
  np.testing.assert_array_equal(hf.sequences[0], padded((EOS_ID,), 4))


def test_fairseq_pool_ends_at_the_length_limit_with_eos():
  """EOS (p 0.05 after A) never ranks first, so the single beam reaches the length limit;
  there only EOS may come, and its log-prob counts: A A A EOS scores log(0.95^2 * 0.05) / 4.
  "hf" instead finishes A A A A there without EOS (log(0.95^3) / 4). Per-sentence limits: the
  second sentence stops at 3 tokens."""
  table = first_order_table({BOS_ID: {A: 1.0}, A: {A: 0.95, EOS_ID: 0.05}})
  for max_length, expected, score in (
    (4, [A, A, A, EOS_ID], np.log(0.95**2 * 0.05) / 4),
    (3, [A, A, EOS_ID, PAD_ID], np.log(0.95 * 0.05) / 3),
  ):
    fairseq = search_one(table, 1, "fairseq", max_lengths=[max_length])
    np.testing.assert_array_equal(fairseq.sequences[0], expected)
    np.testing.assert_allclose(fairseq.scores[0], score, rtol=1e-5)
  hf = search_one(table, 1, "hf", max_lengths=[4])
  np.testing.assert_array_equal(hf.sequences[0], [A, A, A, A])
  np.testing.assert_allclose(hf.scores[0], np.log(0.95**3) / 4, rtol=1e-5)


def test_fairseq_pool_keeps_the_first_finished_not_the_best():
  """One beam: A EOS (p 0.3, rank 0 at step 1) finishes first and fills the finished set, so
  fairseq stops there with log(0.3) / 2 = -0.60, though A B EOS (p 0.267, -0.44) scores
  better and is what "hf" and "2beam" return."""
  table = first_order_table(
    {BOS_ID: {A: 0.6, B: 0.4}, A: {EOS_ID: 0.5, B: 0.45, A: 0.05}, B: {EOS_ID: 0.99, A: 0.01}}
  )
  fairseq = search_one(table, 1, "fairseq")
  np.testing.assert_array_equal(fairseq.sequences[0], padded((A, EOS_ID), 4))
  np.testing.assert_allclose(fairseq.scores[0], np.log(0.3) / 2, rtol=1e-5)
  assert fairseq.num_steps == 2
  for pool in ("hf", "2beam"):
    out = search_one(table, 1, pool)
    np.testing.assert_array_equal(out.sequences[0], padded((A, B, EOS_ID), 4), err_msg=pool)
    np.testing.assert_allclose(out.scores[0], np.log(0.6 * 0.45 * 0.99) / 3, rtol=1e-5)

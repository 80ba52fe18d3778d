"""Beam search with the Transformer (`beam_decode.beam_decode`): scores against unbranched
decoding, per-sentence limits, 1 against 8 devices, the lazy cache reordering, the cache kept
in place, the shrinking batch and the cross-attention kept once per sentence against their
reference paths, and the decode options reaching the search. Beam 1 against greedy decoding is
in tests/test_decode.py; the search itself is checked against brute force on toy models in
tests/test_beam_search.py.

Every search here decodes the same 8 sources with beam 3 up to 20 tokens under per-sentence
limits (`search`, cached): each option is one more compiled program, and tests that compare an
option with the default share the default's.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, tiny_model_config

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import beam_decode as bd
from transformer_mt.decoding import beam_rows
from transformer_mt.decoding import beam_search as bs
from transformer_mt.decoding import incremental as decode

CONFIG = tiny_model_config()
BEAM, MAX_LEN = 3, 20
# Each pool with the penalty it is used with: the default's, and fairseq-generate's.
PENALTIES = {
  "beam": dict(length_penalty="gnmt", alpha=0.6),
  "fairseq": dict(length_penalty="power", alpha=1.0),
}


@functools.cache
def transformer_params():
  """helpers.init_params, jitted: one program instead of an eager op per initializer."""
  return jax.jit(init_params, static_argnums=0)(CONFIG)


def transformer_inputs():
  """Three sentences with padding and one empty row."""
  return jnp.array(
    [
      [5, 9, 12, 7, EOS_ID, PAD_ID],
      [11, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
      [PAD_ID] * 6,
      [6, 6, 8, 20, 33, EOS_ID],
    ],
    jnp.int32,
  )


def eight_sources():
  """int32 [8, 6]: the four rows of `transformer_inputs`, then the same reversed with each
  token id one higher: no two alike but the two empty rows (2 and 5)."""
  first = transformer_inputs()
  return jnp.concatenate([first, jnp.where(first > EOS_ID, first + 1, first)[::-1]])


# Per-sentence limits under MAX_LEN: the sentences end at different steps (the random model
# rarely emits EOS), so the batch shrinks (8 -> 2 sentences), and two run past the first
# 16-position chunk of the cache.
MAX_LENGTHS = (20, 2, 20, 5, 9, 20, 3, 17)


@functools.cache
def search(candidate_pool, **options):
  """beam_decode's outputs (NumPy) for the 8 sources with `options`, on one CPU device."""
  with jax.default_device(jax.devices("cpu")[0]):
    out = bd.beam_decode(
      transformer_params(),
      eight_sources(),
      CONFIG,
      beam_size=BEAM,
      max_len=MAX_LEN,
      max_lengths=jnp.array(MAX_LENGTHS, jnp.int32),
      candidate_pool=candidate_pool,
      **PENALTIES[candidate_pool],
      **options,
    )
    return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("candidate_pool", ["beam", "fairseq"])
def test_transformer_beam_scores_match_unbranched_decoding(candidate_pool):
  """Rescoring each returned hypothesis on its own (no beam reordering) gives its score.

  Checks that the cache rows (self-attention keys/values) follow their beams, with the
  default penalty ("gnmt") and with "power". "fairseq" masks after the log-softmax, so the
  rescored log-probs are the plain ones; its hypotheses all end with EOS, none at the first
  step; the "beam" pool's end with EOS or at the sentence's limit.
  """
  alpha, length_penalty = (
    PENALTIES[candidate_pool]["alpha"],
    PENALTIES[candidate_pool]["length_penalty"],
  )
  params, inputs, beam = transformer_params(), eight_sources(), BEAM
  out = search(candidate_pool)
  assert np.all(out.all_scores[:, :-1] >= out.all_scores[:, 1:])  # sorted; -inf last
  seqs = out.all_sequences.reshape(-1, MAX_LEN)  # [batch * beam, max_len]
  rows = np.repeat(np.asarray(inputs), beam, axis=0)
  cache = jax.jit(decode.init_cache, static_argnums=(2, 3))(params, rows, CONFIG, MAX_LEN)
  step = jax.jit(decode.decode_step, static_argnames="config")
  log_probs, fed = [], np.full(len(rows), BOS_ID, np.int32)
  for t in range(MAX_LEN):
    logits, cache = step(
      params,
      cache,
      jnp.asarray(rows != PAD_ID),
      jnp.asarray(fed),
      jnp.array(t, jnp.int32),
      config=CONFIG,
    )
    log_probs.append(
      np.asarray(jax.nn.log_softmax(decode.never_generated(logits)))[
        np.arange(len(rows)), seqs[:, t]
      ]
    )
    fed = seqs[:, t]
  log_probs = np.stack(log_probs, axis=1)  # [batch * beam, max_len]
  rescored = 0
  for i, seq in enumerate(seqs):
    b = i // beam
    if not np.isfinite(out.all_scores.reshape(-1)[i]):
      continue
    if not np.asarray(inputs[b]).any():  # an empty source row: the empty hypothesis, score 0
      assert np.all(seq == PAD_ID) and out.all_scores[b, i % beam] in (0.0, -np.inf)
      continue
    eos = np.flatnonzero(seq == EOS_ID)
    length = eos[0] + 1 if len(eos) else MAX_LENGTHS[b]
    if candidate_pool == "fairseq":
      assert len(eos) == 1 and eos[0] > 0, seq
    assert np.all(seq[length:] == PAD_ID), seq
    expected = log_probs[i, :length].sum() / bs.penalty(length, alpha, length_penalty)
    np.testing.assert_allclose(out.all_scores[b, i % beam], expected, atol=1e-4, rtol=1e-4)
    rescored += 1
  assert rescored >= 6 and np.all(np.isfinite(out.scores))  # every sentence's best rescored


def test_transformer_per_sentence_max_lengths():
  out = search("beam")
  assert np.all(np.isfinite(out.scores))
  for b, max_length in enumerate(MAX_LENGTHS):
    assert np.all(out.all_sequences[b, :, max_length:] == PAD_ID), b
  assert np.all(out.sequences[1, :2] != PAD_ID)  # forced finish at exactly 2 tokens
  # Empty sources: empty outputs whatever max_lengths says.
  assert np.all(out.sequences[[2, 5]] == PAD_ID)


def test_same_outputs_on_1_and_8_devices(cpu_devices):
  """Beam search sharded over an 8-device mesh (batch split over devices) equals 1 device
  (CPU devices both: a GPU's kernels would round otherwise)."""
  import ml_collections

  from transformer_mt.runtime import sharding

  single = search("beam")
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}), cpu_devices
  )
  with jax.set_mesh(mesh):
    inputs, max_lengths = sharding.global_batch_from_host(
      (np.asarray(eight_sources()), np.array(MAX_LENGTHS, np.int32)), mesh
    )
    sharded = bd.beam_decode(
      jax.device_put(transformer_params(), sharding.replicated(mesh)),
      inputs,
      CONFIG,
      beam_size=BEAM,
      max_len=MAX_LEN,
      max_lengths=max_lengths,
      candidate_pool="beam",
      **PENALTIES["beam"],
    )
  np.testing.assert_array_equal(np.asarray(sharded.sequences), single.sequences)
  np.testing.assert_allclose(np.asarray(sharded.scores), single.scores, atol=1e-5)


def test_transformer_lazy_reordering_equals_always_gather():
  """beam_decode (cross-attention keys/values never reordered, self-attention positions
  copied only up to those written, no copy when no beam changed parent) is bit-identical
  to reordering the whole cache at every step. max_len 20 spans two 16-position chunks."""
  out, reference = search("beam"), search("beam", always_gather=True)
  assert out.num_steps > 16  # the second chunk was reordered too
  for name in ("sequences", "scores", "all_sequences", "all_scores", "num_steps"):
    np.testing.assert_array_equal(getattr(out, name), getattr(reference, name), err_msg=name)


@pytest.mark.parametrize("candidate_pool", ["beam", "fairseq"])
def test_accelerator_options_give_the_default_outputs(candidate_pool):
  """cache_reorder="gather" (every self-attention leaf taken whole at every step, no cond, no
  chunk loop) with stop_check_every=3 (the stopping condition read every 3 steps, the last
  iteration running past the end) returns what the default (chunked copy, a check per step)
  returns, bit for bit, for a pool of beam_size candidates ("beam") and one of 2 * beam_size
  with a finished set of its own ("fairseq"; "2beam" and "hf" rank as it does); the searches
  run past the first 16-position chunk. (One program for both options: each is also checked
  alone, for every pool, on the toy models of test_beam_search.py, which compile in a
  fraction of the time.)"""
  reference = search(candidate_pool)
  assert reference.num_steps > 16 and reference.num_steps % 3 != 0
  out = search(candidate_pool, cache_reorder="gather", stop_check_every=3)
  for name in ("sequences", "scores", "all_sequences", "all_scores", "all_log_probs"):
    np.testing.assert_array_equal(getattr(out, name), getattr(reference, name), err_msg=name)
  # The same steps, each one with a copy.
  assert out.num_steps == out.num_reorders == reference.num_steps


@pytest.mark.parametrize("candidate_pool", ["beam", "fairseq"])
def test_shrinking_batch_gives_the_whole_batch_outputs(candidate_pool):
  """beam_decode's shrinking batch (the default: 8 -> 2 sentences here, the cross-attention
  keys/values and source masks moved with their sentences) returns what the whole batch run
  to the end returns, bit for bit: the Transformer's rows are computed independently,
  whatever the batch. The empty rows are done at once and the maximum lengths differ, so the
  batch does shrink."""
  whole, shrunk = search(candidate_pool, shrink_batch=False), search(candidate_pool)
  for name in ("sequences", "scores", "all_sequences", "all_scores", "all_log_probs", "num_steps"):
    np.testing.assert_array_equal(getattr(shrunk, name), getattr(whole, name), err_msg=name)
  assert whole.sentence_steps == 8 * whole.num_steps > shrunk.sentence_steps


def test_cross_keys_kept_untransposed_give_the_default_outputs():
  """TransformerConfig.cross_keys_transposed=False (the cross-attention keys cached as the
  values are, [batch, heads, src_len, head_dim]: the device run's comparison) gives the
  default's hypotheses, scores to float32 rounding (another order of the same products); the
  keys taken in the wrong layout would attend over head_dim positions and fail to trace."""
  reference = search("beam", shrink_batch=False)
  with jax.default_device(jax.devices("cpu")[0]):
    out = bd.beam_decode(
      transformer_params(),
      eight_sources(),
      CONFIG.replace(cross_keys_transposed=False),
      beam_size=BEAM,
      max_len=MAX_LEN,
      max_lengths=jnp.array(MAX_LENGTHS, jnp.int32),
      shrink_batch=False,
      **PENALTIES["beam"],
    )
  for name in ("sequences", "all_sequences", "num_steps"):
    np.testing.assert_array_equal(getattr(out, name), getattr(reference, name), err_msg=name)
  for name in ("scores", "all_scores", "all_log_probs"):
    np.testing.assert_allclose(
      getattr(out, name), getattr(reference, name), rtol=1e-5, atol=1e-5, err_msg=name
    )


def test_auto_cache_reorder_is_the_default_program_on_cpu():
  """decode.cache_reorder="auto" on this CPU: the chunked copy below ANCESTRY_FROM_BATCH
  sentences (the very program of beam_decode's default), the cache kept in place from there
  (the other platforms' "gather" is checked by `beam_rows.resolve_cache_reorder`)."""
  params, small = transformer_params(), transformer_inputs()
  large = jnp.tile(small, (beam_rows.ANCESTRY_FROM_BATCH // small.shape[0], 1))

  def lowered(inputs, **options):
    return bd.beam_decode.lower(params, inputs, CONFIG, beam_size=3, max_len=8, **options)

  assert lowered(small, cache_reorder="auto").as_text() == lowered(small).as_text()
  assert lowered(small, cache_reorder="gather").as_text() != lowered(small).as_text()
  assert (
    lowered(large, cache_reorder="auto").as_text()
    == lowered(large, cache_reorder="ancestry").as_text()
    != lowered(large).as_text()
  )
  assert beam_rows.resolve_cache_reorder("auto", "gpu") == beam_rows.resolve_cache_reorder(
    "auto", "tpu"
  )
  assert beam_rows.resolve_cache_reorder("auto", "tpu", 64) == "gather"
  assert beam_rows.resolve_cache_reorder("auto", "cpu") == "ancestry"
  assert beam_rows.resolve_cache_reorder("auto", "cpu", beam_rows.ANCESTRY_FROM_BATCH - 1) == (
    "chunked"
  )


@pytest.mark.parametrize("candidate_pool", ["beam", "fairseq"])
def test_a_cache_kept_in_place_gives_the_reordered_outputs(candidate_pool):
  """cache_reorder="ancestry" (keys/values never moved, each beam attending to its ancestors'
  through a mask) returns the hypotheses of the reordered cache, with scores and log-probs equal to
  float32 rounding (the masked sums run over more terms: not bit for bit), for both candidate
  widths (the cache sees only the parents a pool picks; "2beam" and "hf" pick from 2 * beam_size
  as "fairseq" does, and test_beam_search.py checks every pool's parents), in a batch that
  shrinks (8 -> 2 sentences: the per-sentence cache moves by sentence) and in one that does
  not, and with a cache that grows (5, 10, then 20 positions, forced here: these small layers
  would keep one size) in a batch that shrinks; the searches run past the first 16 positions
  with beams changing parents. A wrong ancestry (a slot, a parent or a position off) or a sentence
  given another's cache changes the attention and with it the log-probs by far more than rounding:
  the 8 sources differ (the second four are the first, reversed, each token id one higher)."""
  reference = search(candidate_pool, shrink_batch=False)  # the chunked copy, the default
  assert reference.num_steps > 16 and reference.num_reorders > 1
  for shrink_batch, grow_from in ((True, None), (False, None), (True, 0)):
    kept = search(
      candidate_pool,
      cache_reorder="ancestry",
      shrink_batch=shrink_batch,
      grow_cache_from_bytes=grow_from,
    )
    for name in ("sequences", "all_sequences", "num_steps"):
      np.testing.assert_array_equal(getattr(kept, name), getattr(reference, name), err_msg=name)
    for name in ("scores", "all_scores", "all_log_probs"):
      np.testing.assert_allclose(
        getattr(kept, name), getattr(reference, name), rtol=1e-5, atol=1e-5, err_msg=name
      )


def test_decode_options_reach_beam_decode(monkeypatch):
  """An experiment's decode.length_penalty / candidate_pool / cache_reorder /
  stop_check_every / shrink_batch go through `settings.decode_settings` and the Translator to
  beam_decode's static arguments ("auto" resolved by the mesh's platform and the batch: this
  CPU's "chunked" for a batch of 2; min_batch the mesh's device count, no stage under
  SMALLEST_SHRUNK_BATCH); configs without them keep the defaults, and an unknown value is
  refused when settings are read."""
  import ml_collections

  from transformer_mt.config import defaults
  from transformer_mt.decoding import translator as translate
  from transformer_mt.decoding.settings import decode_settings
  from transformer_mt.runtime import sharding

  section = dict(batch_size=2, max_len=8, beam_size=3, alpha=1.0)
  old = decode_settings(defaults.complete(ml_collections.ConfigDict({"decode": section})))
  assert (old["length_penalty"], old["candidate_pool"]) == ("gnmt", "beam")
  assert (old["cache_reorder"], old["stop_check_every"], old["shrink_batch"]) == (
    "auto",
    1,
    True,
  )
  chosen = dict(length_penalty="power", candidate_pool="hf", cache_reorder="auto")
  config = defaults.complete(
    ml_collections.ConfigDict(
      {"decode": dict(section, **chosen, stop_check_every=4, shrink_batch=False)}
    )
  )
  settings = decode_settings(config)
  for bad, message in (
    (dict(candidate_pool="top"), r"decode.candidate_pool='top'.*beam, 2beam, hf, fairseq"),
    (dict(cache_reorder="fast"), r"decode.cache_reorder='fast'.*chunked, gather, ancestry, auto"),
    (dict(stop_check_every=0), r"decode.stop_check_every=0: expected"),
  ):
    with pytest.raises(ValueError, match=message):
      decode_settings(defaults.complete(ml_collections.ConfigDict({"decode": {**section, **bad}})))

  calls = []

  def fake_beam_decode(params, inputs, config, beam_size, max_len, *args, **kwargs):
    calls.append(dict(beam_size=beam_size, **kwargs))
    return types.SimpleNamespace(sequences=jnp.zeros((inputs.shape[0], max_len), jnp.int32))

  monkeypatch.setattr(bd, "beam_decode", fake_beam_decode)
  mesh = sharding.make_mesh(sharding.inference_mesh_config(), devices=jax.devices()[:1])
  translator = translate.Translator(
    params=None, model_config=CONFIG, tokenizer=None, mesh=mesh, **settings
  )
  translator._decode_batch([[5, 9, EOS_ID]])
  assert calls == [
    dict(
      beam_size=3,
      forced_first_id=None,
      length_penalty="power",
      candidate_pool="hf",
      cache_reorder="chunked",
      stop_check_every=4,
      shrink_batch=False,
      min_batch=1,
      smallest_batch=translate.SMALLEST_SHRUNK_BATCH,
    )
  ]


def test_imported_models_decode_as_generate():
  """hf_import.run_config: beam and alpha from the generation config (transformers' own
  default length_penalty 1.0 when it has none), with the "hf" pool and "power" penalty."""
  from transformer_mt.decoding.settings import decode_settings
  from transformer_mt.interop import hf_import

  def decode_section(generation):
    tokenizer = type("Tokenizer", (), {"vocab_size": CONFIG.vocab_size})()
    config = hf_import.run_config(
      CONFIG, tokenizer, {"model_type": "marian"}, generation, {}, "tiny", from_hub=False
    )
    return decode_settings(config)

  settings = decode_section({"num_beams": 4, "length_penalty": 0.6, "max_length": 64})
  assert (settings["beam_size"], settings["alpha"]) == (4, 0.6)
  assert (settings["length_penalty"], settings["candidate_pool"]) == ("power", "hf")
  settings = decode_section({})
  assert (settings["beam_size"], settings["alpha"]) == (1, 1.0)


def test_cross_attention_once_per_sentence_equals_a_copy_per_beam():
  """beam_decode keeps the cross-attention keys/values one row per sentence and folds the
  beams into the query axis; copying them to every beam (as before) gives the same
  hypotheses, and scores equal up to float rounding (the products are summed in another
  order)."""
  params, inputs, max_len, beam = transformer_params(), eight_sources(), MAX_LEN, BEAM
  batch = inputs.shape[0]
  out = search("beam")
  cache = jax.jit(decode.init_cache, static_argnums=(2, 3))(params, inputs, CONFIG, max_len)
  cache, cross = decode.split_cache(cache)
  cross = beam_rows.expand_to_beams(cross, batch, beam)  # [batch * beam, heads, src_len, head_dim]
  valid = jnp.repeat(inputs != PAD_ID, beam, axis=0)

  def tokens_to_logits(tokens, position, cache):
    logits, cache = decode.decode_step(
      params, decode.merge_cache(cache, cross), valid, tokens, position, CONFIG
    )
    return decode.never_generated(logits), decode.split_cache(cache)[0]

  max_lengths = jnp.where(jnp.any(inputs != PAD_ID, axis=1), jnp.array(MAX_LENGTHS), 0)
  copied = jax.jit(
    lambda cache: bs.beam_search(
      tokens_to_logits, cache, batch, beam, max_len, max_lengths=max_lengths, **PENALTIES["beam"]
    )
  )(cache)
  np.testing.assert_array_equal(out.all_sequences, copied.all_sequences)
  np.testing.assert_allclose(out.all_scores, copied.all_scores, rtol=1e-5, atol=1e-6)

"""Beam search with the Transformer (`beam_decode.beam_decode`): beam 1 against greedy decoding,
scores against unbranched decoding, per-sentence limits, 1 against 8 devices, the lazy cache
reordering and the cross-attention kept once per sentence against their reference paths, and
the decode options reaching the search. The search itself is checked against brute force on
toy models in tests/test_beam_search.py.
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


@functools.cache
def transformer_params():
  return init_params(CONFIG)


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


@pytest.mark.parametrize("alpha, length_penalty", [(0.6, "gnmt"), (1.0, "power")])
def test_beam_one_is_greedy(alpha, length_penalty):
  """With the "beam" pool (the default), whatever the penalty: one finished hypothesis."""
  params, inputs, max_len = transformer_params(), transformer_inputs(), 8
  greedy = np.asarray(decode.greedy_decode(params, inputs, CONFIG, max_len))
  out = bd.beam_decode(
    params, inputs, CONFIG, beam_size=1, max_len=max_len, alpha=alpha, length_penalty=length_penalty
  )
  np.testing.assert_array_equal(np.asarray(out.sequences), greedy)
  np.testing.assert_array_equal(np.asarray(out.all_sequences[:, 0]), greedy)
  assert np.all(greedy[2] == PAD_ID) and float(out.scores[2]) == 0.0


@pytest.mark.parametrize(
  "length_penalty, candidate_pool, alpha", [("gnmt", "beam", 0.6), ("power", "fairseq", 1.0)]
)
def test_transformer_beam_scores_match_unbranched_decoding(length_penalty, candidate_pool, alpha):
  """Rescoring each returned hypothesis on its own (no beam reordering) gives its score.

  Checks that the cache rows (self-attention keys/values) follow their beams. "fairseq"
  masks after the log-softmax, so the rescored log-probs are the plain ones; its hypotheses
  all end with EOS, none at the first step.
  """
  params, inputs, max_len, beam = transformer_params(), transformer_inputs(), 6, 3
  out = jax.tree.map(
    np.asarray,
    bd.beam_decode(
      params,
      inputs,
      CONFIG,
      beam_size=beam,
      max_len=max_len,
      alpha=alpha,
      length_penalty=length_penalty,
      candidate_pool=candidate_pool,
    ),
  )
  assert np.all(out.all_scores[:, :-1] >= out.all_scores[:, 1:])  # sorted; -inf last
  seqs = out.all_sequences.reshape(-1, max_len)  # [batch * beam, max_len]
  rows = np.repeat(np.asarray(inputs), beam, axis=0)
  cache = decode.init_cache(params, jnp.asarray(rows), CONFIG, max_len)
  step = jax.jit(decode.decode_step, static_argnames="config")
  log_probs, fed = [], np.full(len(rows), BOS_ID, np.int32)
  for t in range(max_len):
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
  for i, seq in enumerate(seqs):
    b = i // beam
    if not np.isfinite(out.all_scores.reshape(-1)[i]):
      continue
    if b == 2:  # the empty source row: the empty hypothesis, score 0
      assert np.all(seq == PAD_ID) and out.all_scores[b, i % beam] in (0.0, -np.inf)
      continue
    eos = np.flatnonzero(seq == EOS_ID)
    length = eos[0] + 1 if len(eos) else max_len
    if candidate_pool == "fairseq":
      assert len(eos) == 1 and eos[0] > 0, seq
    expected = log_probs[i, :length].sum() / bs.penalty(length, alpha, length_penalty)
    np.testing.assert_allclose(out.all_scores[b, i % beam], expected, atol=1e-4, rtol=1e-4)


def test_transformer_per_sentence_max_lengths():
  params, inputs, max_len = transformer_params(), transformer_inputs(), 8
  max_lengths = jnp.array([3, 8, 8, 1], jnp.int32)
  out = jax.tree.map(
    np.asarray,
    bd.beam_decode(params, inputs, CONFIG, beam_size=2, max_len=max_len, max_lengths=max_lengths),
  )
  assert np.all(np.isfinite(out.scores))
  assert np.all(out.all_sequences[0, :, 3:] == PAD_ID)
  assert np.all(out.all_sequences[3, :, 1:] == PAD_ID)
  assert np.all(out.sequences[2] == PAD_ID)  # empty source: empty output whatever max_lengths says


def test_same_outputs_on_1_and_8_devices(cpu_devices):
  """Beam search sharded over an 8-device mesh (batch split over devices) equals 1 device
  (CPU devices both: a GPU's kernels would round otherwise)."""
  import ml_collections

  from transformer_mt.runtime import sharding

  with jax.default_device(cpu_devices[0]):
    params, max_len = transformer_params(), 8
    inputs = jnp.concatenate([transformer_inputs(), transformer_inputs()[::-1]])  # 8 rows
    single = bd.beam_decode(params, inputs, CONFIG, beam_size=3, max_len=max_len)
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}), cpu_devices
  )
  with jax.set_mesh(mesh):
    sharded_inputs = jax.device_put(inputs, sharding.batch_sharding(mesh))
    sharded_params = jax.device_put(params, sharding.replicated(mesh))
    sharded = bd.beam_decode(sharded_params, sharded_inputs, CONFIG, beam_size=3, max_len=max_len)
  np.testing.assert_array_equal(np.asarray(sharded.sequences), np.asarray(single.sequences))
  np.testing.assert_allclose(np.asarray(sharded.scores), np.asarray(single.scores), atol=1e-5)


def test_transformer_lazy_reordering_equals_always_gather():
  """beam_decode (cross-attention keys/values never reordered, self-attention positions
  copied only up to those written, no copy when no beam changed parent) is bit-identical
  to reordering the whole cache at every step. max_len 20 spans two 16-position chunks."""
  params, inputs, max_len = transformer_params(), transformer_inputs(), 20
  max_lengths = jnp.array([20, 17, 20, 19], jnp.int32)
  out, reference = (
    jax.tree.map(
      np.asarray,
      bd.beam_decode(
        params,
        inputs,
        CONFIG,
        beam_size=3,
        max_len=max_len,
        max_lengths=max_lengths,
        always_gather=always_gather,
      ),
    )
    for always_gather in (False, True)
  )
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
  params, inputs, max_len = transformer_params(), transformer_inputs(), 20
  max_lengths = jnp.array([20, 17, 20, 19], jnp.int32)

  def search(**options):
    return bd.beam_decode(
      params,
      inputs,
      CONFIG,
      beam_size=3,
      max_len=max_len,
      max_lengths=max_lengths,
      candidate_pool=candidate_pool,
      **options,
    )

  reference = jax.tree.map(np.asarray, search())
  assert reference.num_steps > 16 and reference.num_steps % 3 != 0
  out = jax.tree.map(np.asarray, search(cache_reorder="gather", stop_check_every=3))
  for name in ("sequences", "scores", "all_sequences", "all_scores", "all_log_probs"):
    np.testing.assert_array_equal(getattr(out, name), getattr(reference, name), err_msg=name)
  # The same steps, each one with a copy.
  assert out.num_steps == out.num_reorders == reference.num_steps


@pytest.mark.parametrize("candidate_pool", ["beam", "fairseq"])
def test_shrinking_batch_gives_the_whole_batch_outputs(candidate_pool):
  """beam_decode's shrinking batch (the default: 8 -> 2 -> 1 sentences here, the
  cross-attention keys/values and source masks moved with their sentences) returns what the
  whole batch run to the end returns, bit for bit: the Transformer's rows are computed
  independently, whatever the batch. The empty rows are done at once and the maximum lengths
  differ, so the batch does shrink."""
  params, max_len = transformer_params(), 20
  inputs = jnp.concatenate([transformer_inputs(), transformer_inputs()[::-1]])  # 8 rows
  max_lengths = jnp.array([20, 2, 20, 5, 9, 20, 3, 17], jnp.int32)

  def search(**options):
    return jax.tree.map(
      np.asarray,
      bd.beam_decode(
        params,
        inputs,
        CONFIG,
        beam_size=3,
        max_len=max_len,
        max_lengths=max_lengths,
        candidate_pool=candidate_pool,
        **options,
      ),
    )

  whole, shrunk = search(shrink_batch=False), search()
  for name in ("sequences", "scores", "all_sequences", "all_scores", "all_log_probs", "num_steps"):
    np.testing.assert_array_equal(getattr(shrunk, name), getattr(whole, name), err_msg=name)
  assert whole.sentence_steps == 8 * whole.num_steps > shrunk.sentence_steps


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
  shrinks (8 -> 2 -> 1 sentences: the per-sentence cache moves by sentence) and in one that does
  not, and with a cache that grows (5, 10, then 20 positions, forced here: these small layers
  would keep one size) in a batch that shrinks; the searches run past the first 16 positions
  with beams changing parents. A wrong ancestry (a slot, a parent or a position off) or a sentence
  given another's cache changes the attention and with it the log-probs by far more than rounding:
  the 8 sources differ (the second four are the first, reversed, each token id one higher)."""
  params, max_len = transformer_params(), 20
  first = transformer_inputs()
  second = jnp.where(first > EOS_ID, first + 1, first)[::-1]
  inputs = jnp.concatenate([first, second])  # 8 rows, no two alike but the empty ones
  max_lengths = jnp.array([20, 2, 20, 5, 9, 20, 3, 17], jnp.int32)

  def search(**options):
    out = bd.beam_decode(
      params,
      inputs,
      CONFIG,
      beam_size=3,
      max_len=max_len,
      max_lengths=max_lengths,
      candidate_pool=candidate_pool,
      **options,
    )
    return jax.tree.map(np.asarray, out)

  reference = search(cache_reorder="chunked", shrink_batch=False)
  assert reference.num_steps > 16 and reference.num_reorders > 1
  for shrink_batch, grow_from in ((True, None), (False, None), (True, 0)):
    kept = search(
      cache_reorder="ancestry", shrink_batch=shrink_batch, grow_cache_from_bytes=grow_from
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
  params, inputs, max_len, beam = transformer_params(), transformer_inputs(), 12, 3
  batch = inputs.shape[0]
  out = bd.beam_decode(params, inputs, CONFIG, beam_size=beam, max_len=max_len)
  cache, cross = decode.split_cache(decode.init_cache(params, inputs, CONFIG, max_len))
  cross = beam_rows.expand_to_beams(cross, batch, beam)  # [batch * beam, heads, src_len, head_dim]
  valid = jnp.repeat(inputs != PAD_ID, beam, axis=0)

  def tokens_to_logits(tokens, position, cache):
    logits, cache = decode.decode_step(
      params, decode.merge_cache(cache, cross), valid, tokens, position, CONFIG
    )
    return decode.never_generated(logits), decode.split_cache(cache)[0]

  max_lengths = jnp.where(jnp.any(inputs != PAD_ID, axis=1), max_len, 0)
  copied = jax.jit(
    lambda cache: bs.beam_search(
      tokens_to_logits, cache, batch, beam, max_len, max_lengths=max_lengths
    )
  )(cache)
  np.testing.assert_array_equal(out.all_sequences, copied.all_sequences)
  np.testing.assert_allclose(out.all_scores, copied.all_scores, rtol=1e-5, atol=1e-6)

"""Jitted beam search (GNMT, transformers or fairseq rules) over any incremental step function.

`beam_search` only needs a step function `tokens_to_logits(tokens, position, cache)`,
so it can be checked against brute-force enumeration on a toy model whose next-token
distribution is known; `beam_decode.beam_decode` (decoding/beam_decode.py) plugs in the
Transformer (`decode.init_cache` + `decode.decode_step`, where `decode` is
decoding/incremental.py).

Design choices (each is tested in tests/test_beam_search.py, with the Transformer in
tests/test_beam_decode.py):

* Candidate pool (`candidate_pool`), ranked by summed log-prob at every step:
  - "beam" (default): keep the `beam_size` best one-token extensions of the live beams.
    Those that end (EOS, or the max length below) move to the finished set and leave a
    dead slot (log-prob -inf) in the live beam until the next step refills it. With
    beam_size 1 this is exactly greedy decoding: the single candidate is the argmax
    (barring two logits that tie once shifted by the log-normalizer and the prefix
    log-prob in float32), and if it is EOS the search ends there. Pick it for our own
    models: the cheapest pool, and beam 1 == greedy.
  - "2beam" (tensor2tensor, t5x, flax examples/wmt): rank the 2 * beam_size best; every
    ending one among them may enter the finished set, and the live beams are the
    beam_size best that do not end, so no slot is wasted on a finished hypothesis. A
    single beam then also keeps the best non-EOS continuation alive and may return a
    longer hypothesis than greedy. Pick it to compare with those codebases.
  - "hf" (transformers' `generate`, `_beam_search`): rank the 2 * beam_size best; only
    those ranked within the first beam_size that end may finish (an EOS ranked below is
    dropped, neither finished nor live); the live beams are the beam_size best among the
    2 * beam_size that do not end. At the max length every candidate ends, so the
    beam_size best finish. Pick it (with "power") to reproduce an imported model's
    Hugging Face translations token for token (tests/test_hf_beam.py).
  - "fairseq" (fairseq's SequenceGenerator as fairseq-generate runs it by default: min_len
    1, max_len_a 0, normalize_scores): the "hf" ranking, with fairseq's length rules and
    finished set. EOS may not come first (min_len 1); at a sentence's maximum length only
    EOS may come, so every hypothesis ends with a real EOS whose log-prob counts (no forced
    finish; fairseq's max_len_b is our maximum length - 1, as it counts tokens before
    EOS). The finished set holds the first beam_size hypotheses to finish, in step order
    and, within a step, in rank order, and a sentence is done once it holds beam_size
    (fairseq's finalize_hypos and is_finished), not the best beam_size under the bound of
    "Early stopping" below; the set is sorted by score at the end, ties in finish order
    (Python's stable sort). Pick it (with "power", alpha = fairseq's lenpen) to decode as a
    fairseq-trained recipe was (transformer_tiny_multi30k_ende). Not reproduced: fairseq
    sets PAD to -inf after log-softmax and never masks BOS, where we mask both before it
    (a trained model gives them almost no mass); and a sentence whose maximum length is 1
    may end with EOS at once, where fairseq's min_len would leave it nothing. fairseq's
    "blacklist" (EOS candidates kept as live beams when more than beam_size of the 2 *
    beam_size end) never arises in its beam search: each live beam has one EOS candidate,
    so at most beam_size of them end, and the first beam_size that do not end are live.
* Length. `len` counts the generated tokens including EOS (BOS excluded), so "a b EOS"
  has len 3; the finished hypothesis' summed log-prob is divided by lp(len), with
  `length_penalty` "gnmt" (default; Wu et al., 2016): lp = ((5 + len) / 6) ** alpha, or
  "power" (transformers' `length_penalty`, which divides by (cur_len + 1 -
  decoder_prompt_len) ** length_penalty: the same len): lp = len ** alpha. alpha = 0
  scores by log-prob alone in both.
* Maximum length. A hypothesis that reaches its sentence's maximum length
  (`max_lengths[b]`, at most `max_len`) without EOS is finished there (forced finish),
  scored like an EOS-terminated one of that length, and returned without EOS. With
  "2beam" all 2 * beam_size candidates may finish there; with "hf" the beam_size best,
  as under transformers' max-length stopping criterion. So every sentence ends with at
  least one hypothesis, and beam 1 reproduces greedy decoding, which also returns
  `max_len` tokens without EOS in that case. A sentence whose maximum length is 0 gets
  the empty hypothesis (all PAD) with score 0. "fairseq" has no forced finish: at the
  maximum length only EOS may come (above).
* Early stopping. A sentence is done when no live beam can beat the worst of its
  `beam_size` best finished hypotheses (-inf while fewer have finished). Log-probs only
  fall as a hypothesis grows and are <= 0, so a live beam with log-prob p can at best
  finish with p / max lp(L) over the lengths L it can still reach (both penalties grow
  with L for alpha >= 0 and fall for alpha < 0): for alpha >= 0 that is
  p / lp(max_lengths[b]); for alpha < 0 it is p / lp(len + 1). The loop stops when
  every sentence is done or at `max_len`. Stopping changes no result: later finished
  hypotheses score <= the bound, and ties keep the hypothesis that finished first.
  "fairseq" stops a sentence once beam_size hypotheses have finished instead, which may
  leave out a later one that would score better: fairseq's results, not the best.
* Cache reordering. When beam k of a sentence extends another beam, its cache rows must
  be replaced by its parent's. Copying the whole cache after every step would take a third
  to a half of the step's time on CPU (benchmarks/decode.py), so the copy is made at the
  start of the next step (XLA then updates the cache in place), skipped (lax.cond) when
  every beam of every sentence extends itself, and `gather_cache` lets the caller copy
  less: beam_decode copies only the self-attention positions written so far and keeps
  the cross-attention keys/values, equal across beams, out of the reordered cache (one
  row per sentence, never copied per beam: the beams of a sentence attend to them as one
  block of queries, `decode_cache.decode_attention`). None of this changes a value, so
  results are bit-identical to gathering the whole self-attention cache after every step
  (`always_gather=True`, the reference path).
* Cache kept in place (`cache_reorder="ancestry"`, beam_decode's CPU choice from 8 sentences
  a batch). The copy above still moves the written positions at almost every step (~40 ms of
  a ~150 ms step for the Base shape at 32 sentences on 2 CPU cores, memory-bound). Here the
  keys/values are never moved: a sentence's cache is one block, [batch, heads, max_len *
  beam, head_dim] (keys transposed), where entry t * beam + j is what the hypothesis in slot j
  wrote at step t; a small int32 leaf [batch * beam, max_len] (`decode_cache.ANCESTRY`) records
  for each row the slot of its prefix at each step, and that leaf is what the reorder moves
  (`decode.gather_ancestry`, at every step). Each row attends to its sentence's max_len *
  beam entries with a mask that keeps its ancestors' (`decode_cache._append_in_place`),
  so the product reads each cached entry once per sentence for its beam queries, as the
  cross-attention does. The same keys, values and weights enter as with a reordered cache,
  but the sums run over more (masked, zero) terms through other kernels: scores differ in the
  last float32 bits (~1e-6), and a hypothesis may differ only where two tie to that
  precision (tests/test_beam_decode.py compares them). beam_search moves these leaves by
  sentence when the batch shrinks (`per_sentence_cache`). Slower for a batch of one sentence
  (0.92x for the Base shape), where "auto" keeps the chunked copy; beam 1 never uses it.
* On an accelerator. Every step of the loop above holds three data-dependent control
  decisions: the while_loop's condition, the lax.cond of the reorder and the chunked copy's
  fori_loop, whose trip count is the positions written; on a GPU each may cost a round trip
  to the host. `beam_decode(cache_reorder=...)` picks the copy: "chunked" (the CPU path
  above, the default), "gather" (every self-attention leaf taken whole at every step,
  `decode.gather_all_rows`: no cond, no inner loop, more bytes moved) or "auto" (chunked on
  CPU, gather on GPU/TPU). `stop_check_every` = k > 1 runs k steps per while_loop iteration,
  so the stopping condition is read once every k steps; a step taken after the search is
  done (or at the maximum length) leaves the result as it was (`_steps_while_searching`).
  All choices give bit-identical hypotheses, scores and step counts
  (tests/test_beam_search.py, tests/test_beam_decode.py); which is faster on a GPU is for
  the device run (benchmarks/accelerator.py) to measure.
* Shrinking batch (`shrink_batch`, beam_decode's default). A batch's sentences end at
  different steps, and a compiled loop of fixed shapes would decode every one of them until
  the last ends. CTranslate2 drops a finished sentence from its batch at once (its shapes
  change every step); here the loop is traced once for each of a few batch sizes
  (`beam_rows.shrink_sizes`: a quarter of the size before, down to the data-parallel device
  count), and runs in each until at most the next size's sentences are still searching; then
  the rows of those (done ones fill the rest) move to the front of the smaller batch, with
  their cache rows, pending reorder, maximum lengths and per-sentence `context` (the source
  mask and cross-attention keys/values), and the others' results are written at their places
  in the caller's batch (`beam_rows.shrunk`, `beam_rows.with_results_of`). The decoder's
  rows are computed independently of each other, so every sentence gets the hypotheses and
  scores of the whole batch run to the end, bit for bit; only `num_reorders` (a step reorders
  when any row present needs it) and `sentence_steps` (the work done) change. It saves the
  decoder work of the sentences already done, so large batches of mixed lengths gain most;
  each size is one more compiled copy of the step (docs/performance.md).
* Growing cache (`cache_positions`; beam_decode's `grow_cache_from_bytes`). A step attends to
  every position its self-attention cache holds (the unwritten ones masked), so a cache of max_len
  positions is read whole at every step, though a hypothesis at step t has written t of them. For
  a large cache those reads weigh (the Base shape at 32 sentences, beam 4: 33 MB a layer, the two
  attention products ~23 of ~100 ms a step on 2 cores). Kept in place ("ancestry"), it then starts
  at a quarter of max_len positions and grows to a half, then to all: the first batch size runs
  one loop per size, until the step reaches it, and the cache is padded once between them (the
  positions written stay where they are, `decode.grow_beams_cache`). The same hypotheses, scores
  to float32 rounding (fewer masked terms in each sum); each size is one more compiled copy of the
  step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import beam_rows, vocab_top_k
from transformer_mt.decoding.fairseq_rules import (
  fairseq_length_rules,
  first_finished,
  sorted_by_score,
)
from transformer_mt.runtime import errors

# tokens int32 [batch * beam], position int32 [], cache -> (logits [batch * beam, vocab], cache);
# with a per-sentence `context` (beam_search's argument), (tokens, position, cache, context).
TokensToLogits = Callable[..., tuple[jax.Array, Any]]
GatherCache = beam_rows.GatherCache

NEG_INF = -jnp.inf

LENGTH_PENALTIES = ("gnmt", "power")
CANDIDATE_POOLS = ("beam", "2beam", "hf", "fairseq")


def penalty(length: jax.Array, alpha: float, kind: str = "gnmt") -> jax.Array:
  """lp(len), float32, same shape as `length`: what a finished hypothesis' log-prob is divided by.

  "gnmt" (Wu et al., 2016): ((5 + len) / 6) ** alpha. "power" (transformers'
  `length_penalty`): len ** alpha.
  """
  length = jnp.asarray(length, jnp.float32)
  if kind == "power":
    return length**alpha
  return ((5.0 + length) / 6.0) ** alpha


@flax.struct.dataclass
class BeamState:
  """The `lax.while_loop` carry of `beam_search`: `beam` slots per sentence, live and finished."""

  step: jax.Array  # int32 []: tokens generated so far (= the position fed next).
  live_seqs: jax.Array  # int32 [batch, beam, max_len]: generated ids after BOS, PAD-filled.
  live_log_probs: jax.Array  # float32 [batch, beam]: summed log-probs; -inf = dead slot.
  finished_seqs: jax.Array  # int32 [batch, beam, max_len]: best finished ("fairseq": first
  #   finished), EOS then PAD.
  finished_scores: jax.Array  # float32 [batch, beam]: log-prob / lp(len), sorted descending
  #   ("fairseq": in finish order, sorted at the end); -inf where the slot is empty.
  finished_flags: jax.Array  # bool [batch, beam]: the slot holds a finished hypothesis.
  finished_log_probs: jax.Array  # float32 [batch, beam]: their summed log-probs (n-best
  #   lists report both); -inf where the slot is empty.
  cache: Any  # the step function's cache, leaves [batch * beam, ...] (scalars shared),
  #   as the last step left it: row b * beam + k still belongs to the beam it extended.
  parents: jax.Array  # int32 [batch, beam]: the beam (within the sentence) each live beam
  #   extends; the next step reorders the cache rows accordingly before using them.
  num_reorders: jax.Array  # int32 []: steps at which the cache rows were reordered.
  sentence_steps: jax.Array  # int32 []: the batch size of each step, summed.
  max_lengths: jax.Array  # int32 [batch]: each sentence's maximum length, in [0, max_len].
  sentences: jax.Array  # int32 [batch]: each row's sentence in the caller's batch (the
  #   search shrinks its batch as sentences finish; module docstring, "Shrinking batch").
  context: Any  # the step function's per-sentence inputs, leaves [batch, ...], or None.
  # A new per-sentence field must join beam_rows.PER_SENTENCE, which moves them when the
  # batch shrinks.


@flax.struct.dataclass
class BeamSearchOutput:
  """What `beam_search` and `beam_decode` return; the `all_*` fields are the n-best lists."""

  sequences: jax.Array  # int32 [batch, max_len]: best hypothesis per sentence, EOS then PAD.
  scores: jax.Array  # float32 [batch]: its score, log-prob / lp(len).
  all_sequences: jax.Array  # int32 [batch, beam, max_len]: every returned hypothesis.
  all_scores: jax.Array  # float32 [batch, beam]: sorted descending; -inf for empty slots.
  all_log_probs: jax.Array  # float32 [batch, beam]: their summed log-probs (score * lp(len)).
  num_steps: jax.Array  # int32 []: decoder steps run (< max_len when stopped early).
  num_reorders: jax.Array  # int32 []: steps whose cache was reordered (the others copy nothing).
  sentence_steps: jax.Array  # int32 []: sentences decoded at each step, summed: batch *
  #   num_steps, less where the batch shrank as sentences finished.


def check_stop_check_every(every) -> None:
  """Raises BadValue unless `every` (decode.stop_check_every) is an int >= 1."""
  if isinstance(every, bool) or not isinstance(every, int) or every < 1:
    raise errors.BadValue(
      f"stop_check_every={every!r}: expected a number of decoder steps, 1 or more (1: the "
      "stopping condition after every step)."
    )


def _steps_while_searching(
  step: Callable[[BeamState], BeamState], searching: Callable[[BeamState], jax.Array], k: int
) -> Callable[[BeamState], BeamState]:
  """A while_loop body running `step` k times, for a loop that reads `searching` only once
  every k steps.

  The loop's condition holds for the first of the k steps. Each later one is taken whatever
  `searching` says, then kept only if it held (a select on one scalar, not a lax.cond: no
  predicate leaves the device). A step not kept leaves every field as it was, so the state
  stays not-searching and the loop ends with exactly the state, step count and reorder count
  of a check after every step, up to k - 1 steps of wasted work. Only the cache is not
  restored, to spare a copy of it per step: no kept step reads it again, and it is not part
  of the result. (Such a step may write past the last position; those writes are clamped or
  dropped, and discarded with the rest of it.)
  """

  def body(state: BeamState) -> BeamState:
    state = step(state)
    for _ in range(k - 1):
      keep = searching(state)  # bool []
      stepped = step(state)
      kept = jax.tree.map(
        lambda new, old, keep=keep: jnp.where(keep, new, old),
        stepped.replace(cache=None, context=None),
        state.replace(cache=None, context=None),
      )
      state = kept.replace(cache=stepped.cache, context=state.context)
    return state

  return body


def beam_search(
  tokens_to_logits: TokensToLogits,
  initial_cache: Any,
  batch_size: int,
  beam_size: int,
  max_len: int,
  alpha: float = 0.6,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  pad_id: int = PAD_ID,
  max_lengths: jax.Array | None = None,
  early_stopping: bool = True,
  gather_cache: GatherCache = beam_rows.gather_rows,
  always_gather: bool = False,
  length_penalty: str = "gnmt",
  candidate_pool: str = "beam",
  normalize: bool = True,
  conditional_reorder: bool = True,
  stop_check_every: int = 1,
  context: Any = None,
  shrink_batch: bool = False,
  min_batch: int = 1,
  smallest_batch: int = 1,
  per_sentence_cache: tuple[str, ...] = (),
  cache_positions: tuple[int, ...] = (),
  grow_cache: Callable[[Any, int], Any] | None = None,
  blocked_top_k: bool = True,
) -> BeamSearchOutput:
  """Beam search over `tokens_to_logits`; call it inside `jax.jit` (it traces one loop per
  batch size it shrinks through, and one per size of a cache that grows).

  Args:
    tokens_to_logits: (tokens int32 [batch * beam], position int32 [], cache) ->
      (logits float [batch * beam, vocab], new cache), with a fourth argument, `context`
      (the rows of the sentences in the current batch), when `context` is given. Row
      b * beam + k is beam k of sentence b.
    initial_cache: the step function's cache for one row per sentence (leaves
      [batch, ...], scalars allowed); expanded to [batch * beam, ...] here once.
    batch_size, beam_size, max_len: static sizes; max_len bounds the generated tokens.
    alpha: length-penalty exponent (0 = raw log-prob).
    eos_id, bos_id: EOS ends a hypothesis; BOS is fed at position 0.
    pad_id: fills the sequences after EOS.
    max_lengths: optional int [batch], per-sentence maximum number of generated tokens
      (e.g. source length + 50), clipped to [0, max_len]; defaults to max_len.
    early_stopping: False runs all max_len steps (same results; for tests).
    gather_cache: reorders the cache rows after a step where some beam changed parent;
      it must return what `beam_rows.gather_rows` would (it may skip copying what is equal
      anyway).
    always_gather: the reference path for tests and benchmarks (same results, slower):
      the cache is reordered whole with `gather_rows` at the end of every step, even
      when no beam changed parent.
    length_penalty: "gnmt" divides by ((5 + len) / 6) ** alpha, "power" by len ** alpha
      (transformers' `length_penalty`); see the module docstring.
    candidate_pool: "beam", "2beam", "hf" or "fairseq": which extensions are kept at each
      step and which of them may finish; see the module docstring.
    normalize: the step returns logits, turned into log-probabilities here (log-softmax).
      False: it returns the per-token scores to add up as they are (an ensemble's mean of
      its members' log-probabilities, `decode.model_step`), which need not sum to one.
    conditional_reorder: True skips the reorder (a lax.cond) at steps where every beam
      extends itself; False calls `gather_cache` at every step, with no cond (for GPUs, where
      the cond's predicate may cost a host round trip). Same results.
    stop_check_every: k >= 1 steps per while_loop iteration: the stopping condition is read
      once every k steps (module docstring). Same results, the step count included.
    context: the step function's per-sentence inputs (leaves [batch, ...]: the source mask,
      the cross-attention keys/values), moved with their sentences when the batch shrinks;
      None: the step takes three arguments.
    shrink_batch: go on in a batch of a quarter of the size each time at most a quarter of
      the sentences are still searching (module docstring, "Shrinking batch"); False: every
      step runs the whole batch. Same results, provided the step function reads what differs between
      sentences from its cache and `context` only: a closure over a [batch, ...] array would
      no longer match the rows (beam_decode passes the source mask and cross-attention
      keys/values as `context`).
    min_batch: the smallest batch to shrink to, and what every size must be a multiple of
      (the data-parallel device count).
    smallest_batch: no smaller batch than this (fewer stages, fewer compilations).
    per_sentence_cache: names of cache leaves that hold one row per sentence for all its
      beams (beam_decode's "ancestry" keys/values, [batch, heads, beam, ...]): never
      expanded to beams nor reordered here (`gather_cache` sees them), moved by sentence when
      the batch shrinks.
    cache_positions: a cache that grows (module docstring, "Growing cache"): the target
      positions `initial_cache` holds, then each larger size, all under max_len; the first
      batch size runs one loop per size, until the step reaches it, and
      `grow_cache(cache, positions)` makes the cache hold the next one (max_len after the
      last). Empty: `initial_cache` holds max_len positions. Same results; only with
      stop_check_every 1 (a step past the check could write beyond the positions held).
    blocked_top_k: each beam's best tokens found through blocks of the vocabulary
      (`vocab_top_k.top_k`); False: `jax.lax.top_k` over the whole row (the device run's
      comparison). The same result.

  Returns:
    BeamSearchOutput: the best hypothesis per sentence and all `beam_size` of them.
  """
  if length_penalty not in LENGTH_PENALTIES:
    raise errors.BadValue(f"length_penalty {length_penalty!r}: expected one of {LENGTH_PENALTIES}.")
  if candidate_pool not in CANDIDATE_POOLS:
    raise errors.BadValue(f"candidate_pool {candidate_pool!r}: expected one of {CANDIDATE_POOLS}.")
  check_stop_check_every(stop_check_every)
  if cache_positions and (
    stop_check_every > 1
    or grow_cache is None
    or list(cache_positions) != sorted(set(cache_positions))
    or not 0 < cache_positions[0] <= cache_positions[-1] < max_len
  ):
    raise ValueError(
      f"cache_positions {cache_positions}: increasing sizes under max_len {max_len}, with "
      f"grow_cache and stop_check_every 1 (got {stop_check_every})."
    )
  lp = functools.partial(penalty, alpha=alpha, kind=length_penalty)
  # Extensions ranked per step: beam_size for "beam", 2 * beam_size for the others.
  num_candidates = beam_size if candidate_pool == "beam" else 2 * beam_size
  if max_lengths is None:
    max_lengths = jnp.full((batch_size,), max_len, jnp.int32)
  max_lengths = jnp.clip(jnp.asarray(max_lengths, jnp.int32), 0, max_len)  # [batch]
  if context is None:
    step_fn = lambda tokens, position, cache, context: tokens_to_logits(tokens, position, cache)  # noqa: E731
  else:
    step_fn = tokens_to_logits

  # Only beam 0 is alive at first: all beams are the same empty prefix, and keeping the
  # copies alive would fill the beam with duplicates.
  live_log_probs = jnp.tile(
    jnp.array([0.0] + [NEG_INF] * (beam_size - 1), jnp.float32), (batch_size, 1)
  )  # [batch, beam]
  # A sentence with max length 0 is finished before the first step, with the empty hypothesis.
  empty = (max_lengths == 0)[:, None] & (jnp.arange(beam_size) == 0)[None, :]  # [batch, beam]
  initial = BeamState(
    step=jnp.array(0, jnp.int32),
    live_seqs=jnp.full((batch_size, beam_size, max_len), pad_id, jnp.int32),
    live_log_probs=jnp.where((max_lengths == 0)[:, None], NEG_INF, live_log_probs),
    finished_seqs=jnp.full((batch_size, beam_size, max_len), pad_id, jnp.int32),
    finished_scores=jnp.where(empty, 0.0, NEG_INF).astype(jnp.float32),
    finished_flags=empty,
    finished_log_probs=jnp.where(empty, 0.0, NEG_INF).astype(jnp.float32),
    cache=beam_rows.expand_to_beams(initial_cache, batch_size, beam_size, per_sentence_cache),
    parents=jnp.tile(jnp.arange(beam_size, dtype=jnp.int32), (batch_size, 1)),
    num_reorders=jnp.array(0, jnp.int32),
    sentence_steps=jnp.array(0, jnp.int32),
    max_lengths=max_lengths,
    sentences=jnp.arange(batch_size, dtype=jnp.int32),
    context=context,
  )

  def best_possible_scores(state: BeamState) -> jax.Array:
    """float32 [batch, beam]: upper bound on the final score of each live beam."""
    # lp grows with length for alpha >= 0: the longest reachable length is best ([batch, 1]);
    # it falls for alpha < 0: the shortest (one more token) is best.
    max_penalty = lp(state.max_lengths)[:, None] if alpha >= 0 else lp(state.step + 1)
    return state.live_log_probs / max_penalty

  def searching(state: BeamState) -> jax.Array:
    """bool [batch]: the sentences whose result may still change."""
    if not early_stopping:
      return jnp.ones(state.max_lengths.shape, bool)
    if candidate_pool == "fairseq":  # done once beam_size have finished, or none lives
      return jnp.any(state.live_log_probs > NEG_INF, axis=1) & (
        jnp.sum(state.finished_flags, axis=1) < beam_size
      )
    best_live = jnp.max(best_possible_scores(state), axis=1)  # [batch]
    worst_finished = state.finished_scores[:, -1]  # [batch]; sorted, -inf until full
    # A dead sentence (all live -inf) is done too: -inf <= anything.
    return ~(best_live <= worst_finished)

  def not_done(state: BeamState) -> jax.Array:
    return (state.step < max_len) & jnp.any(searching(state))

  def reorder_cache(cache: Any, parents: jax.Array) -> tuple[jax.Array, Any]:
    """(bool [], whether rows were copied; the cache rows of the beams' parents).

    Done at the start of the next step rather than at the end of the one that chose the
    parents: XLA then writes the step's keys/values into the reordered cache in place,
    whereas a gather between that write and the loop's end made it copy the cache again.
    """
    if beam_size == 1:  # the single beam always extends itself
      return jnp.array(False), cache
    if not conditional_reorder:  # a copy at every step, no predicate
      return jnp.array(True), gather_cache(cache, beam_rows.parent_rows(parents))
    # Any beam that changed parent means a gather; only when every beam of every sentence
    # extends itself is there nothing to copy.
    reorder = jnp.any(parents != jnp.arange(beam_size, dtype=jnp.int32))
    return reorder, jax.lax.cond(
      reorder, gather_cache, lambda cache, rows: cache, cache, beam_rows.parent_rows(parents)
    )

  def body(state: BeamState) -> BeamState:
    step = state.step
    batch = state.live_log_probs.shape[0]  # the current stage's batch
    batch_index = jnp.arange(batch)[:, None]  # [batch, 1], for per-sentence gathers
    previous = jax.lax.dynamic_index_in_dim(
      state.live_seqs, jnp.maximum(step - 1, 0), axis=2, keepdims=False
    )  # [batch, beam]
    tokens = jnp.where(step == 0, bos_id, previous).reshape(-1)  # [batch * beam]
    if always_gather:  # the cache was reordered at the end of the previous step
      reordered, cache = jnp.array(True), state.cache
    else:
      reordered, cache = reorder_cache(state.cache, state.parents)
    logits, cache = step_fn(tokens, step, cache, state.context)
    logits = logits.astype(jnp.float32).reshape(batch, beam_size, -1)  # [batch, beam, V]
    vocab = logits.shape[-1]
    if candidate_pool == "fairseq":  # -inf entries, as after the log-softmax (it is a shift)
      masked = fairseq_length_rules(logits, step, state.max_lengths, eos_id)
    else:
      masked = logits

    # The num_candidates (K) best extensions over all (beam, token) pairs of each sentence,
    # best first, in two stages: the K best tokens of each beam, then the K best of those
    # beam x K. The log-softmax is a shift per beam, so the first stage ranks the logits
    # themselves and only the chosen K are normalized, as jax.nn.log_softmax computes them:
    # no [batch, beam, vocab] array is written, and no top-k runs over beam x vocab (at batch
    # 128, beam 4 and 9,712 pieces, 23 + 15 ms a step on 2 CPU cores for the flat top-k and
    # the log-softmax, against 14 for the per-beam top-k). Ties go to the lower beam, then the
    # lower token, as a top-k over the flat [beam * vocab] puts them. The per-beam top-k goes
    # through blocks of the vocabulary (vocab_top_k: the same result, ~3x faster on CPU).
    per_beam = min(num_candidates, vocab)
    top_k = vocab_top_k.top_k if blocked_top_k else jax.lax.top_k
    beam_top, beam_tokens = top_k(masked, per_beam)  # [batch, beam, per_beam]
    if normalize:
      row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
      log_sum = jnp.log(jnp.sum(jnp.exp(logits - row_max), axis=-1, keepdims=True))
      beam_top = (beam_top - row_max) - log_sum  # [batch, beam, per_beam] log-probabilities
    candidates = state.live_log_probs[:, :, None] + beam_top  # [batch, beam, per_beam]
    top_log_probs, top_index = jax.lax.top_k(candidates.reshape(batch, -1), num_candidates)
    parents = (top_index // per_beam).astype(jnp.int32)  # [batch, K]
    top_tokens = jnp.take_along_axis(beam_tokens.reshape(batch, -1), top_index, axis=1).astype(
      jnp.int32
    )  # [batch, K]
    top_seqs = state.live_seqs[batch_index, parents]  # [batch, K, max_len]
    top_seqs = top_seqs.at[:, :, step].set(top_tokens)

    # An extension of a dead beam (or a zero-probability token) is no hypothesis at all.
    valid = top_log_probs > NEG_INF  # [batch, K]
    length = step + 1  # generated tokens, EOS included
    ends = valid & ((top_tokens == eos_id) | (length >= state.max_lengths)[:, None])  # [batch, K]
    # "hf", "fairseq": only the beam_size best may finish; an ending one ranked below is dropped.
    finishing = ends
    if candidate_pool in ("hf", "fairseq"):
      finishing = ends & (jnp.arange(num_candidates) < beam_size)  # [batch, K]
    new_scores = jnp.where(finishing, top_log_probs / lp(length), NEG_INF)  # [batch, K]

    # Merge with the finished set; existing entries come first, so top_k keeps them on ties.
    all_seqs = jnp.concatenate([state.finished_seqs, top_seqs], axis=1)  # [batch, beam+K, len]
    all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)  # [batch, beam+K]
    all_flags = jnp.concatenate([state.finished_flags, finishing], axis=1)
    all_log_probs = jnp.concatenate(
      [state.finished_log_probs, jnp.where(finishing, top_log_probs, NEG_INF)], axis=1
    )  # [batch, beam+K]
    if candidate_pool == "fairseq":  # the first beam_size to finish, existing ones first
      keep = first_finished(all_flags, beam_size)  # [batch, beam]
      finished_scores = all_scores[batch_index, keep]
    else:
      finished_scores, keep = jax.lax.top_k(all_scores, beam_size)  # [batch, beam]

    live_log_probs = jnp.where(valid & ~ends, top_log_probs, NEG_INF)  # [batch, K]
    if candidate_pool != "beam":  # the beam_size best that do not end, in rank order
      live_log_probs, live = jax.lax.top_k(live_log_probs, beam_size)  # [batch, beam]
      parents = parents[batch_index, live]
      top_seqs = top_seqs[batch_index, live]  # [batch, beam, max_len]
    if always_gather:
      cache = beam_rows.gather_rows(cache, beam_rows.parent_rows(parents), per_sentence_cache)

    return state.replace(
      step=step + 1,
      live_seqs=top_seqs,
      live_log_probs=live_log_probs,
      finished_seqs=all_seqs[batch_index, keep],
      finished_scores=finished_scores,
      finished_flags=all_flags[batch_index, keep],
      finished_log_probs=all_log_probs[batch_index, keep],
      cache=cache,
      parents=parents,
      num_reorders=state.num_reorders + reordered.astype(jnp.int32),
      sentence_steps=state.sentence_steps + batch,
    )

  if stop_check_every > 1:
    body = _steps_while_searching(body, not_done, stop_check_every)
  sizes = (
    beam_rows.shrink_sizes(batch_size, min_batch, smallest_batch) if shrink_batch else (batch_size,)
  )
  state, results = initial, initial.replace(cache=None, context=None)
  held = cache_positions[0] if cache_positions else max_len  # positions the cache holds
  for size, next_size in zip(sizes, sizes[1:] + (0,), strict=True):
    if size < batch_size:  # the sentences still searching (and done ones to fill) move down
      kept = beam_rows.kept_sentences(searching(state), size)
      state = beam_rows.shrunk(state, kept, beam_size, per_sentence_cache)
    # The first batch size grows its cache through every size; the later ones hold max_len.
    for positions in (cache_positions if size == batch_size else ()) + (max_len,):
      if positions > held:
        state, held = state.replace(cache=grow_cache(state.cache, positions)), positions

      def stage_not_done(state: BeamState, next_size=next_size, positions=positions) -> jax.Array:
        # Go on in this batch while more sentences search than the next, smaller one holds,
        # and while the step's position is in the cache.
        searching_here = not_done(state) & (jnp.sum(searching(state)) > next_size)
        return searching_here & (state.step < positions)

      state = jax.lax.while_loop(stage_not_done, body, state)
    results = beam_rows.with_results_of(results, state)
  final = results.replace(
    step=state.step, num_reorders=state.num_reorders, sentence_steps=state.sentence_steps
  )
  if candidate_pool == "fairseq":
    final = sorted_by_score(final)

  # Forced finishing at max length means every sentence has a finished hypothesis; the
  # fallback to the live beams only guards against a step function that yields no valid
  # token (e.g. NaN logits), so that no sentence comes back empty-handed silently.
  has_finished = jnp.any(final.finished_flags, axis=1)  # [batch]
  live_scores = final.live_log_probs / lp(final.step)
  all_sequences = jnp.where(has_finished[:, None, None], final.finished_seqs, final.live_seqs)
  all_scores = jnp.where(has_finished[:, None], final.finished_scores, live_scores)
  all_log_probs = jnp.where(has_finished[:, None], final.finished_log_probs, final.live_log_probs)
  return BeamSearchOutput(
    sequences=all_sequences[:, 0],
    scores=all_scores[:, 0],
    all_sequences=all_sequences,
    all_scores=all_scores,
    all_log_probs=all_log_probs,
    num_steps=final.step,
    num_reorders=final.num_reorders,
    sentence_steps=final.sentence_steps,
  )

"""Beam search with the Transformer: `beam_search.beam_search` over the model's decoder step.

beam_search.py holds the search itself, model-agnostic (a step function in, hypotheses out), so
it can be checked against brute force on toy models; this module is what plugs the Transformer
into it and picks, from the model and the batch, what the search cannot know:

* the encoder runs once per sentence, and the cross-attention keys/values it projects stay one
  row per sentence, outside the reordered cache (the search's per-sentence `context`);
* the self-attention cache's layout and how it follows the beams' parents (`cache_reorder`:
  the written positions copied, every leaf gathered, or kept in place with an ancestry leaf);
* whether a cache kept in place starts small and grows (`grow_cache_from_bytes`).

Each choice and why is in beam_search's module docstring; none changes a hypothesis beyond
float32 rounding (tests/test_beam_decode.py).
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer_mt.decoding import beam_rows, beam_search
from transformer_mt.decoding import incremental as decode

# beam_decode grows a cache kept in place when one layer's keys and values (all beams) take at
# least this many bytes (beam_search's module docstring, "Growing cache"). A threshold chosen,
# not measured at its edge: the Base shape at 32 sentences (33 MB a layer) is above it; a small
# model's cache is read quickly anyway, and each size is one more compiled copy of the step (~10%
# more compile time for the tests' tiny model).
GROW_CACHE_FROM_BYTES = 16 * 2**20


@functools.partial(
  jax.jit,
  static_argnames=(
    "config",
    "beam_size",
    "max_len",
    "alpha",
    "always_gather",
    "length_penalty",
    "candidate_pool",
    "forced_first_id",
    "cache_reorder",
    "stop_check_every",
    "shrink_batch",
    "min_batch",
    "smallest_batch",
    "grow_cache_from_bytes",
    "blocked_top_k",
  ),
)
def beam_decode(
  params: Any,
  inputs: jax.Array,
  config: decode.ModelConfig,
  beam_size: int,
  max_len: int,
  alpha: float = 0.6,
  max_lengths: jax.Array | None = None,
  always_gather: bool = False,
  forced_first_id: int | None = None,
  length_penalty: str = "gnmt",
  candidate_pool: str = "beam",
  cache_reorder: str = "chunked",
  stop_check_every: int = 1,
  shrink_batch: bool = True,
  min_batch: int = 1,
  smallest_batch: int = 1,
  grow_cache_from_bytes: int | None = GROW_CACHE_FROM_BYTES,
  blocked_top_k: bool = True,
) -> beam_search.BeamSearchOutput:
  """Beam search with the Transformer for `inputs` int [batch, src_len] (0 = pad).

  The encoder runs once per sentence (`decode.init_cache` projects the cross-attention
  keys/values there); the self-attention cache is then copied to the beams. The
  cross-attention keys/values stay outside the beam search state, one row per sentence:
  equal across a sentence's beams, they are neither copied per beam nor reordered (the
  beams of a sentence attend to them as one query block, `decode_cache.decode_attention`).
  Empty source rows get the empty hypothesis (all PAD), as in `decode.greedy_decode`;
  beam_size 1 reproduces `decode.greedy_decode` token for token.

  Args:
    max_lengths: optional int [batch], per-sentence maximum target length (e.g. source
      length + 50); clipped to max_len, which sizes the cache and the outputs.
    always_gather: the reference path (same results, slower): the whole self-attention cache
      is reordered at every step.
    forced_first_id: the first token of every hypothesis, at no cost to its score
      (`decode.force_first_token`: a target language code), or None.
    length_penalty, candidate_pool: as in `beam_search`; "power" and "hf" reproduce
      transformers' `generate(num_beams=..., length_penalty=alpha, early_stopping="never")`,
      "power" and "fairseq" fairseq-generate's `--beam ... --lenpen alpha --max-len-a 0
      --max-len-b max_len - 1`.
    cache_reorder: "chunked" (the written positions, when some beam changed parent),
      "gather" (every leaf whole at every step: no cond, no inner loop), "ancestry" (the
      cache kept in place, a small per-row leaf reordered instead) or "auto" (by JAX's
      default backend: gather on GPU/TPU; on CPU ancestry from
      `beam_rows.ANCESTRY_FROM_BATCH` sentences a batch, chunked below:
      `beam_rows.resolve_cache_reorder`); beam_search's module docstring.
    stop_check_every: read the stopping condition once every this many steps (beam_search's
      module docstring).
    shrink_batch, min_batch: go on in a quarter of the batch each time at most a quarter of
      the sentences still search, down to min_batch (a multiple of the data-parallel device
      count; beam_search's module docstring, "Shrinking batch") but never under
      smallest_batch. None of these changes a result.
    grow_cache_from_bytes: a cache kept in place ("ancestry") whose layers' keys and values
      take at least this many bytes each starts at a quarter of max_len positions, then
      grows to a half and to all of them (beam_search's module docstring, "Growing cache";
      only with stop_check_every 1); None: never. The same results.
    blocked_top_k: each beam's best tokens through blocks of the vocabulary
      (`vocab_top_k`), or, False, `jax.lax.top_k` over the whole row. The same results.

  An ensemble (`params` a tuple of parameter trees, `config` the tuple of their configs;
  `incremental`'s module docstring) searches over the mean of its members'
  log-probabilities.
  """
  batch = inputs.shape[0]
  ids_config = decode.lead_config(config)
  inputs_valid = inputs != ids_config.pad_id  # [batch, src_len]
  if max_lengths is None:
    max_lengths = jnp.full((batch,), max_len, jnp.int32)
  max_lengths = jnp.where(jnp.any(inputs_valid, axis=1), max_lengths, 0)

  # The cross-attention keys/values stay one row per sentence, [batch, heads, src_len, head_dim]
  # (decode_cache.decode_attention folds a sentence's beams into its query axis): never copied
  # per beam, never reordered. With the source mask they are the search's per-sentence
  # context, moved with their sentences when the batch shrinks.
  cache, cross_cache = decode.split_cache(decode.init_cache(params, inputs, config, max_len))

  def tokens_to_logits(tokens, position, cache, context):
    cross_cache, inputs_valid = context
    beam_inputs_valid = jnp.repeat(inputs_valid, beam_size, axis=0)  # [batch * beam, src_len]
    step = decode.model_step(params, beam_inputs_valid, config, forced_first_id)
    logits, cache = step(tokens, position, decode.merge_cache(cache, cross_cache))
    return logits, decode.split_cache(cache)[0]

  reorder = beam_rows.resolve_cache_reorder(cache_reorder, batch_size=batch)
  if reorder == "ancestry" and beam_size == 1:  # one beam never changes parent: nothing to
    reorder = "chunked"  # save, and greedy decoding's program stays the one it equals
  gather_cache = {
    "chunked": decode.gather_written_rows,
    "gather": decode.gather_all_rows,
    "ancestry": decode.gather_ancestry,
  }[reorder]
  positions = ()
  if reorder == "ancestry":
    if stop_check_every == 1 and grow_cache_from_bytes is not None:
      layer = next(  # one layer's keys [batch, heads, max_len, head_dim], before the beams
        x
        for p, x in flax.traverse_util.flatten_dict(cache).items()
        if p[-1] in decode.SELF_ATTENTION_LEAVES
      )
      if 2 * beam_size * layer.size * layer.dtype.itemsize >= grow_cache_from_bytes:
        positions = tuple(sorted({-(-max_len // 4), -(-max_len // 2)} - {max_len}))
    cache = decode.beams_cache(cache, beam_size, positions[0] if positions else None)
  return beam_search.beam_search(
    tokens_to_logits,
    cache,
    batch_size=batch,
    beam_size=beam_size,
    max_len=max_len,
    alpha=alpha,
    max_lengths=max_lengths,
    eos_id=ids_config.eos_id,
    bos_id=ids_config.decoder_start_id,
    pad_id=ids_config.pad_id,
    length_penalty=length_penalty,
    candidate_pool=candidate_pool,
    # An ensemble's step gives mean log-probabilities, to be searched over as they are.
    normalize=not decode.is_ensemble(config),
    always_gather=always_gather,
    gather_cache=gather_cache,
    conditional_reorder=reorder == "chunked",
    stop_check_every=stop_check_every,
    context=(cross_cache, inputs_valid),
    shrink_batch=shrink_batch,
    min_batch=min_batch,
    smallest_batch=smallest_batch,
    per_sentence_cache=decode.SELF_ATTENTION_LEAVES if reorder == "ancestry" else (),
    cache_positions=positions,
    grow_cache=decode.grow_beams_cache,
    blocked_top_k=blocked_top_k,
  )

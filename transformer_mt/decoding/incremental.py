"""Jitted incremental decoding against the KV cache.

The pieces are split so beam search can reuse them: `init_cache` runs the encoder
once and creates the cache (cross-attention keys/values included), and
`decode_step` maps one token per row to next-token logits. `decode_loop` is a
`lax.while_loop` over such a step that stops each row at EOS or its own maximum length
(the rule beam search applies) and the loop once every row has stopped; greedy decoding
takes the argmax there, sampling (transformer_mt/decoding/sampling.py) draws a token.

Beam search reorders the cache rows whenever beams change parents, a copy of the whole
cache per step if done naively. `split_cache` separates the cross-attention keys/values
(a function of the source sentence only, so equal across its beams: never reordered)
from the self-attention cache, and `gather_written_rows` reorders only the positions
the self-attention cache has written so far.

An ensemble decodes as one model: `config` is the tuple of its members' configs (which may
differ in architecture) and `params` the tuple of their parameter trees; each member keeps its
own cache (under `member_key(i)`), and a step gives the mean of the members' log-probabilities
(`model_step`). The members share one tokenizer and the ids of `lead_config`, so they read and
write the same tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.model.decode_cache import ANCESTRY
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig

# One model's config, or an ensemble's: a tuple of its members' configs (module docstring).
ModelConfig = TransformerConfig | tuple[TransformerConfig, ...]


def is_ensemble(config: ModelConfig) -> bool:
  return isinstance(config, tuple)


def lead_config(config: ModelConfig) -> TransformerConfig:
  """The config whose ids (PAD, EOS, decoder start, suppressed) every member shares."""
  return config[0] if is_ensemble(config) else config


def members(params: Any, config: ModelConfig) -> list[tuple[Any, TransformerConfig]]:
  """(params, config) of each model: one pair for a single model."""
  if not is_ensemble(config):
    return [(params, config)]
  if len(params) != len(config):
    raise ValueError(f"An ensemble of {len(config)} configs got {len(params)} parameter trees.")
  return list(zip(params, config))


def member_key(index: int) -> str:
  """The key of member `index`'s cache in an ensemble's cache."""
  return f"member_{index}"


def init_cache(params: Any, inputs: jax.Array, config: ModelConfig, max_len: int) -> Any:
  """Encodes `inputs` int32 [batch, src_len] and returns a decode cache for `max_len` target
  steps (an ensemble's: one per member, under `member_key(i)`): the Transformer's "cache"
  collection, self-attention keys/values [batch, heads, max_len, head_dim] per decoder layer
  and the cross-attention ones [batch, heads, src_len, head_dim], with a scalar write index."""
  if is_ensemble(config):
    return {
      member_key(i): init_cache(p, inputs, c, max_len)
      for i, (p, c) in enumerate(members(params, config))
    }
  eval_model = Transformer(config.replace(deterministic=True, decode=False))
  encoded = eval_model.apply({"params": params}, inputs, method=Transformer.encode)
  decode_model = Transformer(config.replace(deterministic=True, decode=True))
  batch = inputs.shape[0]
  _, variables = decode_model.apply(
    {"params": params},
    encoded,
    inputs != config.pad_id,
    jnp.full((batch, 1), config.decoder_start_id, jnp.int32),
    jnp.zeros((batch, 1), jnp.int32),
    cache_length=max_len,
    method=Transformer.decode,
    mutable=["cache"],
  )
  return variables["cache"]


def decode_step(
  params: Any,
  cache: Any,
  inputs_valid: jax.Array,
  tokens: jax.Array,
  position: jax.Array,
  config: TransformerConfig,
) -> tuple[jax.Array, Any]:
  """Logits for the next token.

  Args:
    inputs_valid: bool [batch, src_len], False at source padding.
    tokens: int [batch], the previous token of each row (BOS at step 0).
    position: int [], the target position being fed (0 at step 0).

  Returns:
    float32 logits [batch, vocab] and the updated cache.
  """
  model = Transformer(config.replace(deterministic=True, decode=True))
  positions = jnp.full((tokens.shape[0], 1), position, jnp.int32)
  logits, variables = model.apply(
    {"params": params, "cache": cache},
    None,
    inputs_valid,
    tokens[:, None],
    positions,
    method=Transformer.decode,
    mutable=["cache"],
  )
  return logits[:, 0], variables["cache"]


# Leaf names of the decode cache (transformer_mt/model/attention.py), head-major. Cross-attention:
# keys [batch, heads, head_dim, src_len] (transposed) and values [batch, heads, src_len,
# head_dim]; self-attention: [batch, heads, max_len, head_dim], written at position
# `cache_index` (int32 [], the same in every layer) at each step, zeros beyond.
CROSS_ATTENTION_LEAVES = ("cross_key", "cross_value")
SELF_ATTENTION_LEAVES = ("cached_key", "cached_value")
CACHE_INDEX = "cache_index"


def split_cache(cache: Any) -> tuple[Any, Any]:
  """(self-attention cache, cross-attention cache): the parts that do / do not change per step."""
  flat = flax.traverse_util.flatten_dict(cache)
  cross = {path: x for path, x in flat.items() if path[-1] in CROSS_ATTENTION_LEAVES}
  rest = {path: x for path, x in flat.items() if path[-1] not in CROSS_ATTENTION_LEAVES}
  return flax.traverse_util.unflatten_dict(rest), flax.traverse_util.unflatten_dict(cross)


def merge_cache(self_cache: Any, cross_cache: Any) -> Any:
  """Inverse of `split_cache`."""
  return flax.traverse_util.unflatten_dict(
    {**flax.traverse_util.flatten_dict(self_cache), **flax.traverse_util.flatten_dict(cross_cache)}
  )


def gather_written_rows(cache: Any, rows: jax.Array, chunk: int = 16) -> Any:
  """`cache` with row i replaced by row rows[i], copying only the positions written so far.

  Same result as taking every row whole: self-attention positions at and after
  `cache_index` are still zeros in every row. Copying [0, cache_index) in chunks of
  `chunk` positions instead of all max_len makes the per-step cost grow with the
  hypotheses' length, not with the maximum length (source length + 50).

  Args:
    cache: a self-attention cache (no cross-attention leaves), leaves [batch, ...].
    rows: int32 [batch], in [0, batch).
  """
  flat = flax.traverse_util.flatten_dict(cache)
  index = next(x for path, x in flat.items() if path[-1] == CACHE_INDEX)  # positions written

  def take(x):  # rows are in range: no bounds checks
    return x.at[rows].get(mode="promise_in_bounds")

  gathered = {}
  for path, x in flat.items():
    if path[-1] not in SELF_ATTENTION_LEAVES:
      gathered[path] = x if x.ndim == 0 else take(x)
      continue
    length = x.shape[2]  # [batch, heads, max_len, head_dim]
    size = min(chunk, length)

    def copy_chunk(c, x, size=size, length=length):
      # The last chunk is moved back to end at `length` (dynamic_slice would clamp it
      # anyway); its overlap with the previous chunk, already reordered, is kept as is.
      start = jnp.minimum(c * size, length - size)
      part = jax.lax.dynamic_slice_in_dim(x, start, size, axis=2)  # [batch, heads, size, ...]
      fresh = (start + jnp.arange(size) >= c * size).reshape((1, 1, size) + (1,) * (x.ndim - 3))
      part = jnp.where(fresh, take(part), part)
      return jax.lax.dynamic_update_slice_in_dim(x, part, start, axis=2)

    gathered[path] = jax.lax.fori_loop(0, (index + size - 1) // size, copy_chunk, x)
  return flax.traverse_util.unflatten_dict(gathered)


def gather_all_rows(cache: Any, rows: jax.Array) -> Any:
  """`cache` with row i replaced by row rows[i], every leaf taken whole: one gather per leaf,
  no loop and no data-dependent trip count (beam_search's "gather" reorder, for GPUs), at the
  price of copying all max_len positions where `gather_written_rows` copies those written.

  Args:
    cache: a self-attention cache, leaves [batch, ...] and the scalar write index.
    rows: int32 [batch], in [0, batch).
  """
  # Rows are in range: no bounds checks. The scalar index is shared by every row.
  return jax.tree.map(
    lambda x: x if x.ndim == 0 else x.at[rows].get(mode="promise_in_bounds"), cache
  )


def beams_cache(cache: Any, beam_size: int, positions: int | None = None) -> Any:
  """A fresh self-attention cache (`split_cache`'s first part, nothing written yet) laid out
  for a beam search that never reorders it (model/decode_cache.py, `_append_in_place`): keys and
  values [batch, heads, positions * beam, head_dim], one block per sentence, and the
  `decode_cache.ANCESTRY` leaf int32 [batch, positions], -1 everywhere (beam search expands it
  to one row per beam and reorders it instead of the keys/values). `positions`: the target
  positions it holds, `cache`'s max_len unless given (a cache that grows, `grow_beams_cache`)."""
  flat = flax.traverse_util.flatten_dict(cache)
  out = {}
  for path, x in flat.items():
    if path[-1] in SELF_ATTENTION_LEAVES:  # [batch, heads, max_len, head_dim]
      batch, heads, length, depth = x.shape
      length = length if positions is None else positions
      shape = (batch, heads, length * beam_size, depth)
      if path[-1] == "cached_key":  # keys transposed: [batch, heads, head_dim, length * beam]
        shape = (batch, heads, depth, length * beam_size)
      out[path] = jnp.zeros(shape, x.dtype)
      out[path[:-1] + (ANCESTRY,)] = jnp.full((batch, length), -1, jnp.int32)
    else:
      out[path] = x
  return flax.traverse_util.unflatten_dict(out)


def grow_beams_cache(cache: Any, positions: int) -> Any:
  """A `beams_cache` (one row per beam in its `decode_cache.ANCESTRY` leaves) made to hold
  `positions` target positions: zero keys/values appended after the entries it holds, -1
  after each row's ancestry, what was written kept where it is (entry t * beam + j stays
  entry t * beam + j). A step attends to every entry its cache holds, so beam search starts
  with a short cache and grows it (beam_search's `cache_positions`)."""
  flat = flax.traverse_util.flatten_dict(cache)
  out = {}
  for path, x in flat.items():
    if path[-1] == ANCESTRY:  # [rows, held]
      out[path] = jnp.pad(x, ((0, 0), (0, positions - x.shape[1])), constant_values=-1)
    elif path[-1] in SELF_ATTENTION_LEAVES:
      held = flat[path[:-1] + (ANCESTRY,)].shape[1]
      axis = 3 if path[-1] == "cached_key" else 2  # keys [batch, heads, head_dim, entries]
      beam = x.shape[axis] // held
      widths = [(0, 0)] * x.ndim
      widths[axis] = (0, (positions - held) * beam)
      out[path] = jnp.pad(x, widths)
    else:
      out[path] = x
  return flax.traverse_util.unflatten_dict(out)


def gather_ancestry(cache: Any, rows: jax.Array) -> Any:
  """A `beams_cache` with row i's ancestry replaced by row rows[i]'s: the whole reorder of a
  cache whose keys/values stay where they were written (beam_search's "ancestry")."""
  flat = flax.traverse_util.flatten_dict(cache)
  return flax.traverse_util.unflatten_dict(
    {
      path: x.at[rows].get(mode="promise_in_bounds") if path[-1] == ANCESTRY else x
      for path, x in flat.items()
    }
  )


def never_generated(logits: jax.Array, ids: tuple[int, ...] = (PAD_ID, BOS_ID)) -> jax.Array:
  """Masks `ids` (PAD and BOS; `TransformerConfig.suppressed_ids`): the decoder must never emit
  them (a PAD mid-sentence would be read as padding by the teacher-forced model but attended
  to by the cache)."""
  for token in ids:
    logits = logits.at[..., token].set(-jnp.inf)
  return logits


def force_first_token(logits: jax.Array, position: jax.Array, token_id: int | None) -> jax.Array:
  """At position 0 only `token_id` may come, with log-probability 0 so that it adds nothing to
  a hypothesis' score; later positions are unchanged. This is transformers'
  ForcedBOSTokenLogitsProcessor: mBART-50 and NLLB generate the target language code first.

  Args:
    logits: float [rows, vocab].
    position: int32 [], the target position being predicted.
    token_id: the forced token, or None for no forcing.
  """
  if token_id is None:
    return logits
  forced = jnp.full_like(logits, -jnp.inf).at[..., token_id].set(0.0)
  return jnp.where(position == 0, forced, logits)


# tokens int32 [batch], position int32 [], cache -> (logits float [batch, vocab], cache).
TokensToLogits = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]
# logits float32 [batch, vocab] (never-generated ids already -inf), position int32 [] ->
# next tokens int [batch]: argmax for greedy decoding, a draw for sampling.
ChooseTokens = Callable[[jax.Array, jax.Array], jax.Array]


@flax.struct.dataclass
class DecodeState:
  step: jax.Array  # int32 []: target positions generated so far.
  last_tokens: jax.Array  # int32 [batch]: the token fed at this step.
  outputs: jax.Array  # int32 [batch, max_len]: generated ids, PAD after EOS.
  finished: jax.Array  # bool [batch]: the row has emitted EOS or reached its max length.
  cache: Any  # the step function's cache (the decoder's KV cache).


def decode_loop(
  tokens_to_logits: TokensToLogits,
  initial_cache: Any,
  choose: ChooseTokens,
  batch_size: int,
  max_len: int,
  max_lengths: jax.Array | None = None,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  pad_id: int = PAD_ID,
) -> jax.Array:
  """One token per row per step until every row ends: int32 [batch, max_len], EOS included,
  PAD afterwards. Call it inside `jax.jit` (it traces one loop).

  Greedy decoding and sampling differ only in `choose`, so they share the length rule of
  beam search (beam_search's module docstring): row b stops after EOS or after
  `max_lengths[b]` tokens (source length + 50, clipped to [0, max_len]), then without EOS;
  a row whose max length is 0 (an empty source) stays all PAD.

  Args:
    tokens_to_logits: (tokens int32 [batch], position int32 [], cache) ->
      (logits float [batch, vocab], new cache); ids that must never come already masked.
    max_lengths: optional int [batch]; defaults to max_len for every row.
    bos_id: fed at position 0 (the decoder start token).
  """
  if max_lengths is None:
    max_lengths = jnp.full((batch_size,), max_len, jnp.int32)
  max_lengths = jnp.clip(jnp.asarray(max_lengths, jnp.int32), 0, max_len)  # [batch]
  initial = DecodeState(
    step=jnp.array(0, jnp.int32),
    last_tokens=jnp.full((batch_size,), bos_id, jnp.int32),
    outputs=jnp.full((batch_size, max_len), pad_id, jnp.int32),
    finished=max_lengths == 0,
    cache=initial_cache,
  )

  def not_done(state: DecodeState) -> jax.Array:
    return (state.step < max_len) & ~jnp.all(state.finished)

  def body(state: DecodeState) -> DecodeState:
    logits, cache = tokens_to_logits(state.last_tokens, state.step, state.cache)
    next_tokens = choose(logits.astype(jnp.float32), state.step).astype(jnp.int32)  # [batch]
    next_tokens = jnp.where(state.finished, pad_id, next_tokens)
    outputs = jax.lax.dynamic_update_slice(state.outputs, next_tokens[:, None], (0, state.step))
    length = state.step + 1  # tokens generated by each unfinished row, this one included
    return DecodeState(
      step=length,
      last_tokens=next_tokens,
      outputs=outputs,
      finished=state.finished | (next_tokens == eos_id) | (length >= max_lengths),
      cache=cache,
    )

  return jax.lax.while_loop(not_done, body, initial).outputs


def model_step(
  params: Any,
  inputs_valid: jax.Array,
  config: ModelConfig,
  forced_first_id: int | None = None,
) -> TokensToLogits:
  """The Transformer as a `TokensToLogits` for `decode_loop`: `decode_step`, with the ids it
  must never generate masked and `forced_first_id` (or None) forced at position 0.

  An ensemble's step returns the mean of its members' log-probabilities (module docstring),
  float32 [batch, vocab]: argmax and sampling read them as logits; beam search must take
  them as they are (`normalize=False`).
  """
  if is_ensemble(config):
    steps = [model_step(p, inputs_valid, c, forced_first_id) for p, c in members(params, config)]

    def ensemble_step(tokens, position, cache):
      log_probs, new_cache = [], {}
      for i, step in enumerate(steps):
        logits, new_cache[member_key(i)] = step(tokens, position, cache[member_key(i)])
        log_probs.append(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
      return jnp.mean(jnp.stack(log_probs), axis=0), new_cache  # [batch, vocab]

    return ensemble_step

  def tokens_to_logits(tokens, position, cache):
    logits, cache = decode_step(params, cache, inputs_valid, tokens, position, config)
    logits = never_generated(logits, config.suppressed_ids)
    return force_first_token(logits, position, forced_first_id), cache

  return tokens_to_logits


def source_max_lengths(inputs: jax.Array, max_lengths: jax.Array | None, pad_id: int) -> jax.Array:
  """int32 [batch]: `max_lengths` (default: unlimited), 0 for empty (all-padding) rows."""
  has_source = jnp.any(inputs != pad_id, axis=1)  # [batch]
  if max_lengths is None:
    return jnp.where(has_source, jnp.iinfo(jnp.int32).max, 0)
  return jnp.where(has_source, jnp.asarray(max_lengths, jnp.int32), 0)


@functools.partial(jax.jit, static_argnames=("config", "max_len", "forced_first_id"))
def greedy_decode(
  params: Any,
  inputs: jax.Array,
  config: ModelConfig,
  max_len: int,
  forced_first_id: int | None = None,
  max_lengths: jax.Array | None = None,
) -> jax.Array:
  """Argmax decoding: int32 [batch, max_len] target ids, EOS included, PAD afterwards.

  PAD, EOS and the decoder start token are the config's (`pad_id`, `eos_id`,
  `decoder_start_id`), so imported models decode with their own ids. `forced_first_id`, if
  given, is the first generated token of every row (`force_first_token`: a target language
  code), and is part of the output. `max_lengths` (optional int [batch], e.g. source length
  + 50) stops each row at its own limit, as `beam_decode.beam_decode` does, so greedy
  decoding equals beam 1 for any limits. An ensemble (module docstring) takes the argmax of
  its mean log-probabilities.
  """
  ids = lead_config(config)
  inputs_valid = inputs != ids.pad_id  # [batch, src_len]
  return decode_loop(
    model_step(params, inputs_valid, config, forced_first_id),
    init_cache(params, inputs, config, max_len),
    lambda logits, position: jnp.argmax(logits, axis=-1),
    batch_size=inputs.shape[0],
    max_len=max_len,
    # Empty rows (all padding) get nothing, whatever their limit.
    max_lengths=source_max_lengths(inputs, max_lengths, ids.pad_id),
    eos_id=ids.eos_id,
    bos_id=ids.decoder_start_id,
    pad_id=ids.pad_id,
  )

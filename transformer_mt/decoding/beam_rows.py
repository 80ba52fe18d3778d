"""Which cache row holds which hypothesis: the row layout of beam search and its two moves.

Beam search keeps one cache row per hypothesis, row b * beam + k for beam k of sentence b, and
per-sentence state (the cross-attention keys/values, the source mask) one row per sentence.
Two moves change which row holds what, and both must leave every hypothesis with exactly the
rows it had:

* the reorder, after a step where beam k of a sentence extends another beam of the same
  sentence (its parent): row b * beam + k takes its parent's row (`parent_rows`, with
  `gather_rows` or a cheaper `GatherCache`, `incremental.gather_written_rows`);
* the shrink, once enough sentences are done that the search goes on in a smaller batch:
  the rows of the kept sentences move to the front of a batch of `size` sentences
  (`beam_rows_of`, `take_sentences`), and the other sentences' results are final.

Here apart from the search itself (beam_search.py) because the reorder's cost is the main
per-step cost after the matmuls (docs/performance.md, "Beam search against CTranslate2"), and
the shrink's stage sizes are a decoding setting of their own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from transformer_mt.runtime import errors

# cache (leaves [batch * beam, ...]), rows int32 [batch * beam] -> cache with row i := row rows[i].
GatherCache = Callable[[Any, jax.Array], Any]

# How beam_decode reorders the self-attention cache (beam_search's docstring, "Cache
# reordering" and "On an accelerator").
CACHE_REORDERS = ("chunked", "gather", "ancestry", "auto")
# Platforms where "auto" gathers whole leaves; elsewhere (CPU) it keeps the cache where it was
# written ("ancestry") from this many sentences a batch, and copies the written chunks below:
# on CPU "ancestry" is the faster of the two for batches of many sentences and the slower for
# one sentence (docs/performance.md).
GATHER_PLATFORMS = ("gpu", "tpu")
ANCESTRY_FROM_BATCH = 8


def resolve_cache_reorder(
  cache_reorder: str, platform: str | None = None, batch_size: int | None = None
) -> str:
  """The reorder `cache_reorder` stands for, "chunked", "gather" or "ancestry": itself, or for
  "auto" the one for `platform` (default: JAX's default backend) and a batch of `batch_size`
  sentences (None: a large one)."""
  if cache_reorder not in CACHE_REORDERS:
    raise errors.BadValue(f"cache_reorder {cache_reorder!r}: expected one of {CACHE_REORDERS}.")
  if cache_reorder != "auto":
    return cache_reorder
  if (platform or jax.default_backend()) in GATHER_PLATFORMS:
    return "gather"
  return "chunked" if batch_size is not None and batch_size < ANCESTRY_FROM_BATCH else "ancestry"


def _leafwise(tree: Any, per_sentence: tuple[str, ...], per_beam_fn, per_sentence_fn) -> Any:
  """Maps per_beam_fn over the leaves of `tree`, per_sentence_fn over those whose last key is
  in `per_sentence` (cache leaves that hold one row per sentence for all its beams)."""

  def apply(path, x):
    last = path[-1] if path else None
    name = getattr(last, "key", getattr(last, "name", None))
    return per_sentence_fn(x) if name in per_sentence else per_beam_fn(x)

  return jax.tree_util.tree_map_with_path(apply, tree)


def _unchanged(x: Any) -> Any:
  return x


def expand_to_beams(
  tree: Any, batch_size: int, beam_size: int, per_sentence: tuple[str, ...] = ()
) -> Any:
  """Repeats every row beam_size times: [batch, ...] -> [batch * beam, ...]; scalars as they are,
  and leaves named in `per_sentence` (one row per sentence for all its beams) too.

  Row b * beam + k is beam k of sentence b, the layout `parent_rows` indexes.
  """

  def expand(x):
    x = jnp.asarray(x)
    if x.ndim == 0:
      return x
    if x.shape[0] != batch_size:
      raise ValueError(f"Cache leaf of shape {x.shape} has no leading batch axis of {batch_size}.")
    return jnp.repeat(x, beam_size, axis=0)

  return _leafwise(tree, per_sentence, expand, _unchanged)


def parent_rows(parents: jax.Array) -> jax.Array:
  """int32 [batch * beam]: the cache row that beam k of sentence b continues, given
  parents int32 [batch, beam], the beam (within the same sentence) each new beam extends."""
  batch_size, beam_size = parents.shape
  return (jnp.arange(batch_size, dtype=jnp.int32)[:, None] * beam_size + parents).reshape(-1)


def gather_rows(tree: Any, rows: jax.Array, per_sentence: tuple[str, ...] = ()) -> Any:
  """The default `GatherCache`: takes every leaf whole, row i := row rows[i]; scalar leaves
  (e.g. `cache_index`) are shared by all rows and are returned unchanged, and so are the
  leaves named in `per_sentence` (written where they are, never reordered)."""
  take = lambda x: x if x.ndim == 0 else jnp.take(x, rows, axis=0)  # noqa: E731
  return _leafwise(tree, per_sentence, take, _unchanged)


# Each batch size of a shrinking search is this many times smaller than the one before: every
# size is one more compiled copy of the decoder step. Quartering keeps most of halving's gain
# in decoding speed for about half its compile time (docs/performance.md).
SHRINK_FACTOR = 4


def shrink_sizes(batch_size: int, min_batch: int = 1, smallest: int = 1) -> tuple[int, ...]:
  """The batch sizes a search of `batch_size` sentences goes through: divided by SHRINK_FACTOR
  while the result is a whole multiple of `min_batch` (the data-parallel device count, so that
  every stage still splits evenly over the devices) and at least `smallest` (each stage is one
  more compiled copy of the step), e.g. 32 -> (32, 8, 2), on 8 devices 128 -> (128, 32, 8),
  and with smallest 8, 64 -> (64, 16)."""
  if min_batch < 1 or batch_size % min_batch:
    raise ValueError(f"batch of {batch_size} sentences does not split over {min_batch} devices")
  sizes = [batch_size]
  while sizes[-1] % SHRINK_FACTOR == 0:
    size = sizes[-1] // SHRINK_FACTOR
    if size % min_batch or size < smallest:
      break
    sizes.append(size)
  return tuple(sizes)


def kept_sentences(searching: jax.Array, size: int) -> jax.Array:
  """int32 [size]: the rows of the sentences still searching (searching bool [batch]), in their
  order, then done ones to fill `size` (their results stay as they are: a done sentence's
  step changes nothing). Every searching sentence is kept when at most `size` are."""
  return jax.lax.top_k(searching.astype(jnp.int32), size)[1].astype(jnp.int32)


def beam_rows_of(sentences: jax.Array, beam_size: int) -> jax.Array:
  """int32 [size * beam]: the cache rows of sentences int32 [size], beam after beam."""
  beams = jnp.arange(beam_size, dtype=jnp.int32)
  return (sentences[:, None] * beam_size + beams[None, :]).reshape(-1)


def take_sentences(tree: Any, rows: jax.Array) -> Any:
  """Every leaf [batch, ...] at `rows` int32 [size] (rows in range); scalars as they are."""
  return jax.tree.map(
    lambda x: x if x.ndim == 0 else x.at[rows].get(mode="promise_in_bounds"), tree
  )


# The fields of BeamState that hold one entry per sentence of the current batch.
PER_SENTENCE = (
  "live_seqs",
  "live_log_probs",
  "finished_seqs",
  "finished_scores",
  "finished_flags",
  "finished_log_probs",
  "parents",
  "max_lengths",
  "sentences",
)


def shrunk(state: Any, rows: jax.Array, beam_size: int, per_sentence: tuple[str, ...] = ()) -> Any:
  """`state` (a beam_search.BeamState) for the sentences at `rows` int32 [size] only: their
  per-sentence fields, their context and their beams' cache rows (a pending reorder,
  `parents`, moves with them); cache leaves named in `per_sentence` hold one row per
  sentence and move by sentence."""
  take = functools.partial(take_sentences, rows=rows)
  by_beam = functools.partial(take_sentences, rows=beam_rows_of(rows, beam_size))
  return state.replace(
    **{name: take(getattr(state, name)) for name in PER_SENTENCE},
    context=take(state.context),
    cache=_leafwise(state.cache, per_sentence, by_beam, take),
  )


def with_results_of(results: Any, state: Any) -> Any:
  """`results` (the caller's whole batch) with the per-sentence fields of `state`'s sentences
  written at their places: final for those `state` leaves behind, overwritten later for the
  others."""
  rows = state.sentences  # distinct: kept_sentences takes each sentence once
  return results.replace(
    **{
      name: getattr(results, name).at[rows].set(getattr(state, name), mode="promise_in_bounds")
      for name in PER_SENTENCE
    }
  )

"""`run.py score`: the model's log-probability of given (source, target) pairs, by teacher forcing.

Researchers rerank n-best lists and score references (forced decoding); both need the number
beam search would have given the same target, so every choice here follows decoding:

* The distribution is the decoder's: PAD and the decoder start token, which decoding never
  emits (`decode.never_generated`), are masked before the log-softmax, and a forced first
  token (mBART-50 and NLLB: the target language code, which `encode_targets` puts first)
  has log-probability 0, as `decode.force_first_token` gives it in beam search.
* The target is cut by the tokenizer's `encode_targets` (EOS appended, language tags as the
  model was trained with them); the decoder input is the model's decoder start followed by
  the target shifted right (`input_pipeline.evaluation_batches` builds it alike).
* `tokens` counts the target ids, EOS and a forced first token included: the `len` of
  beam search (`beam_search` module docstring). `score` is logprob / lp(tokens) with the
  decode settings' alpha and length penalty, so a hypothesis that beam search returned
  scores here exactly as the search scored it (tests/test_scoring.py). `per_token` is
  logprob / tokens.

Output (`format_scores`), one TSV row per input line, in input order (line_index 0-based):

    line_index<TAB>logprob<TAB>tokens<TAB>per_token<TAB>score

An empty source line is scored given what the tokenizer makes of an empty text (EOS alone, with
the language tag of mBART / NLLB), as fairseq scores one (its dictionary encodes an empty line as
EOS): a number, not nan, so that sums over a file stay defined. A warning names those lines, as
the model never saw such a source in training (empty pairs are dropped) and translate leaves
an empty line untranslated (its n-best rank 0 is the empty hypothesis at score 0, not a model
score). An empty target line is scored as EOS alone (after the language tag, if any): how likely
the model translates the source as nothing.

Pairs are sorted by length and scored in batches of the decode batch size, padded to
length buckets (few compilations) and sharded over the inference mesh's data axis, like
translation; only the checkpoint's parameters are restored (`loading.load_translator`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from transformer_mt.data.input_pipeline import bucket_length
from transformer_mt.decoding import beam_search
from transformer_mt.decoding import incremental as decode
from transformer_mt.decoding.translator import Translator
from transformer_mt.model.transformer import Transformer
from transformer_mt.runtime import errors, sharding

# Empty source lines a warning names by number; the rest it counts.
_NAMED_LINES = 10


class PairScore(NamedTuple):
  """The model's scores of one (source, target) pair (module docstring)."""

  logprob: float  # summed log-probability of the target ids
  tokens: int  # target ids scored: EOS and a forced first token included
  per_token: float  # logprob / tokens
  score: float  # logprob / lp(tokens), beam search's length-normalised score


@functools.partial(jax.jit, static_argnames=("config", "forced_first_id"))
def sequence_log_probs(
  params: Any,
  inputs: jax.Array,
  targets_in: jax.Array,
  targets: jax.Array,
  target_lengths: jax.Array,
  config: decode.ModelConfig,
  forced_first_id: int | None = None,
) -> jax.Array:
  """float32 [batch]: summed log-probabilities of `targets` given `inputs`, by one
  teacher-forced forward pass, under the distribution beam search decodes from.

  Args:
    inputs: int32 [batch, src_len], source ids, PAD after them (an all-PAD row scores junk).
    targets_in: int32 [batch, tgt_len], decoder start then the targets shifted right.
    targets: int32 [batch, tgt_len], target ids.
    target_lengths: int32 [batch], ids of each target row that count (the rest is padding).
    forced_first_id: the token forced at position 0 (log-prob 0; any other one gets -inf).
    config: one model's, or an ensemble's tuple (then `params` is a tuple too): the mean of
      the members' token log-probabilities, the distribution an ensemble decodes from.
  """
  positions = jnp.arange(targets.shape[1])[None, :, None]  # [1, tgt_len, 1]
  member_log_probs = []
  for member_params, member_config in decode.members(params, config):
    model = Transformer(member_config.replace(deterministic=True, decode=False))
    logits = model.apply({"params": member_params}, inputs, targets_in)  # [batch, tgt_len, vocab]
    logits = decode.never_generated(logits, member_config.suppressed_ids)
    logits = decode.force_first_token(logits, positions, forced_first_id)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    member_log_probs.append(jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0])
  # An ensemble scores each token by its members' mean log-probability, as it decodes (the
  # mean of one model's is its own).
  token_log_probs = jnp.mean(jnp.stack(member_log_probs), axis=0)  # [batch, tgt_len]
  counted = jnp.arange(targets.shape[1])[None, :] < target_lengths[:, None]  # [batch, tgt_len]
  # where, not a product: a padding position may hold -inf (a suppressed id), and -inf * 0 = nan.
  return jnp.sum(jnp.where(counted, token_log_probs, 0.0), axis=1)


def score_ids(
  translator: Translator, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
) -> list[PairScore]:
  """One PairScore per (source ids, target ids) pair, in input order; ids as `encode` /
  `encode_targets` give them (or as beam search returns a hypothesis: PAD removed; EOS absent
  if it stopped at its maximum length). Every source must be non-empty.

  Raises:
    ValueError: `sources` and `targets` differ in length.
  """
  if len(sources) != len(targets):
    raise errors.BadValue(f"{len(sources)} sources but {len(targets)} targets.")
  order = sorted(range(len(sources)), key=lambda i: max(len(sources[i]), len(targets[i])))
  results: list[PairScore | None] = [None] * len(sources)
  for start in range(0, len(order), translator.batch_size):
    chunk = order[start : start + translator.batch_size]
    sums = _score_batch(translator, [sources[i] for i in chunk], [targets[i] for i in chunk])
    for i, logprob in zip(chunk, sums):
      results[i] = _pair_score(translator, float(logprob), len(targets[i]))
  return results


def score_lines(
  translator: Translator,
  sources: Sequence[str],
  targets: Sequence[str],
) -> list[PairScore]:
  """One PairScore per line of line-aligned source and target texts, in input order (module
  docstring: empty lines).

  Raises:
    ValueError: the two lists differ in length, or a target is longer than the model's
      learned position table reaches.
  """
  if len(sources) != len(targets):
    raise errors.BadValue(
      f"{len(sources)} source lines but {len(targets)} target lines: the files must be "
      "line-aligned."
    )
  encoded = translator.encode_sources(sources)
  empty = [i for i, ids in enumerate(encoded) if ids is None]
  if empty:
    (no_text,) = translator.tokenizer.encode([""])  # EOS (and a language tag)
    named = ", ".join(str(i + 1) for i in empty[:_NAMED_LINES])
    more = f" and {len(empty) - _NAMED_LINES} more" if len(empty) > _NAMED_LINES else ""
    logging.warning(
      "Source line(s) %s%s (1-based) are empty: scored given a source of EOS alone, which "
      "the model did not see in training (translate leaves such lines untranslated).",
      named,
      more,
    )
    for i in empty:
      encoded[i] = list(no_text)
  target_ids = translator.tokenizer.encode_targets([t.strip() for t in targets])
  learned = [c.max_len for c in translator.configs if c.position_encoding == "learned"]
  if learned:
    for i, ids in enumerate(target_ids):
      if len(ids) > min(learned):
        raise errors.BadValue(
          f"Target line {i + 1} has {len(ids)} tokens; the model's learned positions reach "
          f"{min(learned)}: shorten or split that line."
        )
  return score_ids(translator, encoded, target_ids)


def _pair_score(translator: Translator, logprob: float, tokens: int) -> PairScore:
  lp = float(beam_search.penalty(tokens, translator.alpha, translator.length_penalty))
  per_token = logprob / tokens if tokens else math.nan
  return PairScore(logprob, tokens, per_token, logprob / lp)


def _score_batch(
  translator: Translator, sources: list[Sequence[int]], targets: list[Sequence[int]]
) -> np.ndarray:
  """float32 [len(sources)]: summed target log-probs of one batch, padded like
  `Translator.padded_batch` (rows to a multiple of the devices, lengths to buckets)."""
  config = translator.model_config
  rows = bucket_length(translator.batch_size, translator.mesh.devices.size)
  src_len = bucket_length(max(len(s) for s in sources))
  tgt_len = bucket_length(max(max(len(t) for t in targets), 1))
  inputs = np.full((rows, src_len), config.pad_id, np.int32)
  targets_out = np.full((rows, tgt_len), config.pad_id, np.int32)
  targets_in = np.full((rows, tgt_len), config.pad_id, np.int32)
  lengths = np.zeros((rows,), np.int32)
  for row, (source, target) in enumerate(zip(sources, targets)):
    inputs[row, : len(source)] = source
    targets_out[row, : len(target)] = target
    targets_in[row, 0] = config.decoder_start_id
    targets_in[row, 1 : len(target)] = target[:-1]
    lengths[row] = len(target)
  # Padding rows get a one-token source, so that no row attends over nothing (their sums
  # are dropped below).
  inputs[len(sources) :, 0] = config.eos_id
  with jax.set_mesh(translator.mesh):
    on_mesh = [
      sharding.global_batch_from_host(x, translator.mesh)
      for x in (inputs, targets_in, targets_out, lengths)
    ]
    sums = sequence_log_probs(
      translator.params,
      *on_mesh,
      config=translator.decoder_config,
      forced_first_id=translator.forced_first_id,
    )
  return sharding.to_host(sums)[: len(sources)]


def format_scores(scores: Sequence[PairScore]) -> str:
  """TSV rows `line_index<TAB>logprob<TAB>tokens<TAB>per_token<TAB>score`, in input order;
  numbers with 6 decimals."""
  return "".join(
    f"{i}\t{s.logprob:.6f}\t{s.tokens}\t{s.per_token:.6f}\t{s.score:.6f}\n"
    for i, s in enumerate(scores)
  )

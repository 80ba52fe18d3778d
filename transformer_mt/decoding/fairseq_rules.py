"""fairseq-generate's rules for beam search's "fairseq" candidate pool (beam_search's module
docstring): its length rules on the step's log-probabilities, its finished set (the first
beam_size hypotheses to finish, not the best) and its final sort. Apart from the search because
they are one codebase's conventions, checked against a transcription of fairseq 0.9's
SequenceGenerator (tests/test_beam_search.py, `fairseq_reference`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def fairseq_length_rules(
  log_probs: jax.Array, step: jax.Array, max_lengths: jax.Array, eos_id: int
) -> jax.Array:
  """log_probs float32 [batch, beam, vocab] under fairseq's length rules, applied after the
  log-softmax as fairseq applies them: EOS is -inf at the first step (min_len 1), and every
  token but EOS is -inf at the step that reaches the sentence's maximum length, so the
  hypotheses still live there end with EOS. The second rule wins where both apply (a
  maximum length of 1). step int32 []: tokens generated so far; max_lengths int32 [batch]."""
  is_eos = jnp.arange(log_probs.shape[-1]) == eos_id  # [vocab]
  at_max = (step + 1 >= max_lengths)[:, None, None]  # [batch, 1, 1]
  allowed = jnp.where(at_max, is_eos, ~is_eos | (step > 0))  # [batch, 1, vocab]
  return jnp.where(allowed, log_probs, NEG_INF)


def first_finished(flags: jax.Array, beam_size: int) -> jax.Array:
  """int32 [batch, beam]: each row's indices of its first beam_size True entries in order,
  then of its first False ones, for flags bool [batch, n] (top_k puts the lower index first
  on ties). Over the held finished set followed by the step's candidates in rank order, that
  is fairseq's finalize_hypos: hypotheses are appended in the order they finish while fewer
  than beam_size are held, and the empty slots stay last."""
  return jax.lax.top_k(flags.astype(jnp.int32), beam_size)[1]


def sorted_by_score(state: Any) -> Any:
  """The finished set of `state` (a beam_search.BeamState) sorted by score, descending, ties
  in their order (Python's stable sort, as fairseq sorts its finished hypotheses at the end);
  -inf (empty) slots last."""
  batch_index = jnp.arange(state.finished_scores.shape[0])[:, None]  # [batch, 1]
  scores, order = jax.lax.top_k(state.finished_scores, state.finished_scores.shape[1])
  return state.replace(
    finished_seqs=state.finished_seqs[batch_index, order],
    finished_scores=scores,
    finished_flags=state.finished_flags[batch_index, order],
    finished_log_probs=state.finished_log_probs[batch_index, order],
  )

"""Plain float64 references that tests/test_beam_search.py compares beam search with, on its toy
vocabulary: brute-force enumeration of every hypothesis, a transcription of the three candidate
pools ("beam", "2beam", "hf"), and one of fairseq 0.9's SequenceGenerator. Independent of
transformer_mt's decoding (NumPy and Python only); a helper, not a test module.
"""

import itertools

import numpy as np

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID

# The toy models' vocabulary: PAD, BOS, EOS and the content tokens 3 and 4.
VOCAB = 5
CONTENT = (3, 4)


def log_softmax(x):
  x = np.asarray(x, np.float64)
  m = np.max(x, axis=-1, keepdims=True)
  return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def sequence_log_prob(table, seq):
  log_probs = log_softmax(table)
  fed = [BOS_ID] + list(seq)
  total = 0.0
  for t, token in enumerate(seq):
    context = (fed[t],) if table.ndim == 2 else (BOS_ID if t == 0 else fed[t - 1], fed[t])
    total += log_probs[context][token]
  return total


def divisor(length, alpha, kind="gnmt"):
  """lp(len) in float64: GNMT ((5 + len) / 6) ** alpha, or transformers' len ** alpha."""
  return length**alpha if kind == "power" else ((5 + length) / 6) ** alpha


def brute_force(table, max_length, alpha, kind="gnmt", fairseq=False):
  """Every hypothesis, best first: ends in EOS, or has max_length tokens without EOS.
  fairseq: ends in EOS and has at least one token before it (min_len 1).

  len counts the generated tokens including EOS, as in beam_search.
  """
  hypotheses = []
  for n in range(2 if fairseq else 1, max_length + 1):
    for prefix in itertools.product(CONTENT, repeat=n - 1):
      endings = [EOS_ID] + (list(CONTENT) if n == max_length and not fairseq else [])
      for last in endings:
        seq = prefix + (last,)
        score = sequence_log_prob(table, seq) / divisor(n, alpha, kind)
        hypotheses.append((score, seq))
  hypotheses.sort(key=lambda h: -h[0])
  return hypotheses


def reference_search(table, beam, max_length, alpha, kind, pool):
  """A plain transcription of the three candidate pools (float64, no early stop, all steps):
  the finished hypotheses as [(score, seq)], best first.

  Candidates are listed parent by parent, token by token, and sorted stably, which breaks
  ties as top_k does (lower flat index first).
  """
  log_probs = log_softmax(table)
  live = [((), 0.0)]  # (seq, log-prob), best first
  finished = []  # (score, seq), best first
  for step in range(max_length):
    length = step + 1
    candidates = []
    for seq, log_prob in live:
      fed = (BOS_ID,) + seq
      context = (fed[-1],) if table.ndim == 2 else ((fed[-2] if step else BOS_ID), fed[-1])
      for token in range(VOCAB):
        if np.isfinite(log_probs[context][token]):
          candidates.append((seq + (token,), log_prob + log_probs[context][token]))
    candidates.sort(key=lambda c: -c[1])
    top = candidates[: beam if pool == "beam" else 2 * beam]
    ends = [seq[-1] == EOS_ID or length == max_length for seq, _ in top]
    for rank, ((seq, log_prob), end) in enumerate(zip(top, ends)):
      if end and (pool != "hf" or rank < beam):
        finished.append((log_prob / divisor(length, alpha, kind), seq))
    finished = sorted(finished, key=lambda f: -f[0])[:beam]  # stable: earlier ones first
    live = [c for c, end in zip(top, ends) if not end][:beam]
  return finished


# Random second-order tables (beam 2, max length 5, lenpen 1) where "fairseq" returns
# another best hypothesis than both "2beam" and "hf", by each of its rules: seeds 1 and 60
# keep the first two hypotheses to finish, though a better one finishes later; seed 8 may not
# end at the first step; seed 53 ends at the length limit with EOS, not with a forced finish.


def fairseq_reference(table, beam, max_length, lenpen):
  """fairseq 0.9's SequenceGenerator with search.BeamSearch, as fairseq-generate runs it by
  default (min_len 1, max_len_a 0, normalize_scores, unk_penalty 0), transcribed in plain
  Python for one sentence: the finalized hypotheses as [(score, seq)], sorted as it sorts
  them. A hypothesis has at most max_length tokens, EOS included: fairseq's max_len is
  max_length - 1, the tokens before EOS.

  Candidates are listed beam by beam, token by token, and sorted stably, which breaks ties
  as top_k does (lower flat index first).
  """
  table_log_probs = log_softmax(table)
  max_len = max_length - 1
  beams = [((), 0.0)]  # (seq, summed log-prob); step 0 extends the first beam only
  finalized = []  # (score, seq), in the order they finish
  for step in range(max_len + 1):  # "one extra step for EOS marker"
    candidates = []
    for seq, log_prob in beams:
      fed = (BOS_ID,) + seq
      context = (fed[-1],) if table.ndim == 2 else ((fed[-2] if step else BOS_ID), fed[-1])
      lprobs = table_log_probs[context].copy()  # masked after the log-softmax, as fairseq does
      if step >= max_len:  # the max length constraint: EOS only
        lprobs[np.arange(VOCAB) != EOS_ID] = -np.inf
      if step < 1:  # min_len 1
        lprobs[EOS_ID] = -np.inf
      candidates += [(log_prob + lprobs[token], seq + (token,)) for token in range(VOCAB)]
    candidates = sorted(candidates, key=lambda c: -c[0])[: 2 * beam]  # cand_size = 2 * beam
    eos = [seq[-1] == EOS_ID and log_prob > -np.inf for log_prob, seq in candidates]
    # Only an EOS among the top beam_size is finalized, while fewer than beam are held.
    for (log_prob, seq), is_eos in zip(candidates[:beam], eos[:beam]):
      if is_eos and len(finalized) < beam:
        finalized.append((log_prob / (step + 1) ** lenpen, seq))
    if len(finalized) == beam or step == max_len:  # is_finished
      break
    # The active hypotheses: the first beam_size candidates that are not EOS.
    beams = [(seq, log_prob) for (log_prob, seq), is_eos in zip(candidates, eos) if not is_eos]
    beams = beams[:beam]
  return sorted(finalized, key=lambda f: f[0], reverse=True)  # stable: ties in finish order

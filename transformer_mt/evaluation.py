"""Corpus BLEU with sacreBLEU on detokenized text (never a hand-written BLEU)."""

from __future__ import annotations

from typing import Sequence

import sacrebleu


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """sacreBLEU score (0-100) of line-aligned hypotheses against one reference each,
  and the signature that makes the number reproducible."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: "
                     "translations must be line-aligned with the references.")
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(metric.get_signature())

"""transformer_base_wmt14_enfr: the paper's Base model, WMT14 English -> French.

As transformer_base_wmt14_ende (d 512, 8 heads, dropout 0.1, 100k steps, average of the
last 5 checkpoints) with a shared 32k vocabulary: 60.51M parameters with tied embeddings.
Validation newstest2013, test newstest2014.

Paper: 38.1 BLEU (tokenized). The paper-comparable BLEU splits compounds as for EN-DE, like
the EN-FR rows the paper compares with (see
transformer_mt/evaluation/corpus_scores.py). Estimate: `run.py list` (A100-hours for the row's
dtype) and `run.py reproduce ... --dry-run` (the formula).

    python run.py train --experiment transformer_base_wmt14_enfr --workdir workdirs/base_enfr
"""

from transformer_mt.config import wmt14 as _wmt14


def get_config():
  config = _wmt14.paper_config("base", "fr")
  config.description = "Paper's Transformer Base, WMT14 EN->FR via TFDS (paper: 38.1 BLEU)"
  return config

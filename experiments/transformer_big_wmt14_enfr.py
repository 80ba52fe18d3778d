"""transformer_big_wmt14_enfr: the paper's Big model, WMT14 English -> French.

As transformer_big_wmt14_ende (d 1024, 16 heads, 300k steps, average of the last 20
checkpoints) but with dropout 0.1 (as the paper used for EN-FR) and a shared 32k
vocabulary: 209.11M parameters with tied embeddings. Validation newstest2013, test
newstest2014.

Paper: 41.0 BLEU (tokenized; 41.8 in the paper's later revision). The paper-comparable BLEU
splits compounds as for EN-DE, like the EN-FR rows the paper compares with (see
transformer_mt/evaluation/corpus_scores.py). Estimate: `run.py list` (A100-hours for the row's
dtype) and `run.py reproduce ... --dry-run` (the formula).

    python run.py train --experiment transformer_big_wmt14_enfr --workdir workdirs/big_enfr
"""

from transformer_mt.config import wmt14 as _wmt14


def get_config():
  config = _wmt14.paper_config("big", "fr")
  config.description = "Paper's Transformer Big, WMT14 EN->FR via TFDS (paper: 41.0 BLEU)"
  return config

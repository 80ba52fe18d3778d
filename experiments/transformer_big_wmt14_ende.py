"""transformer_big_wmt14_ende: the paper's Big model, WMT14 English -> German.

d 1024, 16 heads, d_ff 4096, 6+6 post-LN layers, dropout 0.3, label smoothing 0.1, warmup
4000, 300k steps of ~25k + 25k tokens; shared 37k BPE vocabulary, tied embeddings:
214.23M parameters (paper: 213M). Decoding: beam 4, alpha 0.6, source length + 50;
average of the last 20 checkpoints; validation newstest2013, test newstest2014.

Paper: 28.4 BLEU (tokenized, compound-split). Hardware: the paper used 8 P100 GPUs for
3.5 days. Our estimate: `run.py list` (A100-hours for the row's dtype) and
`run.py reproduce ... --dry-run` (the formula and its numbers).

    python run.py train --experiment transformer_big_wmt14_ende --workdir workdirs/big_ende
"""

from transformer_mt.config import wmt14 as _wmt14


def get_config():
  config = _wmt14.paper_config("big", "de")
  config.description = "Paper's Transformer Big, WMT14 EN->DE via TFDS (paper: 28.4 BLEU)"
  return config

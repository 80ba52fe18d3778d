"""transformer_base_wmt14_ende: the paper's Base model, WMT14 English -> German.

d 512, 8 heads, d_ff 2048, 6+6 post-LN layers, dropout 0.1, label smoothing 0.1, warmup
4000, 100k steps of ~25k + 25k tokens; shared 37k BPE vocabulary, tied embeddings:
63.07M parameters (paper: 65M). Decoding: beam 4, alpha 0.6, source length + 50; average
of the last 5 checkpoints; validation newstest2013, test newstest2014.

Paper: 27.3 BLEU (tokenized, compound-split). Hardware: the paper used 8 P100 GPUs for
12 hours. Our estimate: `run.py list` (A100-hours for the row's dtype) and
`run.py reproduce ... --dry-run` (the formula and its numbers).

    python run.py train --experiment transformer_base_wmt14_ende --workdir workdirs/base_ende
"""

from transformer_mt.config import wmt14 as _wmt14


def get_config():
  config = _wmt14.paper_config("base", "de")
  config.description = "Paper's Transformer Base, WMT14 EN->DE via TFDS (paper: 27.3 BLEU)"
  return config

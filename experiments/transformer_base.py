"""transformer_base: the paper's Base architecture (d 512, 8 heads, d_ff 2048, 6+6 layers).

Shared 37k SentencePiece vocabulary with tied embeddings: 63.1M parameters (the paper
reports 65M). WMT input is not wired into this version yet, so this entry fixes the
architecture and optimizer settings only; `run.py train` on it stops with a message
naming the missing data source. The paper: 27.3 BLEU EN-DE, 38.1 EN-FR (newstest2014).
"""

from experiments import _defaults


def get_config():
  config = _defaults.base_config()
  config.description = "Paper's Transformer Base architecture (WMT data source not available yet)"
  config.data.source = "wmt14_translate"
  config.data.max_len = 256
  config.tokenizer.vocab_size = 37_000
  config.train.update(num_steps=100_000, warmup_steps=4000, label_smoothing=0.1)
  return config

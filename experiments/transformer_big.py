"""transformer_big: the paper's Big architecture (d 1024, 16 heads, d_ff 4096, 6+6 layers).

Dropout 0.3, shared 37k vocabulary with tied embeddings: 214.2M parameters (the paper
reports 213M). WMT input is not wired into this version yet, so this entry fixes the
architecture only; `run.py train` on it stops with a message naming the missing data
source. The paper: 28.4 BLEU EN-DE, 41.0 EN-FR (newstest2014).
"""

from experiments import transformer_base


def get_config():
  config = transformer_base.get_config()
  config.description = "Paper's Transformer Big architecture (WMT data source not available yet)"
  config.model.update(d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3)
  config.train.num_steps = 300_000
  return config

"""transformer_big: the paper's Big architecture (d 1024, 16 heads, d_ff 4096, 6+6 layers).

Dropout 0.3, shared 37k vocabulary with tied embeddings: 214.23M parameters (the paper
reports 213M), 300k steps, otherwise as transformer_base (WMT14 EN->DE via TFDS).
The paper: 28.4 BLEU EN-DE, 41.0 EN-FR (newstest2014).

    python run.py train --experiment transformer_big --workdir workdirs/big_ende
"""

from experiments import transformer_base


def get_config():
  config = transformer_base.get_config()
  config.description = "Paper's Transformer Big, WMT14 EN->DE via TFDS (needs the prepared dataset)"
  config.model.update(d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3)
  config.train.num_steps = 300_000
  return config

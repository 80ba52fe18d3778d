"""news_ende_small: a small EN->DE Transformer on the ~28k WMT news pairs in ../shared/data.

Trains on every EN-DE news test set except the dev and test years (news-test2008,
newssyscomb2009, newstest2009-2012 and 2015-2020: 28,158 pairs), reports validation
loss on newstest2013 and sacreBLEU (greedy) on the full newstest2014 (3003 lines).
A CPU-sized check that the real-text path works end to end; 28k pairs are far too
few for a good model, so expect single-digit BLEU.

    python run.py train --experiment news_ende_small --workdir workdirs/news_ende_small

Hardware: 2 CPU cores (see the README's results table for what N minutes give).
"""

from transformer_mt.config import defaults as _defaults
from transformer_mt.config.search_space import Sweep, choice, uniform
from transformer_mt.data.sources import HOW_TO_GET_NEWS

TRAIN_SETS = ["news-test2008", "newssyscomb2009"] + [
  f"newstest{year}" for year in (2009, 2010, 2011, 2012, 2015, 2016, 2017, 2018, 2019, 2020)
]


def get_config():
  config = _defaults.base_config()
  config.description = "Small EN->DE Transformer on the 28k shared news pairs; BLEU on newstest2014"
  config.model.update(
    d_model=256,
    num_heads=4,
    d_ff=1024,
    num_encoder_layers=3,
    num_decoder_layers=3,
    dropout_rate=0.1,
  )
  config.data.update(
    source="local",
    source_lang="en",
    target_lang="de",
    max_len=128,
    train_prefixes=[f"news/en-de/{name}" for name in TRAIN_SETS],
    validation_prefixes=["news/en-de/newstest2013"],
    test_prefixes=["news/en-de/newstest2014"],
    how_to_get=HOW_TO_GET_NEWS,
  )
  config.tokenizer.update(vocab_size=8000, model_type="unigram", sample_size=60_000)
  config.train.update(
    num_steps=3000,
    batch_tokens=4096,
    warmup_steps=1000,
    lr_scale=1.0,
    log_every=50,
    eval_every=500,
    bleu_every=1000,
    bleu_sentences=500,
    checkpoint_every=500,
    keep_checkpoints=5,
  )
  config.decode.update(max_len=256, batch_size=64)
  return config


def get_sweep():
  """A random search over regularization (3 draws) at two learning-rate scales.

  `run.py sweep --experiment news_ende_small --workdir W train.num_steps=2000`
  """
  return Sweep(
    grid={"train.lr_scale": [1.0, 2.0]},
    random={
      "model.dropout_rate": uniform(0.0, 0.3),
      "train.label_smoothing": choice(0.0, 0.1, 0.2),
    },
    num_random=3,
    seed=0,
  )

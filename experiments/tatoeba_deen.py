"""tatoeba_deen: a small DE->EN Transformer on the 17,565 Tatoeba pairs in ../shared/data.

Real language on a laptop: one command, 2 CPU cores, under 30 minutes from raw text to a
held-out sacreBLEU (tokenizer training, training and the final beam-4 test included).

The one file pair tatoeba/deu-eng.{deu,eng} (Tatoeba test v2021-08-07) is cut into 1000
held-out test pairs, 500 validation pairs and 16,065 training pairs by `split_indices`
(transformer_mt/data/sources.py): a seeded hash of each German sentence orders the sentences,
and a sentence with several English translations goes whole to one split, so no test or
validation source is ever trained on. Tatoeba sentences are short (a 4000-piece joint
vocabulary gives 12 tokens at the median, 45 at the 99th percentile, 93 at the 99.9th), so
64-token rows drop well under 1% of the training pairs (the longest; test sentences are never
dropped) and a small model sees the 16k pairs many times in half an hour. Validation loss
every 100 steps and validation BLEU (beam 4, all 500 sentences) every 200 keep the best
checkpoint in WORKDIR/best; the final held-out BLEU is of the last step's parameters.

    python run.py train --experiment tatoeba_deen --workdir workdirs/tatoeba_deen

Hardware: 2 CPU cores (see the README's results table for what N minutes give).
"""

from transformer_mt.config import defaults as _defaults


def get_config():
  config = _defaults.base_config()
  config.description = (
    "Small DE->EN Transformer on 16k Tatoeba pairs; BLEU on 1000 held-out pairs (~24 min)"
  )
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
    source_lang="deu",
    target_lang="eng",
    max_len=64,
    split_prefixes=["tatoeba/deu-eng"],
    test_size=1000,
    validation_size=500,
    split_seed=0,
  )
  config.tokenizer.update(vocab_size=8000, model_type="unigram", sample_size=40_000)
  config.train.update(
    num_steps=800,
    batch_tokens=4096,
    # Peak LR 0.7 * 256^-0.5 * 400^-0.5 = 2.2e-3 at step 400, 1.6e-3 at step 800. Dropout 0.3
    # with a 4000-piece vocabulary learned far more slowly in the first 400 steps (validation
    # BLEU 4.9 at step 400); dropout 0.1 and 8000 pieces are what news_ende_small uses.
    warmup_steps=400,
    lr_scale=0.7,
    label_smoothing=0.1,
    log_every=25,
    eval_every=100,
    bleu_every=200,
    bleu_sentences=500,
    checkpoint_every=200,
    keep_checkpoints=2,
  )
  config.decode.update(beam_size=4, max_len=128, batch_size=100)
  return config

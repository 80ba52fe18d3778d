"""Multi30k task 1 EN->DE (WMT16 multimodal, text only): the published Transformer-tiny
recipe of Wu et al. (ACL 2021), shared by the registry rows transformer_tiny_multi30k_ende
(the recipe itself) and multi30k_ende (the one-hour laptop row built on it). Each deviation
from the published recipe is named, with its reason, in
experiments/transformer_tiny_multi30k_ende.py.

Data: ../shared/data/multi30k, the official lowercased, punctuation-normalized,
Moses-tokenized `lc.norm.tok` files (train 29,000, val 1,014, test_2016_flickr 1,000 pairs),
scored with multi-bleu.perl on those tokens (`evaluate.bleu="tokenized"`). The published
figure comes from fairseq-generate's own BLEU (fairseq/bleu.py's Scorer, on the words after
--remove-bpe): multi-bleu.perl's n-gram counts and brevity penalty, except that an unknown word
never matches (docs/multi30k.md#the-published-metric).
"""

import math

import ml_collections

from transformer_mt.config import defaults as _defaults

# Updates per epoch of the published run: 29,000 pairs at ~6,900 target tokens an update.
UPDATES_PER_EPOCH = 62
PUBLISHED_BLEU = 41.02
# Where the files come from, said when they are missing (`data.how_to_get`).
HOW_TO_GET = (
  "The Multi30k task 1 files come from the public multi30k/dataset repository "
  "(https://github.com/multi30k/dataset): the lc.norm.tok files are its data/task1/tok, made "
  "by its scripts/task1-tokenize.sh (lowercased, punctuation-normalized, Moses-tokenized) from "
  "the raw text in data/task1/raw (gzipped): copy {train,val,test_2016_flickr}.lc.norm.tok."
  "{en,de} into DIR/multi30k/ for data.root=DIR. See docs/multi30k.md."
)
PUBLISHED_SOURCE = (
  "Wu et al. (ACL 2021), text-only Transformer-tiny: fairseq-generate's BLEU (multi-bleu.perl's "
  "counts; unknown words never match) on the lowercased, tokenized test2016 "
  "(71.0/47.5/34.3/24.5, BP 0.999)"
)


def published_config() -> ml_collections.ConfigDict:
  """The published recipe on the lc.norm.tok files, as faithfully as the project allows."""
  config = _defaults.base_config()
  config.paper_bleu = PUBLISHED_BLEU
  config.paper_bleu_source = PUBLISHED_SOURCE
  config.model.update(
    d_model=128,
    num_heads=4,
    d_ff=256,
    num_encoder_layers=4,
    num_decoder_layers=4,
    layer_norm_position="post",
    activation="relu",
    # fairseq's SinusoidalPositionalEmbedding: sines then cosines, at positions counted from
    # padding_idx + 1 = 2.
    position_encoding="sinusoidal_fairseq",
    position_offset=2,
    layer_norm_epsilon=1e-5,
    # fairseq's MultiheadAttention: xavier_uniform_(gain=1/sqrt(2)) for Q, K and V.
    qkv_init_gain=2**-0.5,
    scale_embeddings=True,
    share_embeddings=True,
    dropout_rate=0.3,
    attention_dropout_rate=0.0,
    relu_dropout_rate=0.0,
  )
  config.data.update(
    source="local",
    source_lang="en",
    target_lang="de",
    max_len=64,
    train_prefixes=["multi30k/train.lc.norm.tok"],
    validation_prefixes=["multi30k/val.lc.norm.tok"],
    test_prefixes=["multi30k/test_2016_flickr.lc.norm.tok"],
    how_to_get=HOW_TO_GET,
  )
  config.tokenizer.update(vocab_size=9712, model_type="bpe", sample_size=58_000)
  config.train.update(
    num_steps=8000,
    batch_tokens=7296,
    schedule="rsqrt",
    warmup_steps=2000,
    lr_scale=5e-3 * math.sqrt(128 * 2000),
    adam_b1=0.9,
    adam_b2=0.98,
    adam_eps=1e-8,
    label_smoothing=0.1,
    # fairseq 0.9's default --clip-norm.
    grad_clip_norm=25.0,
    log_every=UPDATES_PER_EPOCH,
    eval_every=UPDATES_PER_EPOCH,
    patience=10,
    bleu_every=10 * UPDATES_PER_EPOCH,
    bleu_sentences=0,
    checkpoint_every=UPDATES_PER_EPOCH,
    keep_checkpoints=10,
  )
  config.evaluate.average_last = 10
  config.evaluate.bleu = "tokenized"
  # fairseq-generate's beam search with its defaults (--beam 5, --lenpen 1, --max-len-a 0
  # --max-len-b 200, --min-len 1): score = log-prob / len, the first 5 hypotheses to finish
  # kept, at most 200 tokens and EOS for every sentence whatever its source length (an
  # extra_len of 201 never binds below max_len; the sinusoidal positions have no end).
  config.decode.update(
    beam_size=5,
    alpha=1.0,
    length_penalty="power",
    candidate_pool="fairseq",
    max_len=201,
    extra_len=201,
    batch_size=128,
  )
  return config

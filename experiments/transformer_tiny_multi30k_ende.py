"""transformer_tiny_multi30k_ende: Wu et al. (ACL 2021)'s text-only Transformer-tiny on
Multi30k task 1 EN->DE, the published 41.02 test2016 BLEU, as faithfully as we can.

Published recipe (LividWo/Revisit-MMT README-baseline.md, fairseq 0.9 `transformer_tiny`):
the lowercased, punctuation-normalized, Moses-tokenized `lc.norm.tok` files; joint BPE of
10,000 merges (a 9,712-entry dictionary); source, target and output embeddings shared;
post-LN, 4 + 4 layers, d_model 128, FFN 256, 4 heads, ReLU, sinusoidal positions, embeddings
scaled by sqrt(d_model), dropout 0.3 (attention and ReLU dropout 0); label smoothing 0.1;
Adam (0.9, 0.98), eps 1e-8, no weight decay; inverse square root with a linear warm-up to
5e-3 over 2000 updates; `--max-tokens 4096` on 2 GPUs (~6,900 target tokens, 62 updates an
epoch); 8000 updates, stopping after 10 epochs without a better validation loss; the average
of the last 10 epoch checkpoints, beam 5, length penalty 1.0, multi-bleu.perl on the
tokenized lowercased test2016: 41.02.

    python run.py reproduce --experiment transformer_tiny_multi30k_ende \
      --workdir workdirs/multi30k_tiny

Deviations, each because the project does it another way:
  * SentencePiece BPE with a 9,712-piece vocabulary (the published dictionary's size)
    trained on both sides of the training text, instead of subword-nmt's 10,000 merges: the
    project's one tokenizer. Pieces differ; the vocabulary size does not.
  * An "epoch" is 62 updates (the published updates per epoch), and a checkpoint is written
    every 62 updates: the pipeline packs pairs into rows of target slots and streams over
    reshuffled epochs, so update boundaries do not fall on epoch boundaries.
  * 114 packed rows of 64 tokens (7,296 target slots) per update, which hold ~6,930 target
    tokens (95% full) and 62 updates an epoch: fairseq's max-tokens counts padded sentences
    of similar length instead.
  * The warm-up starts at 0, not 1e-7; from update 2000 on the rate is the same
    5e-3 * sqrt(2000 / update) (lr_scale = 5e-3 * sqrt(128 * 2000)).
  * Beam search's candidate pool is "2beam" (2 x beam candidates per step, as fairseq) and
    a sentence ends when no live beam can beat its finished ones; fairseq 0.9 ends a
    sentence once `beam` hypotheses have finished.
"""

from transformer_mt.config import multi30k as _multi30k


def get_config():
  config = _multi30k.published_config()
  config.description = (
    "Wu et al. 2021 Transformer-tiny, Multi30k EN->DE (published: 41.02 test2016 BLEU)"
  )
  return config

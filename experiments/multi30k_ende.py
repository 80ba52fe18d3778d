"""multi30k_ende: the laptop row of Multi30k EN->DE: the published Transformer-tiny
(transformer_tiny_multi30k_ende) recipe made to fit one hour of 2 CPU cores, tokenizer,
training, checkpoint averaging and the final test2016 evaluation included, scored with
multi-bleu.perl on the lowercased tokenized text (`evaluate.bleu`): the published metric but
for unknown words (transformer_tiny_multi30k_ende's docstring).

    python run.py train --experiment multi30k_ende --workdir workdirs/multi30k_ende

Its goal of >= 41.0 test2016 BLEU in <= 60 minutes on 2 idle cores (issue 33) is withdrawn
(issue 41): 41.0 needs ~35M target tokens of the published recipe, twice what an hour holds
(docs/multi30k.md#the-one-hour-goal-withdrawn); the row stays as measured. Validation (val,
1,014 sentences) decided every choice; test2016 is read by final runs only.

What changes from the published recipe, and why: an hour on 2 cores is ~16M target tokens,
about 37 epochs, where the published run trained 98 (up to 129 allowed by its 8000 updates;
its patience stopped it at update 6076). So the learning rate decays along a
cosine to 0 at the last step instead of as update^-0.5 (a short run ends on the inverse
square root at ~80% of its peak; see tatoeba_deen's search, where the cosine helped), and
batches hold half the target slots (4,096: ~3,900 tokens), for twice the updates per epoch.
The peak is 3.5e-3 (5e-3 scaled by the square root of the batch ratio), reached after 800
updates. The average of the last 5 checkpoints, 250 updates apart, is the final model.

It decodes as the row it is built on, fairseq-generate's beam search (beam 5, lenpen 1, at most
200 tokens and EOS; transformer_tiny_multi30k_ende's docstring), since it is measured against
that row's published figure, which this rule produced. The figures below were decoded
before, with the "2beam" pool (the best 5 finished by score kept) and a cap of source length
+ 50 tokens.

The ablation so far (docs/multi30k.md has the commands and loads). Validation BLEU (tokenized,
val, beam 5) at ~49 minutes of training, ~16-17M target slots: every recipe here trains at
~5.7-5.9k target slots/s on 2 idle cores, so equal tokens is equal wall time. The noise is the
first two rows: 0.4 between averaged models of two seeds, 0.9 between single checkpoints.

    choice                                        validation BLEU / step cost    kept
    this recipe, seed 0 (709053c)                 38.63 (averaged 38.81)         baseline
    this recipe, seed 1                           39.50 (averaged 39.21)         (noise)
    the published recipe (inverse sqrt, 7,296     39.71 at update 2480 (17.2M    no: +1.1 single,
      slots, peak 5e-3, fairseq's details)          tokens, single checkpoint)     inside the noise
                                                                                   of seed 1
    a 6,000-piece vocabulary, 4,600 steps         39.10 (averaged 39.13); its    no: inside
      (its step is 0.88-0.91x as long)              step 0.88-0.91x                the noise
    no dropout                                    step -5 to -10% (BLEU not run) no (not trained)
    bf16 matmuls (XLA:CPU, avx512_bf16)           output-layer matmul 1.45-1.6x  no
                                                    slower than f32
    2 host devices, data=2 (XLA:CPU)              +10-14% loaded, none idle      no
    rbg / unsafe_rbg dropout RNG                  nothing measurable             no
    XLA:CPU flags (legacy runtime, oneDNN,        step 0.94-1.04x                no
      XNNPACK, fast math; see docs/reports)

None reaches the 42-43 validation BLEU that 41.0 on test2016 needs (the published row's
test2016 was 1.9 below its validation): the published recipe got there only past ~35M target
tokens, twice what an hour holds.

Raw text (cased, detokenized; cased sacreBLEU on the raw test2016): 38.20 at 5b316c3, beside
37.83 on the lowercased tokenized text (other text, other metric; docs/multi30k.md#raw-text):

    python run.py train --experiment multi30k_ende --workdir workdirs/multi30k_ende_raw \\
      "data.train_prefixes=['multi30k/train']" "data.validation_prefixes=['multi30k/val']" \\
      "data.test_prefixes=['multi30k/test_2016_flickr']" evaluate.bleu=sacrebleu
"""

import math

from transformer_mt.config import multi30k as _multi30k


def get_config():
  config = _multi30k.published_config()
  # The Transformer's own details rather than fairseq's (the published row's); measured so
  # (commit 709053c, validation 38.63, test2016 37.83) before the published row took fairseq's.
  config.model.update(
    position_encoding="sinusoidal",
    position_offset=0,
    layer_norm_epsilon=1e-6,
    qkv_init_gain=1.0,
  )
  config.description = (
    "Multi30k EN->DE on 2 CPU cores in an hour: Transformer-tiny, cosine decay, averaged"
  )
  num_steps = 4000
  config.train.update(
    num_steps=num_steps,
    batch_tokens=4096,
    schedule="cosine",
    grad_clip_norm=0.0,
    warmup_steps=800,
    # Peak 3.5e-3 at step 800: lr_scale * 128^-0.5 * 800^-0.5.
    lr_scale=3.5e-3 * math.sqrt(128 * 800),
    log_every=50,
    eval_every=250,
    patience=0,
    bleu_every=1000,
    checkpoint_every=250,
    keep_checkpoints=5,
  )
  config.evaluate.average_last = 5
  return config

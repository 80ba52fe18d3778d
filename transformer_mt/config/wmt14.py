"""The paper's WMT14 settings (Vaswani et al. 2017, section 5 and table 3), shared by the
four registry rows transformer_{base,big}_wmt14_{ende,enfr}.

Accelerator-time estimates are computed, not written here: `run.py list` shows each row's
A100-hours and `run.py reproduce --experiment ROW --workdir DIR --dry-run` the formula
(6 x parameters x tokens per update), its numbers and the peak of the dtype the row
computes in on an accelerator; see transformer_mt/model/estimates.py.

Precision: model.dtype="auto" computes in bfloat16 on GPU/TPU (float32 parameters, Adam
state and gradients; float32 LayerNorm statistics, attention softmax, logits and loss) and
in float32 on CPU. `model.dtype=float32` (or `bfloat16`) on the command line overrides it.
"""

import ml_collections

from transformer_mt.config import defaults as _defaults

SIZES = {
  # d_model, d_ff, heads, steps, average of the last N checkpoints.
  "base": dict(d_model=512, d_ff=2048, num_heads=8, steps=100_000, average_last=5),
  "big": dict(d_model=1024, d_ff=4096, num_heads=16, steps=300_000, average_last=20),
}
# Shared SentencePiece vocabulary per pair (the paper: 37k BPE for EN-DE, 32k word pieces for
# EN-FR).
VOCAB = {"de": 37_000, "fr": 32_000}
# The paper's newstest2014 BLEU (table 2), shown beside ours by `run.py report`.
PAPER_BLEU = {("base", "de"): 27.3, ("big", "de"): 28.4, ("base", "fr"): 38.1, ("big", "fr"): 41.0}


def paper_config(size: str, target_lang: str) -> ml_collections.ConfigDict:
  """EN -> `target_lang` on TFDS wmt14_translate with the paper's hyperparameters."""
  spec = SIZES[size]
  config = _defaults.base_config()
  # Big EN-FR used dropout 0.1 instead of 0.3.
  dropout = 0.3 if size == "big" and target_lang == "de" else 0.1
  config.model.update(
    d_model=spec["d_model"],
    d_ff=spec["d_ff"],
    num_heads=spec["num_heads"],
    num_encoder_layers=6,
    num_decoder_layers=6,
    layer_norm_position="post",
    dropout_rate=dropout,
    share_embeddings=True,
    # bfloat16 compute on GPU/TPU, float32 on CPU (resolved when the model config is built).
    dtype="auto",
  )
  config.data.update(
    source="tfds",
    tfds_name="wmt14_translate",
    source_lang="en",
    target_lang=target_lang,
    max_len=256,
  )
  config.tokenizer.update(vocab_size=VOCAB[target_lang], model_type="bpe", sample_size=2_000_000)
  # 96 packed rows of 256 tokens: 24,576 target-token slots (and as many source slots) per
  # update, the paper's ~25k + 25k; raise train.grad_accum_steps where devices are few.
  config.train.update(
    num_steps=spec["steps"],
    warmup_steps=4000,
    lr_scale=1.0,
    label_smoothing=0.1,
    adam_b1=0.9,
    adam_b2=0.98,
    adam_eps=1e-9,
    batch_tokens=24_576,
    log_every=100,
    eval_every=5000,
    bleu_every=10_000,
    bleu_sentences=0,
    checkpoint_every=1000,
    keep_checkpoints=spec["average_last"],
  )
  config.decode.update(beam_size=4, alpha=0.6, extra_len=50, max_len=306, batch_size=64)
  config.evaluate.average_last = spec["average_last"]
  config.paper_bleu = PAPER_BLEU[(size, target_lang)]
  config.paper_bleu_source = "Vaswani et al. (2017), table 2: tokenized BLEU on newstest2014"
  return config

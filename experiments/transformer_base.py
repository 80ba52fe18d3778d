"""transformer_base: the paper's Base model on WMT14 EN->DE through TFDS.

d 512, 8 heads, d_ff 2048, 6+6 layers, post-LN, dropout 0.1, label smoothing 0.1, shared
37k SentencePiece vocabulary with tied embeddings: 63.07M parameters (paper: 65M).
~25k target tokens per update (grow train.grad_accum_steps where devices are few),
warmup 4000, 100k steps. Validation on newstest2013, test on newstest2014. The paper:
27.3 BLEU EN-DE (tokenized, beam 4, checkpoint averaging).

Needs the prepared TFDS `wmt14_translate/de-en` (array_record): TFDS downloads and
prepares it on first use where the internet is reachable, or point
data.tfds_data_dir at a copy prepared elsewhere with
`tfds build wmt14_translate/de-en --file_format=array_record --data_dir=DIR`.

    python run.py train --experiment transformer_base --workdir workdirs/base_ende
"""

from experiments import _defaults


def get_config():
  config = _defaults.base_config()
  config.description = "Paper's Transformer Base, WMT14 EN->DE via TFDS (needs the prepared dataset)"
  config.data.update(source="tfds", tfds_name="wmt14_translate", source_lang="en",
                     target_lang="de", max_len=256)
  config.tokenizer.update(vocab_size=37_000, model_type="bpe", sample_size=2_000_000)
  # 96 rows of 256 tokens = 24,576 target-token slots per update.
  config.train.update(num_steps=100_000, warmup_steps=4000, label_smoothing=0.1,
                      batch_tokens=24_576, log_every=100, eval_every=5000, checkpoint_every=5000,
                      keep_checkpoints=5)
  config.decode.update(max_len=306, batch_size=64)
  return config

"""Rows that start from a published checkpoint instead of random weights.

`python run.py reproduce --experiment NAME --workdir DIR` imports the Hugging Face checkpoint
named by `init.from` (`hf:OWNER/NAME`, downloaded with huggingface_hub; `hf:DIR` for a local copy,
e.g. `init.from=hf:/models/opus-mt-en-de`) into DIR/pretrained, fine-tunes it when the row
has training steps, and evaluates on newstest2014 read from local text files
(`../shared/data/news/...`; see docs/data.md for getting them elsewhere), then
writes DIR/results.json for `run.py report`.

The published figures are the model authors' own, measured with their own decoding and
scoring; each row's `paper_bleu_source` says where the figure comes from and what it measures,
so a reader knows how far ours may differ for reasons that are not bugs.
"""

import ml_collections

from transformer_mt.config import defaults as _defaults
from transformer_mt.data.sources import HOW_TO_GET_NEWS


def pretrained_config(
  hub_name: str,
  source_lang: str,
  target_lang: str,
  published_bleu: float | None,
  published_source: str,
  language_codes: tuple[str, str] | None = None,
) -> ml_collections.ConfigDict:
  """Import `hub_name`, then evaluate it on newstest2014 `source_lang`->`target_lang` as it is.

  Args:
    language_codes: the model's own source/target language tags (NLLB `eng_Latn`, mBART
      `en_XX`), for models that have them.
  """
  config = _defaults.base_config()
  config.init["from"] = f"hf:{hub_name}"
  config.description = f"{hub_name} imported, newstest2014 {source_lang}->{target_lang}"
  pair = f"{source_lang}-{target_lang}" if target_lang != "en" else f"{target_lang}-{source_lang}"
  config.data.update(
    source="local",
    source_lang=source_lang,
    target_lang=target_lang,
    test_prefixes=[f"news/{pair}/newstest2014"],
    how_to_get=HOW_TO_GET_NEWS,
  )
  if language_codes:
    config.data.update(source_code=language_codes[0], target_code=language_codes[1])
  # Evaluation only: the import is the model (a fine-tuning row sets its own steps).
  config.train.num_steps = 0
  config.paper_bleu = published_bleu
  config.paper_bleu_source = published_source
  return config


def nllb_3_3b_config(target_lang: str, target_code: str, published_bleu: float):
  """NLLB-200 3.3B from English (eng_Latn) into `target_lang` (`target_code`): the two NLLB
  rows differ only in these."""
  config = pretrained_config(
    "facebook/nllb-200-3.3B",
    "en",
    target_lang,
    published_bleu=published_bleu,
    published_source="project seed table (source not traced; NLLB reports FLORES-200)",
    language_codes=("eng_Latn", target_code),
  )
  config.description = (
    f"NLLB-200 3.3B imported, newstest2014 EN->{target_lang.upper()} "
    f"(target: {published_bleu} BLEU)"
  )
  return config

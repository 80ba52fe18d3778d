"""opus_mt_en_de_newstest2014: Helsinki-NLP/opus-mt-en-de (OPUS-MT, a Marian transformer)
imported and evaluated on newstest2014 EN->DE as it is: the quickest end-to-end check of our
import, beam search, detokenization and scoring against a published model.

    python run.py reproduce --experiment opus_mt_en_de_newstest2014 --workdir workdirs/opus_mt_en_de

Needs the internet once (huggingface_hub downloads ~300 MB); with a local copy, add
`init.from=hf:/path/to/opus-mt-en-de`. Hardware: a CPU is enough (74M parameters; the
3003 sentences take minutes on a GPU, longer on a laptop).

Published figure: the model card (weights opus-2020-02-26, scored with sacreBLEU by the
OPUS-MT authors) lists no newstest2014 score; its neighbours are newstest2013 26.9 and
newstest2015 31.1. To compare with a published number, evaluate on newstest2013:

    python run.py reproduce --experiment opus_mt_en_de_newstest2014 \\
      --workdir workdirs/opus_mt_en_de_2013 "data.test_prefixes=['news/en-de/newstest2013']"
"""

from transformer_mt.config import pretrained as _pretrained


def get_config():
  config = _pretrained.pretrained_config(
    "Helsinki-NLP/opus-mt-en-de",
    "en",
    "de",
    published_bleu=None,
    published_source=(
      "Helsinki-NLP/opus-mt-en-de model card: no newstest2014 score; newstest2013 26.9, "
      "newstest2015 31.1 (sacreBLEU)"
    ),
  )
  config.description = "OPUS-MT en-de (Marian, 74M) imported, newstest2014 EN->DE"
  return config

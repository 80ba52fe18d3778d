"""nllb200_3_3b_wmt14_ende: NLLB-200 3.3B (dense; facebook/nllb-200-3.3B) imported and
evaluated on newstest2014 EN->DE as it is (source eng_Latn, target deu_Latn).

    python run.py reproduce --experiment nllb200_3_3b_wmt14_ende --workdir workdirs/nllb_ende

Needs the internet once (huggingface_hub downloads 13.4 GB: 3.3B float32 parameters); with a
local copy, add `init.from=hf:/path/to/nllb-200-3.3B`. Hardware: one accelerator with
>= 24 GB (params 12.5 GiB in float32; `python benchmarks/memory.py --inference` gives
the beam search's peak in float32 and bfloat16). The name has `3_3b` for 3.3B because a
registry name is a Python module name.

Target: 31.2 BLEU, the figure of this project's seed table. NLLB's own paper (NLLB Team,
2022) reports mostly FLORES-200 spBLEU/chrF++; that figure has not been traced to a
published evaluation of this checkpoint on newstest2014, so treat it as the number to check,
not a citation.
"""

from transformer_mt.config import pretrained as _pretrained


def get_config():
  return _pretrained.nllb_3_3b_config("de", "deu_Latn", published_bleu=31.2)

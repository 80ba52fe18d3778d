"""tokenizer.perl as Moses master runs it: sacremoses' port plus the one rule it leaves out.

Its own module so that sacremoses (~0.5 s to import) is imported only when paper BLEU is
scored (corpus_scores._moses_tokenizer), not by every command that imports corpus_scores.
"""

import sacremoses


class MosesMasterTokenizer(sacremoses.MosesTokenizer):
  """sacremoses' port of tokenizer.perl with the one rule of Moses master it leaves out.

  Since mosesdecoder PR #204 (Nov 2018) tokenizer.perl splits the period off the LAST word of
  a line unconditionally ("So am I." -> "So am I .", "FoxNews.com." -> "FoxNews.com ."),
  before asking whether the word is a nonbreaking prefix such as "S." or "Mrd."; sacremoses
  keeps the older behaviour on purpose (hplt-project/sacremoses#21, #97). The golden figures
  (../shared/data/golden/README.md) come from master, so this splits it too. (tensor2tensor's
  2017 figures predate the rule; on the golden newstest2014 files it moves 6-20 tokens of
  56k-83k and no BLEU digit.)
  """

  def handles_nonbreaking_prefixes(self, text: str) -> str:
    tokens = text.split()
    if tokens and len(tokens[-1]) > 1 and tokens[-1].endswith("."):
      tokens[-1] = tokens[-1][:-1] + " ."  # Perl: /^(\S+)\.$/ on the last word -> "$1 ."
    return super().handles_nonbreaking_prefixes(" ".join(tokens))

"""BLEU and chrF on detokenized text, computed by sacreBLEU (never a hand-written metric).

Two BLEU numbers are reported because they answer different questions:

* sacreBLEU (`corpus_bleu`) is the official, comparable-across-papers score: sacreBLEU's own
  13a tokenization of the detokenized text, with a signature that pins every setting.
* "paper BLEU" (`paper_bleu`) reproduces the tokenized BLEU that the Transformer paper and its
  peers (GNMT, ConvS2S) reported on newstest2014, following tensor2tensor's
  `utils/get_ende_bleu.sh`. It is usually higher than sacreBLEU and depends on tokenizer
  details, so it is only good for comparing against those published tables -- always report it
  next to sacreBLEU, never alone.

Beside them, chrF and chrF++ (`corpus_chrf`): character n-gram F-scores that need no
tokenizer at all, so they are comparable across languages and segmentations and correlate
better with human judgements than BLEU (WMT metrics tasks). COMET is not included: it needs a
neural model download, which an offline evaluation cannot rely on.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence

import sacrebleu
import sacremoses


def _check_aligned(hypotheses: Sequence[str], references: Sequence[str]) -> None:
  """BLEU silently pairs line i with line i, so an off-by-one file would score garbage."""
  if len(hypotheses) != len(references):
    raise ValueError(
      f"{len(hypotheses)} hypotheses but {len(references)} references: "
      "translations must be line-aligned with the references."
    )


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """sacreBLEU score (0-100) of line-aligned hypotheses against one reference each,
  and the signature that makes the number reproducible."""
  _check_aligned(hypotheses, references)
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(metric.get_signature())


def corpus_chrf(
  hypotheses: Sequence[str], references: Sequence[str], word_order: int = 0
) -> tuple[float, str]:
  """sacreBLEU's chrF (0-100) of line-aligned hypotheses against one reference each, and its
  signature.

  sacreBLEU's defaults, as its command line uses them: character n-grams of orders 1..6
  with whitespace removed, beta=2 (recall weighs twice as much as precision), mixed case,
  and corpus-level statistics (n-gram counts summed over all sentences, not an average of
  sentence scores). `word_order=2` adds word uni- and bigrams: chrF++ (Popovic 2017).
  """
  _check_aligned(hypotheses, references)
  metric = sacrebleu.metrics.CHRF(word_order=word_order)
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(metric.get_signature())


# tensor2tensor's `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`. Perl reads the bytes
# without a Unicode layer there, so its \s is ASCII whitespace only: re.ASCII gives the same
# \S. Matches do not overlap, exactly like Perl's /g, so "a-b-c" becomes
# "a ##AT##-##AT## b-c" in both (the "b" is consumed by the first match).
_COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)", re.ASCII)


@functools.cache
def _moses_tokenizer(language: str) -> sacremoses.MosesTokenizer:
  """One tokenizer per language: building it loads the nonbreaking-prefix lists."""
  return sacremoses.MosesTokenizer(lang=language)


@functools.cache
def _punct_normalizer(language: str) -> sacremoses.MosesPunctNormalizer:
  return sacremoses.MosesPunctNormalizer(lang=language)


def paper_tokenize(line: str, language: str) -> str:
  r"""One detokenized line as get_ende_bleu.sh hands it to multi-bleu.perl.

  The script's three text steps, in its order:
  1. `replace-unicode-punctuation.perl` (full-width CJK punctuation and digits, curly
     double quotes "" and the right single quote, the ellipsis character, ...) -- sacremoses'
     port of the same substitution table. (The Perl table maps the full-width "1" to a
     double quote, a typo the port fixes; it does not occur in news text.)
  2. `tokenizer.perl -l LANG`: default options, i.e. XML escaping ON (`"` -> `&quot;`) and
     NO `-a` aggressive hyphen splitting. Escaping maps one token to one token, so it does
     not change the score; it is kept so the tokens look like the script's.
  3. The compound split `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`, which turns the tokenizer's
     intact "rich-text" into "rich ##AT##-##AT## text" (the Stanford/GNMT convention).
  """
  text = _punct_normalizer(language).replace_unicode_punct(line)
  text = _moses_tokenizer(language).tokenize(
    text, aggressive_dash_splits=False, return_str=True, escape=True
  )
  return _COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", text)


def paper_bleu(
  hypotheses: Sequence[str], references: Sequence[str], language: str
) -> tuple[float, str]:
  """Tokenized "paper-comparable" BLEU (0-100) as tensor2tensor's get_ende_bleu.sh computes
  it, and a description of the procedure.

  Both sides go through `paper_tokenize`, then sacreBLEU scores the whitespace tokens with the
  settings that make it multi-bleu.perl: `tokenize="none"` (the text is already tokenized;
  `force=True` silences sacreBLEU's warning about exactly that), case-sensitive (the script
  does not pass `-lc`), and `smooth_method="none"` (multi-bleu.perl takes log(0) as
  -9999999999, so any n-gram order without a match gives 0, as unsmoothed BLEU does).

  One deliberate difference: the script scores against a pre-tokenized reference file
  (newstest2014.tok.de, which Google had additionally edited so that every German quote,
  including the low „, became `"`). Here the detokenized reference goes through the very same
  steps as the hypotheses, so no hand-edited reference is needed and both sides are
  treated alike.
  """
  _check_aligned(hypotheses, references)
  hyp_tokens = [paper_tokenize(line, language) for line in hypotheses]
  ref_tokens = [paper_tokenize(line, language) for line in references]
  metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
  score = metric.corpus_score(hyp_tokens, [ref_tokens])
  method = (
    f"tokenized BLEU as in tensor2tensor get_ende_bleu.sh: sacremoses "
    f"{sacremoses.__version__} replace-unicode-punctuation + tokenizer -l {language} "
    f"(escaped, no -a), compound splitting ##AT##-##AT##, multi-bleu.perl "
    f"equivalent sacreBLEU {metric.get_signature()}"
  )
  return score.score, method


def bleu_report(hypotheses: Sequence[str], references: Sequence[str], target_language: str) -> dict:
  """Both BLEU numbers, chrF and chrF++, each next to the label that says how it was computed,
  so a reader cannot mistake the inflated tokenized number for the official one.

  (Named for its first use; the chrF keys were added beside the BLEU ones, which keep their
  names, so reports written before chrF still read the same.)
  """
  sacre_score, signature = corpus_bleu(hypotheses, references)
  paper_score, method = paper_bleu(hypotheses, references, target_language)
  chrf, chrf_signature = corpus_chrf(hypotheses, references)
  chrf_pp, chrf_pp_signature = corpus_chrf(hypotheses, references, word_order=2)
  return {
    "sacrebleu": sacre_score,
    "sacrebleu_signature": signature,
    "paper_bleu": paper_score,
    "paper_bleu_method": method,
    "chrf": chrf,
    "chrf_signature": chrf_signature,
    "chrf_plus_plus": chrf_pp,
    "chrf_plus_plus_signature": chrf_pp_signature,
    "num_sentences": len(hypotheses),
  }


def _strip_punctuation(text: str) -> str:
  """Deletes every character whose Unicode category is punctuation (P*: . , ! ? - ' " „ ...).
  Deleted, not replaced by a space, so "sky." -> "sky" and "don't" -> "dont"."""
  return "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))


def unigram_precision(
  hypothesis: str, reference: str, lowercase: bool = True, remove_punctuation: bool = True
) -> float:
  """Clipped unigram precision (0-1) of one hypothesis against one reference: the first of
  BLEU's four n-gram precisions, e.g. for explaining BLEU with a worked example.

  It is read from the statistics of the same sacreBLEU metric as `corpus_bleu` (13a
  tokenization), taken before any smoothing, so it agrees with the corpus score's first
  precision. An empty hypothesis has no unigrams and gets 0.0, as in sacreBLEU.
  """
  if remove_punctuation:
    hypothesis, reference = _strip_punctuation(hypothesis), _strip_punctuation(reference)
  metric = sacrebleu.metrics.BLEU(lowercase=lowercase)
  stats = metric.corpus_score([hypothesis], [[reference]])
  return stats.counts[0] / stats.totals[0] if stats.totals[0] else 0.0

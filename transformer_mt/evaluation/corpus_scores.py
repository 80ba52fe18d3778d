"""BLEU and chrF on detokenized text, computed by sacreBLEU (never a hand-written metric).

Two BLEU numbers are reported because they answer different questions:

* sacreBLEU (`corpus_bleu`) is the official, comparable-across-papers score: sacreBLEU's own
  13a tokenization of the detokenized text, with a signature that pins every setting.
* "paper BLEU" (`paper_bleu_score`) reproduces the tokenized BLEU that the Transformer paper
  and its peers (GNMT, ConvS2S) reported on newstest2014, following tensor2tensor's
  `utils/get_ende_bleu.sh` for every target language, EN-FR included (see "Which BLEU
  pipeline" below). It equals what Moses master's Perl scripts and multi-bleu.perl give, count
  for count (tests/test_evaluation.py, on ../shared/data/golden). It is usually higher than
  sacreBLEU and depends on tokenizer details, so it is only good for comparing against those
  published tables -- always report it next to sacreBLEU, never alone.

Beside them, chrF and chrF++ (`corpus_chrf`): character n-gram F-scores that need no
tokenizer at all, so they are comparable across languages and segmentations and correlate
better with human judgements than BLEU (WMT metrics tasks). COMET is not included: it needs a
neural model download, which an offline evaluation cannot rely on.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

import sacrebleu

from transformer_mt.runtime import errors

if TYPE_CHECKING:  # imported on use: every command that scores BLEU would pay sacremoses
  import sacremoses

  from transformer_mt.evaluation import moses_master


def _check_aligned(hypotheses: Sequence[str], references: Sequence[str]) -> None:
  """BLEU silently pairs line i with line i, so an off-by-one file would score garbage."""
  if len(hypotheses) != len(references):
    raise errors.BadValue(
      f"{len(hypotheses)} hypotheses but {len(references)} references: "
      "translations must be line-aligned with the references."
    )


def corpus_bleu(
  hypotheses: Sequence[str], references: Sequence[str], tokenized: bool = False
) -> tuple[float, str]:
  """sacreBLEU score (0-100) of line-aligned hypotheses against one reference each,
  and the signature that makes the number reproducible.

  `tokenized`: the text is tokenized on purpose (an experiment scored on given tokens), so
  sacreBLEU's "you forgot to detokenize" warning would be noise: it is silenced (its `force`,
  which leaves the score and the signature as they are). Otherwise the warning stays, since
  it then catches a real mistake."""
  _check_aligned(hypotheses, references)
  metric = sacrebleu.metrics.BLEU(force=tokenized)
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


# Which BLEU pipeline each target language gets, from the published practice:
# * EN-DE: tensor2tensor's get_ende_bleu.sh (the Transformer paper's EN-DE figures) splits
#   compounds, `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`, "comparable to GNMT, ConvS2S"
#   (Lukasz Kaiser, tensorflow/tensor2tensor#61).
# * EN-FR: tensor2tensor ships no EN-FR script. The EN-FR rows the paper compares with
#   (ConvS2S; and Ott et al. 2018's 43.2) were scored on text tokenized with `tokenizer.perl
#   -a`, whose aggressive hyphen splitting turns "a-b" into three tokens just as ##AT## does:
#   fairseq's examples/translation/prepare-wmt14en2fr.sh tokenizes newstest2014 with `-a`, and
#   its author calls that figure "43.2 BLEU with compound splitting ... built-in to the
#   preprocessing script" (facebookresearch/fairseq#2009). So EN-FR splits compounds too.
# Every other target language follows the same convention (fairseq's other prepare scripts
# use `-a` as well), so the rule is one for all: `paper_tokenize` always splits.

# tensor2tensor's `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`. Perl reads the bytes
# without a Unicode layer there, so it matches UTF-8 *bytes* with ASCII \s: a bytes pattern
# does the same. It matters: in "vis-à-vis" the first match consumes only the first byte of
# "à", so Perl also splits the second hyphen (after à's second byte), which a character-level
# match would not. Matches do not overlap, like Perl's /g: "a-b-c" -> "a ##AT##-##AT## b-c".
# Inserting the marker between a byte and "-" (or "-" and a byte) never cuts a UTF-8
# character: "-" is ASCII, so the bytes next to it start or end a character.
_COMPOUND_HYPHEN = re.compile(rb"(\S)-(\S)")


@functools.cache
def _moses_tokenizer(language: str) -> moses_master.MosesMasterTokenizer:
  """One tokenizer per language: building it loads the nonbreaking-prefix lists."""
  from transformer_mt.evaluation import moses_master  # sacremoses: ~0.5 s, imported on use

  return moses_master.MosesMasterTokenizer(lang=language)


@functools.cache
def _punct_normalizer(language: str) -> sacremoses.MosesPunctNormalizer:
  import sacremoses

  return sacremoses.MosesPunctNormalizer(lang=language)


def moses_tokenize(line: str, language: str) -> str:
  r"""The first two text steps of get_ende_bleu.sh, as Moses master's Perl scripts do them.

  1. `replace-unicode-punctuation.perl` (full-width CJK punctuation and digits, curly
     double quotes "" and the right single quote, the ellipsis character, ...) -- sacremoses'
     port of the same substitution table. (The Perl table maps the full-width "1" to a
     double quote, a typo the port fixes; it does not occur in news text.)
  2. `tokenizer.perl -l LANG`: default options, i.e. XML escaping ON (`"` -> `&quot;`) and
     NO `-a` aggressive hyphen splitting, with master's final-period rule
     (`moses_master.MosesMasterTokenizer`). Escaping maps one token to one token, so it does
     not change the score; it is kept so the tokens look like the script's.
  """
  text = _punct_normalizer(language).replace_unicode_punct(line)
  return _moses_tokenizer(language).tokenize(
    text, aggressive_dash_splits=False, return_str=True, escape=True
  )


def split_compounds(tokenized: str) -> str:
  """get_ende_bleu.sh's third step: "rich-text" -> "rich ##AT##-##AT## text" (the
  Stanford/GNMT convention), on the UTF-8 bytes as Perl does it (`_COMPOUND_HYPHEN`)."""
  return _COMPOUND_HYPHEN.sub(rb"\1 ##AT##-##AT## \2", tokenized.encode("utf-8")).decode("utf-8")


def paper_tokenize(line: str, language: str) -> str:
  """One detokenized line as get_ende_bleu.sh hands it to multi-bleu.perl: `moses_tokenize`,
  then `split_compounds` (for every target language: see "Which BLEU pipeline" above)."""
  return split_compounds(moses_tokenize(line, language))


def multi_bleu(
  hyp_tokens: Sequence[str], ref_tokens: Sequence[str]
) -> tuple[sacrebleu.BLEUScore, str]:
  """multi-bleu.perl's BLEU of already tokenized lines, counted by sacreBLEU, and the
  signature of the sacreBLEU settings that do it.

  The settings that make sacreBLEU multi-bleu.perl: `tokenize="none"` (split on whitespace
  only; `force=True` silences sacreBLEU's warning that the text looks tokenized, which it
  is), case-sensitive (the script is run without `-lc`), and `smooth_method="none"`
  (multi-bleu.perl takes log(0) as -9999999999, so any n-gram order without a match gives 0,
  as unsmoothed BLEU does). Corpus-level counts and brevity penalty, as in the script.
  """
  _check_aligned(hyp_tokens, ref_tokens)
  metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
  score = metric.corpus_score(list(hyp_tokens), [list(ref_tokens)])
  return score, str(metric.get_signature())


def multi_bleu_line(score: sacrebleu.BLEUScore) -> str:
  """`score` printed as multi-bleu.perl prints its result (the same printf formats), so it
  can be set beside a published multi-bleu.perl log and compared character by character."""
  precisions = "/".join(f"{p:.1f}" for p in score.precisions)
  return (
    f"BLEU = {score.score:.2f}, {precisions} (BP={score.bp:.3f}, "
    f"ratio={score.sys_len / score.ref_len:.3f}, hyp_len={score.sys_len}, "
    f"ref_len={score.ref_len})"
  )


def paper_bleu_score(
  hypotheses: Sequence[str], references: Sequence[str], language: str
) -> tuple[sacrebleu.BLEUScore, str]:
  """The tokenized "paper-comparable" BLEU as tensor2tensor's get_ende_bleu.sh computes it:
  `paper_tokenize` on both sides, then `multi_bleu` (its score and a description of the
  whole procedure).

  One deliberate difference: the script scores against a pre-tokenized reference file
  (newstest2014.tok.de, which Google had additionally edited so that every German quote,
  including the low „, became `"`). Here the detokenized reference goes through the very same
  steps as the hypotheses, so no hand-edited reference is needed and both sides are
  treated alike.
  """
  _check_aligned(hypotheses, references)
  score, signature = multi_bleu(
    [paper_tokenize(line, language) for line in hypotheses],
    [paper_tokenize(line, language) for line in references],
  )
  method = (
    f"tokenized BLEU as in tensor2tensor get_ende_bleu.sh: sacremoses "
    f"{importlib.metadata.version('sacremoses')} replace-unicode-punctuation + "
    f"tokenizer -l {language} "
    f"(Moses master, escaped, no -a), compound splitting ##AT##-##AT##, multi-bleu.perl "
    f"equivalent sacreBLEU {signature}"
  )
  return score, method


# `evaluate.bleu`: the BLEU an experiment leads with (its held-out line, validation BLEU, the
# best checkpoint, `evaluate` and `report`).
BLEU_KINDS = ("sacrebleu", "tokenized")
TOKENIZED_BLEU_NAME = "tokenized BLEU (multi-bleu.perl on the given tokens)"


def check_bleu_kind(kind: str) -> str:
  """`evaluate.bleu` (or `--bleu`), checked: "sacrebleu" or "tokenized"."""
  if kind not in BLEU_KINDS:
    raise errors.BadValue(
      f"evaluate.bleu={kind!r} is not one of {', '.join(map(repr, BLEU_KINDS))}: 'sacrebleu' for "
      "detokenized text, 'tokenized' for text that is tokenized already (e.g. Multi30k's "
      "lc.norm.tok files)."
    )
  return kind


def tokenized_bleu(
  hypotheses: Sequence[str], references: Sequence[str]
) -> tuple[sacrebleu.BLEUScore, str]:
  """BLEU of text that is tokenized already, as published results on such data compute it:
  multi-bleu.perl against the tokenized reference, with no further tokenization and no
  compound splitting (`multi_bleu` on the lines as they are). Its score and a description."""
  score, signature = multi_bleu(hypotheses, references)
  method = (
    "multi-bleu.perl on the given tokens (split at whitespace; no further tokenization, no "
    f"compound splitting), case-sensitive: sacreBLEU {signature}"
  )
  return score, method


def headline_bleu(
  hypotheses: Sequence[str], references: Sequence[str], kind: str
) -> tuple[float, str]:
  """The BLEU `kind` ("sacrebleu" or "tokenized") names, and its signature or method."""
  if check_bleu_kind(kind) == "tokenized":
    score, method = tokenized_bleu(hypotheses, references)
    return score.score, method
  return corpus_bleu(hypotheses, references)


def bleu_report(
  hypotheses: Sequence[str],
  references: Sequence[str],
  target_language: str,
  bleu: str = "sacrebleu",
) -> dict:
  """Both BLEU numbers, chrF and chrF++, each next to the label that says how it was computed,
  so a reader cannot mistake the inflated tokenized number for the official one.

  Args:
    hypotheses, references: line-aligned text, detokenized (bleu="sacrebleu") or tokenized
      as the published results on that data score it (bleu="tokenized").
    target_language: the Moses rules of the paper-comparable BLEU (e.g. "de"); unused for
      tokenized text.
    bleu: `evaluate.bleu`. With "tokenized" the paper-comparable BLEU is `tokenized_bleu`
      (the text is scored as it is: tokenizing it again would escape its escapes and split
      what its own tokenizer kept whole), and "paper_bleu_method" says so.

  Returns:
    {"sacrebleu", "paper_bleu", "chrf", "chrf_plus_plus": scores (0-100), each with its
    "..._signature" or "..._method"; "paper_bleu_multi_bleu": multi-bleu.perl's output line;
    "bleu_kind": `bleu`; "num_sentences"}.

  Raises:
    ValueError: the two lists differ in length.

  (Named for its first use; the chrF keys were added beside the BLEU ones, which keep their
  names, so reports written before chrF still read the same.)
  """
  tokenized = check_bleu_kind(bleu) == "tokenized"
  sacre_score, signature = corpus_bleu(hypotheses, references, tokenized=tokenized)
  if tokenized:
    paper, paper_method = tokenized_bleu(hypotheses, references)
  else:
    paper, paper_method = paper_bleu_score(hypotheses, references, target_language)
  chrf, chrf_signature = corpus_chrf(hypotheses, references)
  chrf_pp, chrf_pp_signature = corpus_chrf(hypotheses, references, word_order=2)
  return {
    "sacrebleu": sacre_score,
    "sacrebleu_signature": signature,
    "paper_bleu": paper.score,
    "paper_bleu_method": paper_method,
    "paper_bleu_multi_bleu": multi_bleu_line(paper),
    "chrf": chrf,
    "chrf_signature": chrf_signature,
    "chrf_plus_plus": chrf_pp,
    "chrf_plus_plus_signature": chrf_pp_signature,
    "bleu_kind": bleu,
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

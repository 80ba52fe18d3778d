"""BLEU: sacreBLEU through `corpus_bleu` agrees with the sacrebleu command line, the
paper-comparable tokenized BLEU follows tensor2tensor's get_ende_bleu.sh, and the unigram
precision of the BLEU worked example comes out of sacreBLEU's own statistics."""

import json
import math
import pathlib
import subprocess
import sys

import pytest

from transformer_mt import evaluation

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
NEWSTEST_DE = SHARED / "news" / "en-de" / "newstest2014.de"
needs_newstest = pytest.mark.skipif(
  not NEWSTEST_DE.is_file(), reason=f"{NEWSTEST_DE} (shared data) is absent"
)
# The CLI installed beside this interpreter, so it is the same sacrebleu the library imports.
SACREBLEU_CLI = pathlib.Path(sys.executable).parent / "sacrebleu"


def _perturb(lines):
  """A deterministic stand-in for a system output: every 7th word dropped, the 2nd and 3rd
  words of every 5th line swapped, every 11th line lowercased -- close enough to the reference
  to score in the 60s, far enough that every n-gram order loses matches."""
  out = []
  for i, line in enumerate(lines):
    words = [word for j, word in enumerate(line.split()) if (j + 1) % 7 != 0]
    if i % 5 == 0 and len(words) > 3:
      words[1], words[2] = words[2], words[1]
    text = " ".join(words)
    out.append(text.lower() if i % 11 == 0 else text)
  return out


@pytest.fixture(scope="module")
def newstest():
  """(perturbed hypotheses, references) for newstest2014 EN-DE, German side, 3003 lines."""
  references = NEWSTEST_DE.read_text(encoding="utf-8").splitlines()
  assert len(references) == 3003
  return _perturb(references), references


def _cli_bleu(reference_path, hypotheses, tmp_path, *flags):
  hyp_path = tmp_path / "hyp.txt"
  hyp_path.write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
  result = subprocess.run(
    [
      str(SACREBLEU_CLI),
      str(reference_path),
      "-i",
      str(hyp_path),
      "-m",
      "bleu",
      "-w",
      "2",
      "--format",
      "json",
      *flags,
    ],
    capture_output=True,
    text=True,
    encoding="utf-8",
    check=True,
  )
  return json.loads(result.stdout)


@needs_newstest
def test_corpus_bleu_matches_sacrebleu_command_line(newstest, tmp_path):
  hypotheses, references = newstest
  score, signature = evaluation.corpus_bleu(hypotheses, references)
  cli = _cli_bleu(NEWSTEST_DE, hypotheses, tmp_path)
  assert f"{score:.2f}" == f"{cli['score']:.2f}"
  assert signature == cli["signature"]
  assert signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|")
  assert 0 < score < 100


def test_unigram_precision_of_the_worked_example():
  # Lowercased and without punctuation: "the sun is in the sky" against "the sun is shinning";
  # "the" is clipped to the reference's single occurrence, so 3 of 6 words match.
  assert (
    evaluation.unigram_precision(
      "The sun is in the sky.", "The sun is shinning.", lowercase=True, remove_punctuation=True
    )
    == 0.5
  )


def test_unigram_precision_options_change_what_matches():
  # Case-sensitive, "the" no longer matches "The": 2 of 6. With punctuation kept, 13a makes
  # the final "." a token of its own that matches the reference's: 4 of 7.
  assert evaluation.unigram_precision(
    "the sun is in the sky", "The sun is shinning", lowercase=False
  ) == pytest.approx(2 / 6)
  assert evaluation.unigram_precision(
    "The sun is in the sky.", "The sun is shinning.", remove_punctuation=False
  ) == pytest.approx(4 / 7)
  assert evaluation.unigram_precision("", "The sun is shinning.") == 0.0


def test_paper_tokenize_splits_compounds_and_tokenizes_like_moses():
  assert (
    evaluation.paper_tokenize("Die neue B 33-Fußgängerampel ist in Betrieb.", "de")
    == "Die neue B 33 ##AT##-##AT## Fußgängerampel ist in Betrieb ."
  )
  # Only a hyphen between two non-space characters is a compound hyphen; the substitution
  # does not overlap (like Perl's s///g), so in "a-b-c" the second hyphen stays.
  assert (
    evaluation.paper_tokenize("a - b, x- und -y a-b-c", "de")
    == "a - b , x- und -y a ##AT##-##AT## b-c"
  )
  # replace-unicode-punctuation turns the closing “ into ", which tokenizer.perl escapes;
  # the low „ is not in its table and stays.
  assert evaluation.paper_tokenize("„Gut“ … oder?", "de") == "„ Gut &quot; ... oder ?"


def test_paper_bleu_of_a_perfect_hypothesis_is_100():
  references = ["Die E-Mail-Adresse steht im Rathaus.", "„Noch mehr Sicherheit“ für Fußgänger!"]
  score, method = evaluation.paper_bleu(references, references, "de")
  assert score == pytest.approx(100.0)
  assert "##AT##-##AT##" in method and "tok:none" in method and "smooth:none" in method


@needs_newstest
def test_paper_bleu_on_newstest2014_is_a_different_finite_number(newstest, tmp_path):
  hypotheses, references = newstest
  paper, _ = evaluation.paper_bleu(hypotheses, references, "de")
  sacre, _ = evaluation.corpus_bleu(hypotheses, references)
  assert math.isfinite(paper) and 0 < paper < 100
  assert abs(paper - sacre) > 0.1
  # The scoring step is multi-bleu.perl's BLEU: on the same tokens, the CLI told "the text is
  # tokenized, no smoothing" gives the same number.
  ref_path = tmp_path / "ref.tok"
  ref_path.write_text(
    "\n".join(evaluation.paper_tokenize(line, "de") for line in references) + "\n", encoding="utf-8"
  )
  cli = _cli_bleu(
    ref_path,
    [evaluation.paper_tokenize(line, "de") for line in hypotheses],
    tmp_path,
    "--tokenize",
    "none",
    "--smooth-method",
    "none",
    "--force",
  )
  assert f"{paper:.2f}" == f"{cli['score']:.2f}"


def test_bleu_report_labels_both_scores():
  hypotheses = ["Die Sonne scheint heute.", "Der Hund bellt laut-stark."]
  references = ["Die Sonne scheint.", "Der Hund bellt lautstark."]
  report = evaluation.bleu_report(hypotheses, references, "de")
  assert set(report) == {
    "sacrebleu",
    "sacrebleu_signature",
    "paper_bleu",
    "paper_bleu_method",
    "num_sentences",
  }
  assert (report["sacrebleu"], report["sacrebleu_signature"]) == evaluation.corpus_bleu(
    hypotheses, references
  )
  assert (report["paper_bleu"], report["paper_bleu_method"]) == evaluation.paper_bleu(
    hypotheses, references, "de"
  )
  assert "tok:13a" in report["sacrebleu_signature"]
  assert report["num_sentences"] == 2


@pytest.mark.parametrize(
  "score",
  [
    evaluation.corpus_bleu,
    lambda hyps, refs: evaluation.paper_bleu(hyps, refs, "de"),
    lambda hyps, refs: evaluation.bleu_report(hyps, refs, "de"),
  ],
  ids=["corpus_bleu", "paper_bleu", "bleu_report"],
)
def test_mismatched_line_counts_name_both_counts(score):
  with pytest.raises(ValueError, match=r"3 hypotheses but 2 references"):
    score(["a", "b", "c"], ["a", "b"])

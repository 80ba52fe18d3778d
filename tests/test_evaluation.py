"""BLEU: sacreBLEU through `corpus_bleu` agrees with the sacrebleu command line, the
paper-comparable tokenized BLEU follows tensor2tensor's get_ende_bleu.sh, and the unigram
precision of the BLEU worked example comes out of sacreBLEU's own statistics. chrF and chrF++
agree with the sacrebleu command line on the golden files and with a hand-worked example;
`run.py report` shows them, and "–" for a results.json written before them."""

import json
import math
import pathlib
import subprocess
import sys

import pytest
import shared_data

from transformer_mt import cli, evaluation, reproduce

SHARED = shared_data.DIR  # skipped when absent, failed under CI (conftest.py)
NEWSTEST_DE = SHARED / "news" / "en-de" / "newstest2014.de"
needs_newstest = pytest.mark.shared_data("news/en-de/newstest2014.de")
GOLDEN = SHARED / "golden"
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
  return _cli(reference_path, hyp_path, "-m", "bleu", "-w", "2", *flags)


def _cli(reference_path, hypothesis_path, *flags):
  result = subprocess.run(
    [
      str(SACREBLEU_CLI),
      str(reference_path),
      "-i",
      str(hypothesis_path),
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
    "chrf",
    "chrf_signature",
    "chrf_plus_plus",
    "chrf_plus_plus_signature",
    "num_sentences",
  }
  assert (report["sacrebleu"], report["sacrebleu_signature"]) == evaluation.corpus_bleu(
    hypotheses, references
  )
  assert (report["paper_bleu"], report["paper_bleu_method"]) == evaluation.paper_bleu(
    hypotheses, references, "de"
  )
  assert "tok:13a" in report["sacrebleu_signature"]
  assert (report["chrf"], report["chrf_signature"]) == evaluation.corpus_chrf(
    hypotheses, references
  )
  assert (report["chrf_plus_plus"], report["chrf_plus_plus_signature"]) == (
    evaluation.corpus_chrf(hypotheses, references, word_order=2)
  )
  assert "nw:0" in report["chrf_signature"] and "nw:2" in report["chrf_plus_plus_signature"]
  assert report["chrf"] != report["chrf_plus_plus"]
  assert report["num_sentences"] == 2


@pytest.mark.parametrize(
  "score",
  [
    evaluation.corpus_bleu,
    lambda hyps, refs: evaluation.paper_bleu(hyps, refs, "de"),
    lambda hyps, refs: evaluation.bleu_report(hyps, refs, "de"),
    evaluation.corpus_chrf,
  ],
  ids=["corpus_bleu", "paper_bleu", "bleu_report", "corpus_chrf"],
)
def test_mismatched_line_counts_name_both_counts(score):
  with pytest.raises(ValueError, match=r"3 hypotheses but 2 references"):
    score(["a", "b", "c"], ["a", "b"])


@pytest.mark.parametrize(
  "language, pair, word_order, name", [("de", "en-de", 0, "chrF2"), ("fr", "en-fr", 2, "chrF2++")]
)
def test_chrf_matches_sacrebleu_command_line_on_the_golden_files(language, pair, word_order, name):
  """The golden pseudo-hypotheses (see ../shared/data/golden/README.md) against the raw
  newstest2014 references, to 4 decimals, with the CLI's own signature. One variant per
  language keeps it to two CLI runs; the hand-worked example pins both variants."""
  hypothesis_path = GOLDEN / f"newstest2014.perturbed.{language}"
  reference_path = SHARED / "news" / pair / f"newstest2014.{language}"
  shared_data.require(hypothesis_path.relative_to(SHARED), reference_path.relative_to(SHARED))
  hypotheses = hypothesis_path.read_text(encoding="utf-8").splitlines()
  references = reference_path.read_text(encoding="utf-8").splitlines()
  assert len(hypotheses) == len(references) == 3003
  score, signature = evaluation.corpus_chrf(hypotheses, references, word_order)
  cli_score = _cli(
    reference_path, hypothesis_path, "-m", "chrf", "--chrf-word-order", str(word_order), "-w", "4"
  )
  assert cli_score["name"] == name
  assert f"{score:.4f}" == f"{cli_score['score']:.4f}"
  assert signature == cli_score["signature"]
  assert signature.startswith(f"nrefs:1|case:mixed|eff:yes|nc:6|nw:{word_order}|space:no|")
  # Close to the reference but not equal to it: far from both ends of the scale.
  assert 50 < score < 95


def _f_beta(precisions, recalls, beta):
  """sacreBLEU 2's chrF from per-order precisions and recalls: their means over the orders
  (all orders here have n-grams on both sides), then the F-beta score of the two means."""
  precision, recall = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
  return 100 * (1 + beta**2) * precision * recall / (beta**2 * precision + recall)


def test_chrf_of_a_hand_worked_example():
  """Two sentences worked out from the definition: character n-grams of orders 1..6 with the
  spaces removed, counts summed over the corpus, beta=2.

  "the cat" vs "the cats": "thecat" is a prefix of "thecats", so each of its 7-n n-grams
  of order n matches; the reference has 8-n.
  "a dog" vs "the dog": "adog" vs "thedog"; n-grams (hyp, ref, matched) by order:
  1: 4, 6, 3 (d o g); 2: 3, 5, 2 (do og); 3: 2, 4, 1 (dog); 4: 1, 3, 0; 5, 6: 0, 2 and 0, 1.
  Summed (hyp, ref, matched): 1: 10, 13, 9; 2: 8, 11, 7; 3: 6, 9, 5; 4: 4, 7, 3; 5: 2, 5, 2;
  6: 1, 3, 1.
  """
  hypotheses, references = ["the cat", "a dog"], ["the cats", "the dog"]
  precisions = [9 / 10, 7 / 8, 5 / 6, 3 / 4, 2 / 2, 1 / 1]
  recalls = [9 / 13, 7 / 11, 5 / 9, 3 / 7, 2 / 5, 1 / 3]
  score, _ = evaluation.corpus_chrf(hypotheses, references)
  assert score == pytest.approx(_f_beta(precisions, recalls, beta=2), abs=1e-9)
  assert score == pytest.approx(55.5642207, abs=1e-6)
  # The wrong variants are far off: beta=1 (64.74), or orders 1..5 only (58.69).
  assert abs(score - _f_beta(precisions, recalls, beta=1)) > 5
  assert abs(score - _f_beta(precisions[:5], recalls[:5], beta=2)) > 1
  # chrF++ adds two word orders. Words (hyp, ref, matched): unigrams 4, 4, 2 ("the", "dog");
  # bigrams 2, 2, 0.
  score_pp, _ = evaluation.corpus_chrf(hypotheses, references, word_order=2)
  assert score_pp == pytest.approx(
    _f_beta(precisions + [2 / 4, 0 / 2], recalls + [2 / 4, 0 / 2], beta=2), abs=1e-9
  )
  assert score_pp == pytest.approx(48.1255402, abs=1e-6)


def _results(experiment, **scores):
  """A results.json as `reproduce` writes it; without chrF keys, as it wrote them before."""
  return dict(
    {
      "experiment": experiment,
      "description": "",
      "paper_bleu": None,
      "paper_bleu_source": None,
      "sacrebleu": 20.0,
      "sacrebleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
      "paper_comparable_bleu": 21.0,
      "paper_comparable_method": "tokenized BLEU",
      "parameters": 1_000_000,
      "steps": 10,
      "averaged_steps": [10],
      "beam_size": 4,
      "alpha": 0.6,
      "test_sentences": 8,
      "wall_seconds_this_run": 60.0,
      "hardware": "1 x cpu",
      "overrides": [],
    },
    **scores,
  )


def test_report_shows_chrf_and_a_dash_for_old_results(tmp_path, capsys):
  new, old = tmp_path / "new", tmp_path / "old"
  chrf = {
    "chrf": 48.125,
    "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
    "chrf_plus_plus": 45.5,
    "chrf_plus_plus_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:2.6.0",
  }
  for workdir, results in ((new, _results("new_row", **chrf)), (old, _results("old_row"))):
    workdir.mkdir()
    (workdir / reproduce.RESULTS_FILENAME).write_text(json.dumps(results), encoding="utf-8")
  assert cli.main(["report", str(new), str(old)]) == 0
  lines = capsys.readouterr().out.splitlines()
  header = lines[0].split(" | ")
  new_row, old_row = (line.split(" | ") for line in lines[2:4])
  assert header[4:6] == ["ours: chrF", "ours: chrF++"]
  assert new_row[4:6] == ["48.12", "45.50"] and old_row[4:6] == ["–", "–"]
  assert new_row[3] == old_row[3] == "20.00"  # the BLEU columns are unchanged
  assert f"chrF signature(s): {chrf['chrf_signature']}" in lines
  assert f"chrF++ signature(s): {chrf['chrf_plus_plus_signature']}" in lines
  # Only old rows: no chrF signature line at all.
  assert "chrF signature" not in reproduce.report([str(old)])

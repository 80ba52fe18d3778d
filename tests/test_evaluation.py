"""BLEU and chrF against figures computed outside this code. The paper-comparable BLEU
against the output of the Moses Perl scripts themselves (../shared/data/golden/README.md:
tokenizer, compound splitting, multi-bleu.perl), sacreBLEU, chrF and chrF++ against the
sacrebleu command line run once on the same files (stored below with their signatures), all
through `run.py evaluate --hypotheses` as a user runs it. Beside them: tokenized lines worked
out with the Perl scripts, the unigram precision of the BLEU worked example, a hand-worked
chrF example, and `run.py report`'s chrF columns ("–" for a results.json written before them).
"""

import json
import os
import re
import subprocess

import pytest
import sacrebleu
import shared_data
from helpers import ROOT, run_py

from transformer_mt import cli
from transformer_mt.evaluation import corpus_scores as evaluation
from transformer_mt.evaluation import reports
from transformer_mt.training import reproduce

SHARED = shared_data.DIR  # skipped when absent, failed under CI (conftest.py)
GOLDEN = SHARED / "golden"
needs_golden = pytest.mark.shared_data(
  "golden/newstest2014.perturbed.de",
  "golden/newstest2014.perturbed.fr",
  "news/en-de/newstest2014.de",
  "news/en-fr/newstest2014.fr",
  "news/en-de/newstest2014.en",
  "news/en-fr/newstest2014.en",
)

# multi-bleu.perl's output for the golden hypotheses, as ../shared/data/golden/README.md gives
# it: the Moses Perl scripts (replace-unicode-punctuation, tokenizer -l L), with and without
# tensor2tensor's ##AT## compound splitting, then multi-bleu.perl against the raw reference.
PERL_MULTI_BLEU = {
  ("de", "split"): "BLEU = 65.98, 99.8/80.2/69.4/61.0 "
  "(BP=0.865, ratio=0.873, hyp_len=56328, ref_len=64504)",
  ("de", "no split"): "BLEU = 65.54, 99.8/79.7/68.7/60.2 "
  "(BP=0.865, ratio=0.873, hyp_len=55096, ref_len=63086)",
  ("fr", "split"): "BLEU = 65.52, 99.8/79.9/69.1/60.6 "
  "(BP=0.862, ratio=0.871, hyp_len=71977, ref_len=82653)",
  ("fr", "no split"): "BLEU = 65.17, 99.8/79.5/68.5/60.0 "
  "(BP=0.862, ratio=0.871, hyp_len=70669, ref_len=81155)",
}

# `sacrebleu REF -i HYP -m bleu|chrf [--chrf-word-order 2] -w 2 --format text` (sacrebleu
# 2.6.0's command line, 2026-11-24) on the raw newstest2014 reference and the golden
# hypotheses. The signatures without their `|version:` field, which the test adds: the
# settings are what must not change.
SACREBLEU_CLI = {
  "de": {
    "sacreBLEU": ("65.53", "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"),
    "chrF": ("82.06", "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no"),
    "chrF++": ("81.62", "nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no"),
  },
  "fr": {
    "sacreBLEU": ("64.52", "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"),
    "chrF": ("80.84", "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no"),
    "chrF++": ("80.56", "nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no"),
  },
}


def _shared(relative):
  """`relative` under the shared data folder, as a path relative to the repository root (the
  way a user types it: ../shared/data/... unless TRANSFORMER_MT_SHARED_DATA moves the folder)."""
  return os.path.relpath(SHARED / relative, ROOT)


def _golden_pair(language):
  """(hypothesis path, reference path), relative to the repository root as a user types them."""
  return (
    _shared(f"golden/newstest2014.perturbed.{language}"),
    _shared(f"news/en-{language}/newstest2014.{language}"),
  )


@needs_golden
@pytest.mark.parametrize("language", ["de", "fr"])
def test_evaluate_hypotheses_gives_the_perl_and_sacrebleu_cli_figures(language):
  """The whole report of `run.py evaluate --hypotheses`, run from the repository root.

  Both EN-DE and EN-FR split compounds (evaluation.py says why), so both must print the
  "split" row; the two rows differ by 0.35-0.44 BLEU, so the wrong pipeline cannot pass."""
  hypotheses, reference = _golden_pair(language)
  result = subprocess.run(
    run_py(
      "evaluate",
      "--hypotheses",
      hypotheses,
      "--reference",
      reference,
      "--source",
      _shared(f"news/en-{language}/newstest2014.en"),
      "--tgt_lang",
      language,
    ),
    cwd=ROOT,
    capture_output=True,
    text=True,
    encoding="utf-8",
  )
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0] == f"newstest2014.perturbed.{language}: 3003 given translations"
  perl = PERL_MULTI_BLEU[language, "split"]
  assert f"    multi-bleu.perl: {perl}" in lines
  paper = re.search(r"^  paper-comparable BLEU (\S+)  \(", result.stdout, re.MULTILINE)
  assert paper and f"BLEU = {paper.group(1)}," in perl  # the same figure to 0.01
  printed = dict(
    (name, (score, signature))
    for name, score, signature in re.findall(
      r"^  (sacreBLEU|chrF|chrF\+\+) (\S+)  \((.*)\)$", result.stdout, re.MULTILINE
    )
  )
  version = f"|version:{sacrebleu.__version__}"
  assert printed == {
    name: (score, signature + version)
    for name, (score, signature) in SACREBLEU_CLI[language].items()
  }


@needs_golden
@pytest.mark.parametrize("language", ["de", "fr"])
def test_moses_tokenize_alone_gives_the_perl_row_without_compound_splitting(language):
  """The tokenizer on its own, every count of the multi-bleu.perl line: the split rows above
  cannot be matched by a splitting that makes up for a tokenizer difference."""
  hypothesis_path, reference_path = (ROOT / path for path in _golden_pair(language))
  hypotheses = hypothesis_path.read_text(encoding="utf-8").splitlines()
  references = reference_path.read_text(encoding="utf-8").splitlines()
  score, signature = evaluation.multi_bleu(
    [evaluation.moses_tokenize(line, language) for line in hypotheses],
    [evaluation.moses_tokenize(line, language) for line in references],
  )
  assert evaluation.multi_bleu_line(score) == PERL_MULTI_BLEU[language, "no split"]
  assert signature.startswith("nrefs:1|case:mixed|eff:no|tok:none|smooth:none|")


# Each expected line is what the Perl pipeline prints for the input (Moses master's
# replace-unicode-punctuation.perl | tokenizer.perl -l L -q | perl -ple 's{(\S)-(\S)}{...}g').
@pytest.mark.parametrize(
  "language, line, tokenized",
  [
    # Only a hyphen between two non-space characters is a compound hyphen; the substitution
    # does not overlap (Perl's s///g), so in "a-b-c" the second hyphen stays.
    (
      "de",
      "Die neue B 33-Fußgängerampel ist in Betrieb.",
      "Die neue B 33 ##AT##-##AT## Fußgängerampel ist in Betrieb .",
    ),
    ("de", "a - b, x- und -y a-b-c", "a - b , x- und -y a ##AT##-##AT## b-c"),
    # replace-unicode-punctuation turns the closing “ into ", which tokenizer.perl escapes;
    # the low „ is not in its table and stays.
    ("de", "„Gut“ … oder?", "„ Gut &quot; ... oder ?"),
    # Perl matches bytes: the first match takes only the first byte of "à", so the second
    # hyphen is split too (a character-level match gives "vis ##AT##-##AT## à-vis").
    (
      "fr",
      "Une relation vis-à-vis de l'Europe, dit M. Dupont.",
      "Une relation vis ##AT##-##AT## à ##AT##-##AT## vis de l&apos; Europe , dit M. Dupont .",
    ),
    # Moses master splits the last word's period even after a nonbreaking prefix ("S", "vol")
    # or a dotted word; mid-line "Mrd." and "M." stay whole.
    (
      "de",
      "Umsatz von 4,56 Mrd. Dollar, so Thomson Reuters I/B/E/S.",
      "Umsatz von 4,56 Mrd. Dollar , so Thomson Reuters I / B / E / S .",
    ),
    ("de", "gegenüber FoxNews.com.", "gegenüber FoxNews.com ."),
    ("fr", "Ça coûte 5 000 € l’an, vol.", "Ça coûte 5 000 € l&apos; an , vol ."),
  ],
)
def test_paper_tokenize_matches_the_perl_pipeline(language, line, tokenized):
  assert evaluation.paper_tokenize(line, language) == tokenized


def test_evaluate_hypotheses_rejects_bad_input_in_one_line(tmp_path, capsys):
  two, one = tmp_path / "two.txt", tmp_path / "one.txt"
  two.write_text("a b\nc d\n", encoding="utf-8")
  one.write_text("a b\n", encoding="utf-8")
  (tmp_path / "latin1.txt").write_bytes("Grüße\nc d\n".encode("latin-1"))
  score = ["evaluate", "--hypotheses", str(two), "--tgt_lang", "de", "--reference"]
  cases = [
    (score + [str(one)], "/two.txt has 2 lines, .*/one.txt has 1"),
    (score + [str(two), "--source", str(one)], "/one.txt has 1 lines, .*/two.txt has 2"),
    (score + [str(tmp_path / "latin1.txt")], "latin1.txt is not valid UTF-8"),
    (score + [str(two), "--workdir", "w", "--beam", "2"], "so --workdir, --beam .* cannot go"),
    (["evaluate", "--hypotheses", str(two), "--reference", str(two)], "needs --tgt_lang"),
    (["evaluate", "--reference", str(two)], "needs --workdir .* or --hypotheses"),
  ]
  for argv, message in cases:
    assert cli.main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and re.search(message, err), err


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


@pytest.mark.parametrize(
  "score",
  [
    evaluation.corpus_bleu,
    lambda hyps, refs: evaluation.paper_bleu_score(hyps, refs, "de"),
    lambda hyps, refs: evaluation.bleu_report(hyps, refs, "de"),
    evaluation.corpus_chrf,
  ],
  ids=["corpus_bleu", "paper_bleu_score", "bleu_report", "corpus_chrf"],
)
def test_mismatched_line_counts_name_both_counts(score):
  with pytest.raises(ValueError, match=r"3 hypotheses but 2 references"):
    score(["a", "b", "c"], ["a", "b"])


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
  # (The wrong variants are far from 55.56: beta=1 gives 64.74, orders 1..5 only 58.69.)
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
  assert "chrF signature" not in reports.report([str(old)])

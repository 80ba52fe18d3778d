"""Multi30k's published metric and recipe (issue 33).

The metric: BLEU on given tokens, against the multi-bleu.perl output for the golden file
(../shared/data/golden/README.md), through `run.py evaluate --hypotheses --bleu tokenized` as
a user runs it, and the held-out line of a run that selects it. The recipe: the learning rate
that `transformer_tiny_multi30k_ende` applies at each update against fairseq's
inverse_sqrt schedule, written out from its definition, and the decode settings of both rows
(fairseq-generate's; the rule itself is tested in test_beam_search.py).
"""

import math
import os
import re
import subprocess

import jax.numpy as jnp
import pytest
import shared_data
from helpers import ROOT, run_py

from transformer_mt.config import registry
from transformer_mt.evaluation import corpus_scores
from transformer_mt.training import optimizer, validation

SHARED = shared_data.DIR
HYPOTHESES = "golden/multi30k_test2016.perturbed.lc.norm.tok.de"
REFERENCE = "multi30k/test_2016_flickr.lc.norm.tok.de"
# mosesdecoder's `multi-bleu.perl test_2016_flickr.lc.norm.tok.de < HYPOTHESES` (README there).
PERL = "BLEU = 63.53, 100.0/77.6/67.1/58.5 (BP=0.855, ratio=0.865, hyp_len=10466, ref_len=12103)"


def _shared(relative):
  return os.path.relpath(SHARED / relative, ROOT)


def _evaluate(*flags):
  result = subprocess.run(
    run_py(
      "evaluate", "--hypotheses", _shared(HYPOTHESES), "--reference", _shared(REFERENCE), *flags
    ),
    cwd=ROOT,
    capture_output=True,
    text=True,
    encoding="utf-8",
  )
  assert result.returncode == 0, result.stderr
  return result.stdout, result.stderr


@pytest.mark.shared_data(HYPOTHESES, REFERENCE)
def test_tokenized_bleu_is_multi_bleu_perl_on_the_golden_file():
  out, err = _evaluate("--bleu", "tokenized")
  # Its secondary sacreBLEU line is of tokenized text on purpose: no "forgot to detokenize".
  assert "detokenize" not in err, err
  lines = out.splitlines()
  assert lines[0] == "multi30k_test2016.perturbed.lc.norm.tok.de: 1000 given translations"
  # The published figure leads, named as what it is, with the Perl script's own line.
  assert lines[1].startswith("  tokenized BLEU 63.53  (multi-bleu.perl on the given tokens")
  assert lines[2] == f"    multi-bleu.perl: {PERL}"
  # The detokenized pipeline (tokenize again, split compounds) gives another figure on the
  # same files, so choosing the metric matters.
  detokenized, err = _evaluate("--tgt_lang", "de")
  # Scored as detokenized text, the same tokens get sacreBLEU's warning: a real mistake there.
  assert "forgot to detokenize" in err
  paper = re.search(r"^  paper-comparable BLEU (\S+)  \(", detokenized, re.MULTILINE)
  assert paper and paper.group(1) != "63.53"


def test_the_held_out_line_names_the_tokenized_bleu(capsys):
  class Translator:
    beam_size = 5

    def translate(self, sources):
      return ["ein mann fährt fahrrad .", "zwei hunde spielen"]

  pairs = [("a", "ein mann fährt fahrrad ."), ("b", "zwei hunde spielen im schnee .")]
  result = validation.evaluate_held_out(Translator(), pairs, 0, "tokenized")
  score, _ = corpus_scores.tokenized_bleu(Translator().translate(None), [r for _, r in pairs])
  assert result["bleu"] == score.score
  out = capsys.readouterr().out
  assert (
    f"Held-out tokenized BLEU (multi-bleu.perl on the given tokens) {score.score:.2f} on 2" in out
  )


@pytest.mark.parametrize("experiment", ["transformer_tiny_multi30k_ende", "multi30k_ende"])
def test_missing_files_name_the_path_and_where_multi30k_comes_from(
  experiment, tmp_path, monkeypatch, capsys
):
  """Without the lc.norm.tok files (data.root missing, or a folder without them), the one
  error line names the path looked for and the multi30k/dataset repository's tokenized files,
  not the WMT news sets' sources; nothing is written (issue 41)."""
  from transformer_mt import cli

  monkeypatch.chdir(tmp_path)
  (tmp_path / "empty").mkdir()
  for root, looked_for in (
    ("nowhere", f"data.root={tmp_path / 'nowhere'} does not exist"),
    ("empty", f"No such file: {tmp_path / 'empty' / 'multi30k' / 'train.lc.norm.tok.en'}."),
  ):
    command = ["train", "--experiment", experiment, "--workdir", "w", f"data.root={root}"]
    # 64 rows a step: the published 114 do not split over the tests' 8 host devices.
    command.append("train.batch_tokens=4096")
    assert cli.main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert looked_for in err[0]
    assert "multi30k/dataset" in err[0] and "data/task1/tok" in err[0]
    assert "scripts/task1-tokenize.sh" in err[0] and "lc.norm.tok" in err[0]
    assert "sacrebleu" not in err[0] and "newstest" not in err[0] and "WMT" not in err[0]
  assert not (tmp_path / "w").exists()


def _fairseq_inverse_sqrt(update, warmup=2000, peak=5e-3, init=1e-7):
  """The rate fairseq 0.9's inverse_sqrt applies at 1-based `update`: set from the number of
  updates done before it (the trainer steps the scheduler after each update)."""
  done = update - 1
  if done < warmup:
    return init + done * (peak - init) / warmup
  return peak * math.sqrt(warmup) * done**-0.5


def test_the_published_row_applies_fairseqs_learning_rate():
  config = registry.load_experiment("transformer_tiny_multi30k_ende")
  schedule = optimizer.learning_rate(config.train, config.model.d_model)
  for update in (1, 2, 500, 1999, 2000, 2001, 4000, 8000):
    ours = float(schedule(jnp.asarray(update - 1)))  # optax passes the updates done
    theirs = _fairseq_inverse_sqrt(update)
    # Ours starts the warm-up at 0 and counts from 1, not from 1e-7 at 0: one warm-up step
    # (2.5e-6) apart at most, and within 0.06% of fairseq's from the peak on.
    assert abs(ours - theirs) <= 2.6e-6, update
    if update >= 2000:
      assert abs(ours / theirs - 1) < 6e-4, update


@pytest.mark.parametrize("experiment", ["transformer_tiny_multi30k_ende", "multi30k_ende"])
def test_the_rows_decode_as_fairseq_generate(experiment):
  """fairseq-generate's defaults (--beam 5 --lenpen 1, max_len_a 0, max_len_b 200): fairseq's
  pool, and every sentence, one token or 64 long, may have 200 tokens and EOS."""
  import jax

  from transformer_mt.data.tokenizer import EOS_ID
  from transformer_mt.decoding.settings import decode_settings
  from transformer_mt.decoding.translator import Translator
  from transformer_mt.model import setup
  from transformer_mt.runtime import sharding

  config = registry.load_experiment(experiment)
  settings = decode_settings(config)
  chosen = [settings[k] for k in ("beam_size", "alpha", "length_penalty", "candidate_pool")]
  assert chosen == [5, 1.0, "power", "fairseq"]
  translator = Translator(
    params=None,
    model_config=setup.model_config_for(config),
    tokenizer=None,
    mesh=sharding.make_mesh(sharding.inference_mesh_config(), devices=jax.devices()[:1]),
    **settings,
  )
  assert translator.position_limit is None  # sinusoidal positions: nothing truncated
  _, max_lengths, max_len = translator.padded_batch([[EOS_ID], [5] * 63 + [EOS_ID]])
  assert max_len == 201 and list(max_lengths[:2]) == [201, 201]


def test_qkv_init_gain_scales_only_the_query_key_value_kernels():
  """fairseq initializes Q, K and V with xavier_uniform_(gain=1/sqrt(2)): with the same seed
  those kernels are the gain-1 ones times the gain, bit for bit, and nothing else moves."""
  import numpy as np
  from flax import traverse_util
  from helpers import init_params, tiny_model_config

  gain = 2**-0.5
  plain = traverse_util.flatten_dict(init_params(tiny_model_config()))
  scaled = traverse_util.flatten_dict(init_params(tiny_model_config(qkv_init_gain=gain)))
  assert plain.keys() == scaled.keys()
  projections = 0
  for path, value in plain.items():
    if path[-2] in ("query", "key", "value") and path[-1] == "kernel":
      projections += 1
      np.testing.assert_array_equal(scaled[path], value * np.float32(gain))
    else:
      np.testing.assert_array_equal(scaled[path], value)
  # q, k, v of 2 encoder self-attentions, 2 decoder self- and 2 cross-attentions.
  assert projections == 3 * 6


def test_report_prints_the_published_figure_and_names_the_tokenized_bleu(tmp_path, capsys):
  import json

  from transformer_mt import cli
  from transformer_mt.evaluation import reports

  _, method = corpus_scores.tokenized_bleu(["a b"], ["a b"])
  results = {
    "experiment": "transformer_tiny_multi30k_ende",
    "paper_bleu": 41.02,
    "paper_bleu_source": "Wu et al. (ACL 2021)",
    "paper_comparable_bleu": 40.5,
    "paper_comparable_method": method,
    "sacrebleu": 39.0,
    "sacrebleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    "parameters": 2_900_000,
    "steps": 8000,
    "wall_seconds_this_run": 600.0,
    "hardware": "1 x cpu",
  }
  (tmp_path / reports.RESULTS_FILENAME).write_text(json.dumps(results), encoding="utf-8")
  assert cli.main(["report", str(tmp_path)]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[2].split(" | ")[1:3] == ["41.02", "40.50"]
  assert f"- transformer_tiny_multi30k_ende: {method}" in lines
  assert method.startswith("multi-bleu.perl on the given tokens")

"""`run.py score` (teacher-forced log-probabilities) and `run.py translate --nbest K`.

The model is the demo's architecture at test size with random weights (no training: compiling
the train step alone takes ~40 s on 2 cores), saved as a checkpoint like an averaged one. A
bias on the EOS logit makes its beam-search hypotheses end at many different lengths, so the
length penalty is exercised, not only sentences cut at their maximum length.

Checked against independent computations: a NumPy log-softmax of one unbatched full forward
pass per pair, the length penalties' formulas written out here, and beam search's own scores
of the hypotheses it returned (forced finish, forced first token and both penalties).
"""

import collections
import dataclasses
import functools
import logging

import flax.linen as nn
import jax
import numpy as np
import pytest
from helpers import end_to_end_overrides

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.data import sources as data_sources
from transformer_mt.data import tokenizer as tokenizers
from transformer_mt.decoding import loading
from transformer_mt.decoding import teacher_forcing as scoring
from transformer_mt.model import setup as run_setup
from transformer_mt.model.transformer import Transformer
from transformer_mt.workdir import checkpointing

pytestmark = pytest.mark.slow

TINY = end_to_end_overrides()  # test_end_to_end.py's

EOS_BIAS = 3.0  # large enough that hypotheses end at 1 to 23 tokens, small enough not at once


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  """(workdir, test pairs) of a tiny random demo-architecture model with beam 4."""
  workdir = str(tmp_path_factory.mktemp("scoring"))
  config = registry.load_experiment("demo", TINY + ["decode.beam_size=4"])
  config.model.logits_bias = True  # where the EOS bias goes
  pairs = data_sources.load_pairs(config.data)
  tokenizer = tokenizers.load_or_train(workdir, pairs["train"], config.tokenizer)
  model_config = run_setup.model_config_for(config, tokenizer)
  dummy = np.ones((1, 2), np.int32)
  params = nn.unbox(Transformer(model_config).init(jax.random.key(0), dummy, dummy)["params"])
  params["logits_bias"] = params["logits_bias"].at[model_config.eos_id].set(EOS_BIAS)
  checkpointing.save_inference(workdir, 0, params, config, tokenizer)
  return workdir, list(pairs["test"][:20])


@pytest.fixture(scope="module")
def translator(model):
  return loading.load_translator(model[0])


REFERENCE_LEN = 48  # > any target here (at most 24 generated tokens; test targets < 40)


@functools.partial(jax.jit, static_argnames="config")
def _full_forward(params, inputs, targets_in, config):
  return Transformer(config.replace(deterministic=True)).apply(
    {"params": params}, inputs, targets_in
  )


def numpy_log_prob(translator, source_ids, target_ids, forced_first_id=None) -> float:
  """Summed log-softmax of one pair from a full forward pass, unbatched, computed in NumPy,
  with the ids decoding never emits masked and a forced first token at probability 1."""
  config = translator.model_config
  # One device, one pair, the source unpadded: nothing of the batching, source padding or
  # sharding under test. The decoder input is padded at its end to REFERENCE_LEN positions,
  # which the causal mask hides from the target's own (and which spares a compilation per
  # target length).
  targets_in = np.full((1, REFERENCE_LEN), config.pad_id, np.int32)
  targets_in[0, 0] = config.decoder_start_id
  targets_in[0, 1 : len(target_ids)] = target_ids[:-1]
  params = jax.device_get(translator.params)
  logits = _full_forward(params, np.array([source_ids]), targets_in, config)
  logits = np.asarray(logits[0, : len(target_ids)], np.float64)  # [tgt_len, vocab]
  logits[:, list(config.suppressed_ids)] = -np.inf
  if forced_first_id is not None:
    logits[0, :] = -np.inf
    logits[0, forced_first_id] = 0.0
  top = logits.max(axis=1, keepdims=True)
  log_probs = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
  return float(sum(log_probs[i, t] for i, t in enumerate(target_ids)))


def gnmt(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


def test_score_equals_numpy_log_softmax_of_each_full_forward(translator, model, caplog):
  pairs = model[1] + [("the dog sees a cat", ""), ("", "ein Hund")]
  with caplog.at_level(logging.WARNING):
    scores = scoring.score_lines(translator, [s for s, _ in pairs], [t for _, t in pairs])
  assert len(scores) == len(pairs)
  # The empty source line, named 1-based.
  assert [r.getMessage().split(" (1-based)")[0] for r in caplog.records] == [
    f"Source line(s) {len(pairs)}"
  ]
  tokenizer = translator.tokenizer
  encoded = [(tokenizer.encode([s])[0], tokenizer.encode_targets([t])[0]) for s, t in pairs]
  # An empty source is scored as the model reads one: EOS alone (fairseq's encoding of it).
  assert encoded[-1][0] == [translator.model_config.eos_id]
  # The reference compiles once per source length: check the pairs of the 3 commonest
  # lengths (and the empty target and the empty source), scored above in batches among all
  # the others.
  counts = collections.Counter(len(s) for s, _ in encoded)
  common = {length for length, _ in counts.most_common(3)} | {len(encoded[-2][0]), 1}
  checked = 0
  for (source_ids, target_ids), score in zip(encoded, scores):
    assert score.tokens == len(target_ids)
    if len(source_ids) not in common:
      continue
    checked += 1
    expected = numpy_log_prob(translator, source_ids, target_ids)
    np.testing.assert_allclose(score.logprob, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(score.per_token, expected / len(target_ids), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
      score.score, expected / gnmt(len(target_ids), translator.alpha), rtol=1e-5, atol=1e-4
    )
  assert checked >= 9  # the empty source among them (its length, 1, is in `common`)
  assert scores[-2].tokens == 1  # an empty target: EOS alone
  assert np.isfinite(scores[-1].logprob) and scores[-1].tokens == len(encoded[-1][1])
  # Batches of 8 sorted by length: a reordering bug would give another pair's numbers.
  assert len({round(s.logprob, 3) for s in scores}) > len(pairs) - 3


@pytest.mark.parametrize(
  "variant",
  [
    {},
    # Hypotheses cut at 5 tokens (no EOS), and a first token forced at no cost.
    {"max_target_len": 5, "forced_first_id": 7},
    {"length_penalty": "power", "alpha": 1.0, "candidate_pool": "2beam"},
  ],
  ids=["gnmt", "cut-and-forced", "power"],
)
def test_beam_hypotheses_score_as_the_search_scored_them(translator, model, variant):
  translator = dataclasses.replace(translator, **variant)
  config = translator.model_config
  sources = [ids for ids in translator.encode_sources([s for s, _ in model[1][:8]])]
  result = translator._search_batch(sources)
  pairs, search_scores, search_log_probs = [], [], []
  for row, source in enumerate(sources):
    for rank in range(translator.beam_size):
      if not np.isfinite(result.all_scores[row, rank]):
        continue
      ids = [int(t) for t in result.all_sequences[row, rank] if t != config.pad_id]
      pairs.append((source, ids))
      search_scores.append(result.all_scores[row, rank])
      search_log_probs.append(result.all_log_probs[row, rank])
  lengths = [len(ids) for _, ids in pairs]
  if "max_target_len" in variant:
    assert max(lengths) == 5 and any(ids[-1] != config.eos_id for _, ids in pairs)
    assert all(ids[0] == variant["forced_first_id"] for _, ids in pairs)
  else:
    assert len(set(lengths)) > 5  # many lengths: the penalty matters
  scores = scoring.score_ids(translator, [s for s, _ in pairs], [t for _, t in pairs])
  np.testing.assert_allclose([s.score for s in scores], search_scores, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose([s.logprob for s in scores], search_log_probs, rtol=1e-5, atol=1e-4)
  # The search's log-probs are its scores times the penalty, written out here.
  if variant.get("length_penalty") == "power":
    penalties = np.array(lengths, np.float64) ** variant["alpha"]
  else:
    penalties = gnmt(np.array(lengths, np.float64), translator.alpha)
  np.testing.assert_allclose(search_log_probs, np.array(search_scores) * penalties, rtol=1e-5)
  # One of them against the unbatched NumPy forward, forced first token included.
  source, target = pairs[1]
  expected = numpy_log_prob(translator, source, target, variant.get("forced_first_id"))
  np.testing.assert_allclose(scores[1].logprob, expected, rtol=1e-5, atol=1e-4)


def _rows(path):
  return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


def test_nbest_and_score_commands(model, tmp_path, capsys):
  workdir, pairs = model
  sources = [s for s, _ in pairs[:6]]
  sources.insert(2, "")
  source = tmp_path / "source.txt"
  source.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
  nbest, best = tmp_path / "nbest.tsv", tmp_path / "best.txt"
  common = ["--workdir", workdir, "--input", str(source)]
  assert cli.main(["translate", *common, "--output", str(nbest), "--nbest", "3"]) == 0
  assert cli.main(["translate", *common, "--output", str(best), "--beam", "4"]) == 0
  rows = _rows(nbest)
  assert [(int(r[0]), int(r[1])) for r in rows] == [(i, k) for i in range(7) for k in range(3)]
  assert rows[6:9] == [["2", "0", "0.000000", "0.000000", ""]] + [
    ["2", k, "-inf", "-inf", ""] for k in "12"
  ]
  # Rank 0 is what translate writes with the same beam (the config's 4).
  assert [r[4] for r in rows if r[1] == "0"] == best.read_text(encoding="utf-8").splitlines()
  for i in range(7):
    group = [float(r[2]) for r in rows if r[0] == str(i)]
    assert group == sorted(group, reverse=True)

  # `score` of every hypothesis gives its n-best score (unless its text re-encodes otherwise).
  hypotheses = tmp_path / "hypotheses.txt"
  hypotheses.write_text("".join(r[4] + "\n" for r in rows), encoding="utf-8")
  repeated = tmp_path / "repeated.txt"
  repeated.write_text("".join(sources[int(r[0])] + "\n" for r in rows), encoding="utf-8")
  scored = tmp_path / "scores.tsv"
  args = ["score", "--workdir", workdir, "--source", str(repeated), "--target", str(hypotheses)]
  assert cli.main([*args, "--output", str(scored)]) == 0
  score_rows = _rows(scored)
  assert [int(r[0]) for r in score_rows] == list(range(len(rows)))
  tokenizer = loading.load_translator(workdir).tokenizer
  checked = 0
  for nbest_row, score_row in zip(rows, score_rows):
    text = nbest_row[4]
    ids = tokenizer.encode_targets([text])[0]
    if not nbest_row[4] or tokenizer.decode(ids) != text or int(score_row[2]) > 24:
      continue  # the empty line, and hypotheses cut at the maximum length (24) without EOS
    assert int(score_row[2]) == len(ids)
    np.testing.assert_allclose(float(score_row[4]), float(nbest_row[2]), atol=1e-4)
    np.testing.assert_allclose(float(score_row[1]), float(nbest_row[3]), atol=1e-4)
    checked += 1
  assert checked >= 10

  # --nbest without --beam widens the config's beam (4) to K.
  assert cli.main(["translate", *common, "--output", str(nbest), "--nbest", "5"]) == 0
  assert len(_rows(nbest)) == 5 * 7

  # Bad input: one error line each, exit status 2.
  capsys.readouterr()
  assert cli.main(["translate", *common, "--nbest", "5", "--beam", "4"]) == 2
  assert cli.main(["translate", *common, "--nbest", "0"]) == 2
  assert cli.main([*args[:-1], str(source)]) == 2  # 7 source lines, 21 target lines
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 3 and all(line.startswith("error: ") for line in err), err
  assert "--beam 5" in err[0] and "line" in err[2]

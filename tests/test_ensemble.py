"""Ensembles: `--workdir W1 --workdir W2 ...` on translate, evaluate and score.

Members are random tiny models of the demo's vocabulary (no training), saved as checkpoints:
two of the same architecture with different seeds and a third with another depth (an
ensemble's architectures may differ). A bias on the EOS logit makes beam hypotheses end at
many lengths, so the length penalty and the finished set are exercised.

Checked against independent computations: each member's teacher-forced full forward pass
with a NumPy log-softmax (the ensemble's incremental step must give their mean at every
position), the model itself (an ensemble of one model twice must decode bit for bit as it
does), and `score` (a full forward pass per member) against beam search's own scores of the
hypotheses it returned.
"""

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest
from helpers import end_to_end_overrides

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.data import sources as data_sources
from transformer_mt.data import tokenizer as tokenizers
from transformer_mt.decoding import incremental as decode
from transformer_mt.decoding import loading
from transformer_mt.decoding import teacher_forcing as scoring
from transformer_mt.model import setup as run_setup
from transformer_mt.model.transformer import Transformer
from transformer_mt.workdir import checkpointing

pytestmark = pytest.mark.slow

TINY = end_to_end_overrides()  # test_end_to_end.py's

EOS_BIAS = 3.0  # hypotheses end at many lengths (tests/test_scoring.py)


def _save_random_model(workdir, config, tokenizer, seed):
  model_config = run_setup.model_config_for(config, tokenizer)
  dummy = np.ones((1, 2), np.int32)
  params = nn.unbox(Transformer(model_config).init(jax.random.key(seed), dummy, dummy)["params"])
  params["logits_bias"] = params["logits_bias"].at[model_config.eos_id].set(EOS_BIAS)
  checkpointing.save_inference(str(workdir), 0, params, config, tokenizer)


@pytest.fixture(scope="module")
def members(tmp_path_factory):
  """(workdirs of 3 members sharing a tokenizer, test pairs, a workdir with another tokenizer)."""
  root = tmp_path_factory.mktemp("ensemble")
  for name in ("a", "b", "c", "other"):
    (root / name).mkdir()
  config = registry.load_experiment("demo", TINY + ["decode.beam_size=4"])
  config.model.logits_bias = True
  pairs = data_sources.load_pairs(config.data)
  tokenizer = tokenizers.load_or_train(str(root / "a"), pairs["train"], config.tokenizer)
  deeper = registry.load_experiment(
    "demo", TINY + ["decode.beam_size=4", "model.num_decoder_layers=2"]
  )
  deeper.model.logits_bias = True
  workdirs = [str(root / name) for name in "abc"]
  for workdir, member_config, seed in zip(workdirs, (config, config, deeper), (0, 1, 2)):
    _save_random_model(workdir, member_config, tokenizer, seed)
  other_config = registry.load_experiment("demo", TINY + ["tokenizer.vocab_size=280"])
  other_config.model.logits_bias = True
  other = str(root / "other")
  other_tokenizer = tokenizers.load_or_train(other, pairs["train"], other_config.tokenizer)
  _save_random_model(other, other_config, other_tokenizer, 3)
  return workdirs, list(pairs["test"][:12]), other


@functools.partial(jax.jit, static_argnames="config")
def _full_forward(params, inputs, targets_in, config):
  return Transformer(config.replace(deterministic=True)).apply(
    {"params": params}, inputs, targets_in
  )


def _numpy_log_softmax(logits, suppressed):
  logits = np.asarray(logits, np.float64).copy()
  logits[..., list(suppressed)] = -np.inf
  top = logits.max(axis=-1, keepdims=True)
  return logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


def test_ensemble_step_is_the_mean_of_the_members_log_probs(members):
  """Feed one target through the ensemble's incremental step (KV caches, one member per
  cache key) and compare each position with the mean of the members' log-softmax, each
  from its own full teacher-forced forward pass."""
  workdirs, pairs, _ = members
  ensemble = loading.load_translator(workdirs)
  assert len(ensemble.members) == 3 and ensemble.members[0] != ensemble.members[2]
  source, target = pairs[0]
  source_ids = np.array(ensemble.tokenizer.encode([source]), np.int32)  # [1, src_len]
  target_ids = ensemble.tokenizer.encode_targets([target])[0]
  config = ensemble.model_config
  tokens_in = [config.decoder_start_id] + target_ids[:-1]

  expected = []
  for params, member_config in zip(ensemble.params, ensemble.members):
    logits = _full_forward(
      jax.device_get(params), source_ids, np.array([tokens_in], np.int32), member_config
    )
    expected.append(_numpy_log_softmax(logits[0], member_config.suppressed_ids))
  expected = np.mean(expected, axis=0)  # [tgt_len, vocab]

  step = jax.jit(decode.model_step(ensemble.params, source_ids != config.pad_id, ensemble.members))
  init_cache = jax.jit(decode.init_cache, static_argnums=(2, 3))  # one program, not op by op
  cache = init_cache(ensemble.params, source_ids, ensemble.members, len(tokens_in))
  assert sorted(cache) == [decode.member_key(i) for i in range(3)]
  for position, token in enumerate(tokens_in):
    scores, cache = step(np.array([token], np.int32), np.int32(position), cache)
    finite = np.isfinite(expected[position])
    np.testing.assert_array_equal(np.isfinite(scores[0]), finite)
    np.testing.assert_allclose(scores[0][finite], expected[position][finite], atol=2e-5)
  # Not one member's distribution, nor the renormalised mean.
  assert not np.allclose(expected, _numpy_log_softmax(expected, ()), atol=1e-3)


def _translate(args, tmp_path, name, capsys):
  output = tmp_path / name
  assert cli.main(["translate", *args, "--output", str(output)]) == 0, capsys.readouterr().err
  return output.read_text(encoding="utf-8")


def _same_rows(a: str, b: str, text_columns: tuple[int, ...]):
  """Two TSV outputs with the same rows: text columns equal, numbers to float32 rounding
  (the ensemble's log-softmax is fused apart from the search, a last-digit difference)."""
  rows_a = [r.split("\t") for r in a.splitlines()]
  rows_b = [r.split("\t") for r in b.splitlines()]
  assert len(rows_a) == len(rows_b)
  for x, y in zip(rows_a, rows_b):
    for column, (u, v) in enumerate(zip(x, y, strict=True)):
      if column in text_columns:
        assert u == v
      else:
        np.testing.assert_allclose(float(u), float(v), rtol=1e-6, atol=2e-6)


def test_an_ensemble_of_one_model_twice_decodes_as_that_model(members, tmp_path, capsys):
  workdirs, pairs, _ = members
  source = tmp_path / "source.txt"
  source.write_text("".join(s + "\n" for s, _ in pairs[:8]) + "\n", encoding="utf-8")
  target = tmp_path / "target.txt"
  target.write_text("".join(t + "\n" for _, t in pairs[:8]) + "\n", encoding="utf-8")
  one, twice = ["--workdir", workdirs[0]], ["--workdir", workdirs[0], "--workdir", workdirs[0]]
  common = ["--input", str(source), "--beam", "4"]
  single = _translate(one + common, tmp_path, "one.txt", capsys)
  assert _translate(twice + common, tmp_path, "twice.txt", capsys) == single
  assert len(single.splitlines()) == 9 and len(set(single.splitlines())) > 5
  # Sampling reads the mean log-probs as logits: the same distribution as the model's own
  # logits, shifted by a constant per row (the draws could differ only at float ties).
  sample = ["--input", str(source), "--sample", "--seed", "3"]
  single_samples = _translate(one + sample, tmp_path, "one.samples", capsys).splitlines()
  twice_samples = _translate(twice + sample, tmp_path, "twice.samples", capsys).splitlines()
  assert sum(a == b for a, b in zip(single_samples, twice_samples)) >= len(single_samples) - 1
  assert single_samples != single.splitlines()  # sampled, not the beam's output
  common += ["--nbest", "4"]
  single = _translate(one + common, tmp_path, "one.tsv", capsys)
  _same_rows(_translate(twice + common, tmp_path, "twice.tsv", capsys), single, (0, 1, 4))
  assert len(single.splitlines()) == 9 * 4
  scores = {}
  for name, flags in (("one", one), ("twice", twice)):
    output = tmp_path / f"{name}.scores"
    args = ["score", *flags, "--source", str(source), "--target", str(target)]
    assert cli.main([*args, "--output", str(output)]) == 0
    scores[name] = output.read_text(encoding="utf-8")
  _same_rows(scores["twice"], scores["one"], (0, 2))


def test_ensemble_nbest_scores_are_what_score_gives_its_hypotheses(members):
  """Beam search over the mean log-probs (not renormalised) against `score`, which sums the
  members' mean token log-probs from full forward passes: the same numbers."""
  workdirs, pairs, _ = members
  ensemble = loading.load_translator(workdirs)
  config = ensemble.model_config
  sources = ensemble.encode_sources([s for s, _ in pairs[:8]])
  result = ensemble._search_batch(sources)
  hypotheses, search_scores, search_log_probs = [], [], []
  for row, source in enumerate(sources):
    for rank in range(ensemble.beam_size):
      if np.isfinite(result.all_scores[row, rank]):
        ids = [int(t) for t in result.all_sequences[row, rank] if t != config.pad_id]
        hypotheses.append((source, ids))
        search_scores.append(result.all_scores[row, rank])
        search_log_probs.append(result.all_log_probs[row, rank])
  assert len({len(ids) for _, ids in hypotheses}) >= 4  # several lengths: the penalty matters
  scores = scoring.score_ids(ensemble, [s for s, _ in hypotheses], [t for _, t in hypotheses])
  np.testing.assert_allclose([s.logprob for s in scores], search_log_probs, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose([s.score for s in scores], search_scores, rtol=1e-5, atol=1e-4)
  # The ensemble's score of a pair is the mean of its members' (sum of means = mean of sums).
  separately = [
    scoring.score_ids(
      loading.load_translator(w), [s for s, _ in hypotheses[:6]], [t for _, t in hypotheses[:6]]
    )
    for w in workdirs
  ]
  np.testing.assert_allclose(
    [s.logprob for s in scores[:6]],
    np.mean([[s.logprob for s in member] for member in separately], axis=0),
    rtol=1e-5,
    atol=1e-4,
  )
  # And it decodes differently from each member alone.
  best = [ids for ids in result.sequences]
  alone = loading.load_translator(workdirs[0])._search_batch(sources).sequences
  assert not np.array_equal(np.asarray(best), np.asarray(alone))


def test_evaluate_an_ensemble(members, tmp_path, capsys):
  workdirs, pairs, _ = members
  source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
  source.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
  reference.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
  flags = [f for w in workdirs[:2] for f in ("--workdir", w)]
  args = ["evaluate", *flags, "--source", str(source), "--reference", str(reference)]
  assert cli.main([*args, "--beam", "4"]) == 0, capsys.readouterr().err
  out = capsys.readouterr().out
  assert "sacreBLEU" in out
  report_path = out.split("report: ")[1].strip()
  assert report_path.startswith(workdirs[0]) and report_path.endswith("-ensemble2.json")
  with open(report_path.replace(".json", ".txt"), encoding="utf-8") as f:
    hypotheses = f.read().splitlines()
  expected = loading.load_translator(workdirs[:2], beam_size=4).translate([s for s, _ in pairs])
  assert hypotheses == expected


def test_members_with_different_tokenizers_are_one_error_line(
  members, tmp_path, capsys, monkeypatch
):
  workdirs, _, other = members

  def no_restore(*args, **kwargs):
    raise AssertionError("parameters restored before the members were checked")

  monkeypatch.setattr(checkpointing, "restore_params", no_restore)
  source = tmp_path / "source.txt"
  source.write_text("a house\n", encoding="utf-8")
  output = tmp_path / "out.txt"
  args = ["translate", "--workdir", workdirs[0], "--workdir", other, "--input", str(source)]
  assert cli.main([*args, "--output", str(output)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and "different tokenizer" in err[0]
  assert other in err[0] and workdirs[0] in err[0]
  assert not output.exists()

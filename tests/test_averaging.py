"""Checkpoint averaging returns exactly the mean of the chosen checkpoints' parameters."""

import contextlib
import io
import os

import grain
import jax
import numpy as np
import pytest

from transformer_mt.config import defaults as _defaults
from transformer_mt.data.tokenizer import train_tokenizer
from transformer_mt.runtime import sharding
from transformer_mt.training import setup as run_setup
from transformer_mt.training import train_step
from transformer_mt.workdir import averaging, checkpointing


@pytest.fixture(scope="module")
def setup():
  config = _defaults.base_config()
  config.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
  tokenizer = train_tokenizer([("a b c d", "e f g h")] * 50, vocab_size=14)
  setup = run_setup.training_setup(config, tokenizer, sharding.make_mesh(config.mesh))
  states = [
    train_step.create_sharded_state(seed, setup.model, setup.tx, setup.mesh) for seed in (1, 2)
  ]
  return config, tokenizer, states, setup.abstract_params


def save_states(workdir, states, config, tokenizer):
  manager = checkpointing.make_manager(str(workdir), keep=10)
  iterator = iter(grain.MapDataset.range(3).to_iter_dataset())
  for step, state in enumerate(states, start=1):
    checkpointing.save(manager, step * 10, state, iterator, config, tokenizer, force=True)
  checkpointing.wait(manager)


def averaged_params(output, step, target):
  return jax.device_get(checkpointing.restore_params(output, step, target))


def test_identical_checkpoints_average_to_themselves(setup, tmp_path):
  config, tokenizer, states, target = setup
  save_states(tmp_path / "run", [states[0]] * 3, config, tokenizer)
  output, steps = averaging.average_last(str(tmp_path / "run"), 3)
  assert steps == [10, 20, 30]
  # Parameters, config and tokenizer only: no optimizer state, no data iterator.
  items = set(os.listdir(os.path.join(checkpointing.checkpoint_dir(output), "30")))
  assert {"params", "config", "tokenizer"} <= items and not items & {"train_state", "data_iter"}
  jax.tree.map(
    np.testing.assert_array_equal,
    averaged_params(output, 30, target),
    jax.device_get(states[0].params),
  )


def test_two_checkpoints_average_to_their_mean(setup, tmp_path):
  config, tokenizer, states, target = setup
  save_states(tmp_path / "run", [states[1], states[0], states[1]], config, tokenizer)
  output, steps = averaging.average_last(str(tmp_path / "run"), 2, str(tmp_path / "avg"))
  assert steps == [20, 30]
  expected = jax.tree.map(
    lambda a, b: (np.asarray(a) + np.asarray(b)) / 2,
    jax.device_get(states[0].params),
    jax.device_get(states[1].params),
  )
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
    averaged_params(output, 30, target),
    expected,
  )


def test_average_skips_resume_points(setup, tmp_path):
  """`run.py average --last 2` over regular checkpoints 10 and 20 and a resume point 25 (saved
  off the grid, marked) averages 10 and 20; asking for 3 names the resume point it skipped."""
  config, tokenizer, states, target = setup
  workdir = str(tmp_path / "run")
  save_states(workdir, [states[1], states[0]], config, tokenizer)
  manager = checkpointing.make_manager(workdir, keep=10, save_every=10)
  iterator = iter(grain.MapDataset.range(3).to_iter_dataset())
  checkpointing.save(
    manager, 25, states[1], iterator, config, tokenizer, force=True, resume_point_only=True
  )
  checkpointing.wait(manager)
  assert checkpointing.all_steps(workdir) == [10, 20, 25]
  output, steps = averaging.average_last(workdir, 2)
  assert steps == [10, 20]
  expected = jax.tree.map(
    lambda a, b: (np.asarray(a) + np.asarray(b)) / 2,
    jax.device_get(states[0].params),
    jax.device_get(states[1].params),
  )
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
    averaged_params(output, 20, target),
    expected,
  )
  from transformer_mt.runtime import errors

  with pytest.raises(errors.BadValue, match=r"\[10, 20\] and resume point\(s\) \[25\]"):
    averaging.average_last(workdir, 3, str(tmp_path / "avg3"))


# The run both train tests read: evaluate.average_last=2, checkpoints every 8 steps (2 kept), 30
# steps, so step 30 is saved off the grid, a resume point only, and the final model is the mean
# of 16 and 24.
AVERAGED_RUN = [
  "train.num_steps=30",
  "train.checkpoint_every=8",
  "train.keep_checkpoints=2",
  "train.eval_every=0",
  "train.bleu_every=0",
]


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory):
  """`run.py train` of the tiny demo run with AVERAGED_RUN and 20 held-out pairs, in-process:
  (workdir, what it printed, the parameters its held-out evaluation translated with,
  train.train's result)."""
  from helpers import tiny_overrides

  from transformer_mt import cli
  from transformer_mt.training import train, validation

  evaluated, results = [], []
  real_evaluate, real_train = validation.evaluate_held_out, train.train

  def spy_evaluate(translator, *args):
    evaluated.append(jax.device_get(translator.params))
    return real_evaluate(translator, *args)

  def spy_train(*args, **kwargs):
    results.append(real_train(*args, **kwargs))
    return results[-1]

  workdir = str(tmp_path_factory.mktemp("averaged") / "run")
  flags = tiny_overrides(*AVERAGED_RUN) + ["evaluate.average_last=2", "data.num_eval=20"]
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(validation, "evaluate_held_out", spy_evaluate)
    patch.setattr(train, "train", spy_train)
    printed = io.StringIO()  # a module fixture has no capsys
    with contextlib.redirect_stdout(printed):
      assert cli.main(["train", "--experiment", "demo", "--workdir", workdir, *flags]) == 0
  assert len(evaluated) == len(results) == 1
  return workdir, printed.getvalue(), evaluated[0], results[0]


def test_train_evaluates_the_average_that_average_makes(averaged_run, tmp_path):
  """evaluate.average_last=2: `train`'s held-out evaluation translates with the mean of its
  last 2 checkpoints, bit for bit the parameters `run.py average --last 2` writes, not the
  last step's."""
  workdir, out, evaluated, result = averaged_run
  assert result["averaged_steps"] == [16, 24] and result["bleu"] is not None
  assert "the mean of the last 2 checkpoints, steps [16, 24]" in out
  output, steps = averaging.average_last(workdir, 2, str(tmp_path / "avg"))
  assert steps == [16, 24]
  target = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
    result["state"].params,
  )
  jax.tree.map(np.testing.assert_array_equal, evaluated, averaged_params(output, 24, target))
  last = jax.device_get(result["state"].params)
  assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, evaluated, last)))


def test_keeping_fewer_checkpoints_than_the_average_stops_before_training(tmp_path):
  from transformer_mt.config import registry
  from transformer_mt.runtime import errors
  from transformer_mt.training import train

  config = registry.load_experiment("demo", ["evaluate.average_last=3", "train.keep_checkpoints=2"])
  with pytest.raises(errors.BadValue, match="train.keep_checkpoints=3"):
    train.train(config, str(tmp_path / "run"), progress=False)
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


@pytest.mark.slow
def test_train_then_evaluate_its_final_model_prints_the_same_bleu(averaged_run, capsys):
  """The run of `averaged_run` (evaluate.average_last=2, checkpoints every 8, 30 steps: step 30
  is saved off the grid, a resume point only, so the final model is the mean of 16 and 24).
  `train`'s closing line names where it is, and `evaluate --workdir` there prints the BLEU
  `train` printed and translates the held-out sources as `train`'s printed examples; the
  workdir's latest checkpoint (step 30), another model, translates them otherwise. The
  translations decide, not the BLEU alone: this barely trained model's BLEU is 0.00, so equal
  BLEUs would not tell two models apart."""
  import re

  from transformer_mt import cli

  workdir, out, _, _ = averaged_run
  assert "the mean of the last 2 checkpoints, steps [16, 24]" in out
  final = out.split("the final model (averaged): ")[1].split()[0]
  assert final == os.path.join(workdir, "averaged_last2_to24")
  assert checkpointing.all_steps(workdir) == [16, 24, 30]
  trained = re.search(r"Held-out BLEU (\S+) on 20 sentences", out).group(1)
  examples = re.findall(r"^  hypothesis: (.*)$", out, flags=re.MULTILINE)
  assert examples and all(examples), out  # the model writes something for each example

  def evaluated(directory):
    """(printed sacreBLEU, the first len(examples) translations of its hypotheses file)."""
    assert cli.main(["evaluate", "--workdir", directory]) == 0
    printed = capsys.readouterr().out
    report = re.search(r"report: (\S+)\.json", printed).group(1)
    with open(report + ".txt", encoding="utf-8") as f:
      translations = f.read().splitlines()[: len(examples)]
    return re.search(r"sacreBLEU (\S+) ", printed).group(1), translations

  assert evaluated(final) == (trained, examples)
  assert evaluated(workdir)[1] != examples

"""Checkpoint averaging returns exactly the mean of the chosen checkpoints' parameters."""

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

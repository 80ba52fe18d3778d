"""Checkpoints written by an earlier version of the project still restore.

tests/data/checkpoint_8322972 was written by main at 8322972 (after the move into stage
folders, before the tokenizer item left checkpointing.py): `run.py train --experiment demo` on
tiny settings (d_model 32, 1+1 layers, vocabulary 300) for 3 steps, then its parameters, config
and tokenizer saved alone with `checkpointing.save_inference` (no optimizer state, to keep the
fixture small). The figures below were read from it by that version.
"""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

from transformer_mt.decoding import loading
from transformer_mt.model.setup import model_setup
from transformer_mt.runtime import sharding
from transformer_mt.workdir import checkpointing, tokenizer_item

FIXTURE = pathlib.Path(__file__).resolve().parent / "data" / "checkpoint_8322972"
SENTENCE = "these gentle rabbits reach my boxes"
# What the writing version read back: the tokenizer's ids for SENTENCE, the parameters' leaf
# count, element count and sum of absolute values.
IDS = [73, 182, 90, 13, 128, 188, 281, 13, 242, 47, 123, 298, 20, 1]
LEAVES, ELEMENTS, ABS_SUM = 40, 30880, 4410.043152039379
PINNED = "transformer_mt.checkpointing.TokenizerCheckpointHandler"


@pytest.fixture
def old_workdir(tmp_path):
  """A copy, so nothing Orbax does when opening a checkpoint can touch the fixture."""
  return str(shutil.copytree(FIXTURE, tmp_path / "old"))


def _item_handlers(workdir, step):
  path = pathlib.Path(workdir) / "checkpoints" / str(step) / "_CHECKPOINT_METADATA"
  return json.loads(path.read_text())["item_handlers"]


def _restore(workdir):
  config, tokenizer, step = checkpointing.read_config(workdir)
  mesh = sharding.make_mesh(sharding.inference_mesh_config())
  target = model_setup(config, tokenizer, mesh).abstract_params
  return config, tokenizer, step, checkpointing.restore_params(workdir, step, target)


def _check(config, tokenizer, step, params):
  assert step == 3
  assert (config.model.d_model, config.tokenizer.vocab_size) == (32, 300)
  assert tokenizer.encode([SENTENCE]) == [IDS]
  leaves = jax.tree.leaves(params)
  assert len(leaves) == LEAVES
  assert sum(leaf.size for leaf in leaves) == ELEMENTS
  total = sum(float(np.abs(np.asarray(leaf, np.float64)).sum()) for leaf in leaves)
  assert total == pytest.approx(ABS_SUM, rel=1e-9)


def test_a_checkpoint_of_main_restores_and_translates(old_workdir):
  # The fixture names the tokenizer's handler by the module it was in then.
  assert _item_handlers(old_workdir, 3)["tokenizer"] == (
    "transformer_mt.workdir.checkpointing.TokenizerCheckpointHandler"
  )
  _check(*_restore(old_workdir))
  (hypothesis,) = loading.load_translator(old_workdir).translate([SENTENCE])
  assert isinstance(hypothesis, str)


def test_new_checkpoints_record_the_pinned_handler_name_and_restore(old_workdir, tmp_path):
  """The handler's Orbax type string stays the name it had before it moved (typestr), so a
  checkpoint's metadata does not depend on which module holds the class."""
  assert tokenizer_item.TokenizerCheckpointHandler.typestr() == PINNED
  config, tokenizer, step, params = _restore(old_workdir)
  new = str(tmp_path / "new")
  checkpointing.save_inference(new, step, params, config, tokenizer)
  assert _item_handlers(new, step) == dict(_item_handlers(old_workdir, step), tokenizer=PINNED)
  _check(*_restore(new))

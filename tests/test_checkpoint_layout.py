"""Checkpoint layout: parameters and optimizer state are separate items, inference reads
`params` alone on its own mesh, and an old one-item checkpoint stops with one line."""

import os
import pathlib
import shutil
import subprocess

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import ROOT, child_xla_flags, run_py, tiny_overrides

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.data import synthetic
from transformer_mt.data.tokenizer import train_tokenizer
from transformer_mt.decoding import loading
from transformer_mt.runtime import sharding
from transformer_mt.training import optimizer, train, train_step
from transformer_mt.training import setup as run_setup
from transformer_mt.workdir import checkpointing

TINY = tiny_overrides("decode.batch_size=8")
SOURCES = ["the old dog watched these big red apples", "my cats saw a bird", ""]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A randomly initialised tiny model saved as a training checkpoint (step 5)."""
  workdir = str(tmp_path_factory.mktemp("saved"))
  config = registry.load_experiment("demo", TINY)
  tokenizer = train_tokenizer(synthetic.generate_splits(2000, 8, seed=1)["train"], 300)
  setup = run_setup.training_setup(config, tokenizer, sharding.make_mesh(config.mesh))
  state = train_step.create_sharded_state(0, setup.model, setup.tx, setup.mesh)
  manager = checkpointing.make_manager(workdir, keep=2)
  iterator = iter(grain.MapDataset.range(3).to_iter_dataset())
  checkpointing.save(manager, 5, state, iterator, config, tokenizer, force=True)
  checkpointing.wait(manager)
  return workdir, jax.device_get(state.params)


def test_training_checkpoint_holds_params_and_train_state_apart(saved):
  step_dir = pathlib.Path(saved[0]) / "checkpoints" / "5"
  items = {p.name for p in step_dir.iterdir() if p.is_dir()}
  assert {"params", "train_state", "data_iter", "config", "tokenizer"} <= items
  assert "state" not in items
  train_state = ocp.StandardCheckpointer().metadata(step_dir / "train_state")
  train_state = getattr(train_state, "item_metadata", train_state)
  assert set(train_state) == {"step", "opt_state", "rng"}


def test_load_translator_restores_params_alone(saved, monkeypatch):
  """No optimizer is built, and the only arrays asked of Orbax are the `params` item."""
  workdir, params = saved

  def no_optimizer(*args, **kwargs):
    raise AssertionError("inference built an optimizer")

  monkeypatch.setattr(optimizer, "make_optimizer", no_optimizer)
  monkeypatch.setattr(run_setup.optimizer, "make_optimizer", no_optimizer)
  requested = []
  original_restore = ocp.CheckpointManager.restore

  def recording_restore(self, step, *args, **kwargs):
    composite = kwargs.get("args", args[0] if args else None)
    requested.append(set(composite.keys()))
    return original_restore(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", recording_restore)
  translator = loading.load_translator(workdir)
  assert {"params"} in requested
  assert all(keys <= {"params", "config", "tokenizer"} for keys in requested), requested
  # The restored tree is the parameter tree itself, equal to what was saved.
  assert jax.tree.structure(translator.params) == jax.tree.structure(params)
  paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(params)]
  assert not any(word in p for p in paths for word in ("opt_state", "mu", "nu", "count"))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(translator.params), params)
  assert len(translator.translate(SOURCES)) == len(SOURCES)


@pytest.fixture
def old_format(saved, tmp_path):
  """The saved checkpoint rearranged into the older layout: one `state` item."""
  workdir = tmp_path / "old"
  shutil.copytree(saved[0], workdir)
  step_dir = workdir / "checkpoints" / "5"
  (step_dir / "params").rename(step_dir / "state")
  shutil.rmtree(step_dir / "train_state")
  return str(workdir)


@pytest.mark.parametrize("command", ["translate", "evaluate", "average", "train"])
def test_old_checkpoint_format_is_one_line(old_format, command, capsys):
  argv = {
    "translate": ["translate", "--workdir", old_format],
    "evaluate": ["evaluate", "--workdir", old_format, "--limit", "2"],
    "average": ["average", "--workdir", old_format, "--last", "1"],
    "train": ["train", "--workdir", old_format, *TINY, "train.num_steps=10"],
  }[command]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  error_lines = [line for line in err if line.startswith("error: ")]
  assert len(error_lines) == 1, err
  assert "written by an older version" in error_lines[0]
  assert "Retrain into a new --workdir, or use the older version" in error_lines[0]


def test_old_format_is_not_skipped_as_damage(old_format):
  """Resume must stop, not fall back past it as it does for damaged checkpoints."""
  with pytest.raises(checkpointing.OldCheckpointFormat):
    train.train(
      registry.load_experiment("demo", TINY + ["train.num_steps=10"]), old_format, progress=False
    )


def test_mesh_flag(saved, capsys):
  assert sharding.inference_mesh_config(None).to_dict() == {"data": -1, "fsdp": 1, "tensor": 1}
  assert sharding.inference_mesh_config("fsdp=-1").to_dict() == {"data": 1, "fsdp": -1, "tensor": 1}
  assert sharding.inference_mesh_config("data=2, tensor=4").to_dict() == {
    "data": 2,
    "fsdp": 1,
    "tensor": 4,
  }
  for bad in ("pipe=2", "data", "data=two"):
    with pytest.raises(ValueError, match="--mesh"):
      sharding.inference_mesh_config(bad)
  assert cli.main(["translate", "--workdir", saved[0], "--mesh", "data=3"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "needs 3 devices" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_fsdp8_checkpoint_translates_on_one_device(tmp_path):
  """Trained with mesh.fsdp=8 on 8 devices; translated on 1 device (a subprocess) it gives
  the same lines as on 8 devices, both with the default mesh and with the training mesh."""
  workdir = str(tmp_path / "run")
  config = registry.load_experiment(
    "demo",
    # No decoding after training: the translations below are what is compared.
    TINY
    + ["mesh.data=1", "mesh.fsdp=8", "train.num_steps=10", "train.bleu_every=0"]
    + ["evaluate.test_after_training=False"],
  )
  assert jax.device_count() == 8
  result = train.train(config, workdir, progress=False)
  assert result["step"] == 10
  source = tmp_path / "source.txt"
  source.write_text("".join(line + "\n" for line in SOURCES), encoding="utf-8")
  on_eight = loading.load_translator(workdir).translate(SOURCES)
  fsdp_mesh = sharding.make_mesh(config.mesh)
  assert loading.load_translator(workdir, mesh=fsdp_mesh).translate(SOURCES) == on_eight
  env = dict(os.environ, XLA_FLAGS=child_xla_flags(1))
  for mesh_flag in ([], ["--mesh", "data=1,fsdp=1,tensor=1"]):
    output = tmp_path / "out.txt"
    done = subprocess.run(
      run_py("translate", "--workdir", workdir, "--input", str(source))
      + ["--output", str(output), *mesh_flag],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "onto mesh {'data': 1, 'fsdp': 1, 'tensor': 1}" in done.stderr
    assert output.read_text(encoding="utf-8").split("\n")[:-1] == on_eight

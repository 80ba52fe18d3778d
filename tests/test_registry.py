"""The experiment registry and its override parsing."""

import pytest

from transformer_mt import registry


def test_every_experiment_loads_with_a_description():
  names = registry.experiment_names()
  assert {"demo", "seed_minimal", "transformer_base", "transformer_big"} <= set(names)
  for name in names:
    assert registry.load_experiment(name).description


def test_unknown_experiment_lists_close_matches_first():
  with pytest.raises(ValueError, match=r"Unknown experiment 'dmo'\. Valid experiments: demo,"):
    registry.load_experiment("dmo")


def test_unknown_key_lists_close_matches_first():
  with pytest.raises(ValueError, match=r"Unknown config key 'train.num_step'\. Valid keys: train.num_steps"):
    registry.load_experiment("demo", ["train.num_step=3"])


def test_overrides_are_typed_literals():
  config = registry.load_experiment("demo", ["train.num_steps=7", "train.lr_scale=3",
                                             "model.layer_norm_position=pre",
                                             "model.use_bias=False", "data.source='synthetic'"])
  assert config.train.num_steps == 7
  assert config.train.lr_scale == 3.0 and isinstance(config.train.lr_scale, float)
  assert config.model.layer_norm_position == "pre"
  assert config.model.use_bias is False
  with pytest.raises(ValueError, match="expected a value of type int"):
    registry.load_experiment("demo", ["train.num_steps='many'"])
  with pytest.raises(ValueError, match="key=value"):
    registry.load_experiment("demo", ["train.num_steps"])


def test_override_code_is_rejected_and_not_run(tmp_path):
  marker = tmp_path / "ran"
  payload = f"__import__('os').system('touch {marker}')"
  for key in ("train.num_steps", "data.source"):
    with pytest.raises(ValueError, match="Python literals"):
      registry.load_experiment("demo", [f"{key}={payload}"])
  assert not marker.exists()

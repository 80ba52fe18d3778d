"""Reading Hugging Face weights: safetensors or PyTorch .bin, each whole or in shards.

Large hub models come sharded (NLLB-200 3.3B: three `pytorch_model-0000N-of-00003.bin`
files and an index); every layout must give the state dict the model itself holds.
"""

from __future__ import annotations

import json
import shutil

import hf_fakes
import numpy as np
import pytest

torch, transformers = hf_fakes.require_interop()


from transformer_mt import cli  # noqa: E402
from transformer_mt.interop import hf_convert  # noqa: E402

pytestmark = pytest.mark.interop

# test_hf_import.py's tiny Marian directory (model.safetensors whole, and its tokenizer).
marian_dir = hf_fakes.marian_dir
# Shard names that lead out of the model folder.
ESCAPING = ["../../etc/x.safetensors", "/etc/x.safetensors", "sub/../../x.safetensors"]


@pytest.fixture(scope="module")
def model():
  torch.manual_seed(0)
  config = transformers.M2M100Config(vocab_size=64, **hf_fakes.untrained_sizes(layers=2))
  return transformers.M2M100ForConditionalGeneration(config).eval()


def save_bin(model, directory, shard):
  """The model as PyTorch .bin weights, the way hub models such as NLLB-200 3.3B come:
  `pytorch_model.bin`, or (`shard`) two `pytorch_model-0000N-of-00002.bin` files and their
  `pytorch_model.bin.index.json`, each file a `torch.save`d state dict with every tensor,
  tied copies included. Written by hand: transformers 5 ignores `safe_serialization=False`
  and writes safetensors."""
  model.config.save_pretrained(directory)
  state = model.state_dict()
  if not shard:
    torch.save(state, directory / "pytorch_model.bin")
    return
  names = list(state)
  halves = [names[: len(names) // 2], names[len(names) // 2 :]]
  weight_map = {}
  for number, part in enumerate(halves, 1):
    file_name = f"pytorch_model-{number:05d}-of-00002.bin"
    torch.save({name: state[name] for name in part}, directory / file_name)
    weight_map.update(dict.fromkeys(part, file_name))
  total_size = sum(t.numel() * t.element_size() for t in state.values())
  index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
  (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
@pytest.mark.parametrize("shard", [None, "20KB"], ids=["whole", "sharded"])
def test_every_weight_layout_reads_back_the_same_tensors(model, safe, shard, tmp_path):
  if safe:
    model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
  else:
    save_bin(model, tmp_path, shard)
  names = sorted(p.name for p in tmp_path.iterdir())
  # The folder holds the format under test and no other, whole or sharded as asked.
  weights = [n for n in names if n.endswith(".safetensors" if safe else ".bin")]
  others = [n for n in names if n.endswith(".bin" if safe else ".safetensors")]
  assert weights and not others, names
  index = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
  if shard:
    assert index in names and len(weights) >= 2, names
  else:
    assert index not in names and weights == ["model.safetensors" if safe else "pytorch_model.bin"]
  state_dict = hf_convert.read_state_dict(str(tmp_path))
  expected = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  # Tied copies are saved once (safetensors) or each (.bin); every tensor read must be the
  # model's own.
  assert set(state_dict) <= set(expected)
  if not safe:
    assert set(state_dict) == set(expected)
  assert "model.encoder.layers.1.fc2.weight" in state_dict
  for name, value in state_dict.items():
    np.testing.assert_array_equal(value, expected[name], err_msg=name)
  config, params = hf_convert.load_pretrained(str(tmp_path))
  assert config.num_decoder_layers == 2 and "decoder_layers_1" in params


def test_no_weights_is_one_error(tmp_path):
  with pytest.raises(ValueError, match="No model.safetensors or pytorch_model.bin"):
    hf_convert.read_state_dict(str(tmp_path))


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_shards_outside_the_model_folder_are_refused(model, weights, tmp_path):
  # Real weights beside the model folder, so that only the check stands between a name that
  # leads out of the folder and a read.
  outside = tmp_path / weights
  if weights.endswith(".bin"):
    torch.save(model.state_dict(), outside)
  else:
    model.save_pretrained(tmp_path)
  directory = tmp_path / "model"
  directory.mkdir()
  index = directory / f"{weights}.index.json"
  for bad in [f"../{weights}", str(outside), f"sub/../../{weights}", 3]:
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": bad}}))
    with pytest.raises(ValueError, match="is not a file name inside") as raised:
      hf_convert.read_state_dict(str(directory))
    assert str(index) in str(raised.value) and repr(bad) in str(raised.value)
  index.write_text(json.dumps({"weight_map": {"lm_head.weight": "missing.bin"}}))
  with pytest.raises(FileNotFoundError, match="'missing.bin' is not in"):
    hf_convert.read_state_dict(str(directory))


@pytest.mark.parametrize("bad", ESCAPING)
def test_import_refuses_an_index_leading_out_of_the_folder(marian_dir, bad, tmp_path, capsys):
  """`run.py import` of a folder whose index names a shard outside it: one error line naming
  the index and the entry, status 2, no workdir."""
  directory = tmp_path / "marian"
  shutil.copytree(marian_dir, directory)
  (directory / "model.safetensors").unlink()
  index = directory / "model.safetensors.index.json"
  index.write_text(json.dumps({"metadata": {}, "weight_map": {"final_logits_bias": bad}}))
  workdir = tmp_path / "imported"
  assert cli.main(["import", "--from", f"hf:{directory}", "--workdir", str(workdir)]) == 2
  errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and str(index) in errors[0] and repr(bad) in errors[0], errors
  assert not workdir.exists()


@pytest.mark.parametrize("version", ["2.5.1+cpu", "1.13.0"])
def test_bin_weights_need_a_torch_that_loads_them_safely(model, version, tmp_path, monkeypatch):
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  monkeypatch.setattr(torch, "__version__", version)
  with pytest.raises(ValueError, match=r"needs torch >= 2\.6 .* CVE-2025-32434"):
    hf_convert.read_state_dict(str(tmp_path))
  monkeypatch.setattr(torch, "__version__", "2.6.0")
  assert "lm_head.weight" in hf_convert.read_state_dict(str(tmp_path))

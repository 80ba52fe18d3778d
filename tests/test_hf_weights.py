"""Reading Hugging Face weights: safetensors or PyTorch .bin, each whole or in shards.

Large hub models come sharded (NLLB-200 3.3B: three `pytorch_model-0000N-of-00003.bin`
files and an index); every layout must give the state dict the model itself holds.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[interop]'")
transformers = pytest.importorskip(
  "transformers", minversion="5", reason="needs transformers>=5: pip install -e '.[interop]'"
)

from transformer_mt import hf_convert  # noqa: E402

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def model():
  torch.manual_seed(0)
  config = transformers.M2M100Config(
    vocab_size=64,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=32,
  )
  return transformers.M2M100ForConditionalGeneration(config).eval()


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
@pytest.mark.parametrize("shard", [None, "20KB"], ids=["whole", "sharded"])
def test_every_weight_layout_reads_back_the_same_tensors(model, safe, shard, tmp_path):
  kwargs = {"max_shard_size": shard} if shard else {}
  model.save_pretrained(tmp_path, safe_serialization=safe, **kwargs)
  names = sorted(p.name for p in tmp_path.iterdir())
  if shard:  # the layout under test really is sharded
    assert any(name.endswith(".index.json") for name in names), names
  state_dict = hf_convert.read_state_dict(str(tmp_path))
  expected = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  # Tied copies are saved once; every tensor read must be the model's own.
  assert set(state_dict) <= set(expected)
  assert "model.encoder.layers.1.fc2.weight" in state_dict
  for name, value in state_dict.items():
    np.testing.assert_array_equal(value, expected[name], err_msg=name)
  config, params = hf_convert.load_pretrained(str(tmp_path))
  assert config.num_decoder_layers == 2 and "decoder_layers_1" in params


def test_no_weights_is_one_error(tmp_path):
  with pytest.raises(ValueError, match="No model.safetensors or pytorch_model.bin"):
    hf_convert.read_state_dict(str(tmp_path))

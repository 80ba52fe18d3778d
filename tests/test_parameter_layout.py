"""A parameter dimension its mesh axis does not divide (6 heads on tensor=4) stops training at
startup with one line naming it, unless mesh.allow_replicated_fallback=True opts in to
replicating it; inference, on whatever devices it has, replicates it without asking."""

import jax
import ml_collections
import pytest

from transformer_mt import cli
from transformer_mt.config import defaults
from transformer_mt.model import setup as run_setup
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import sharding
from transformer_mt.training import train_step

TINY = [
  "model.d_model=24",
  "model.d_ff=48",
  "model.num_encoder_layers=1",
  "model.num_decoder_layers=1",
  "data.num_train=200",
  "data.num_eval=4",
  "tokenizer.vocab_size=100",
  "tokenizer.sample_size=200",
  "train.batch_tokens=256",
  "train.num_steps=1",
  "train.bleu_every=0",
  "decode.max_len=8",
  "decode.beam_size=1",
]
MESH = ["mesh.data=2", "mesh.tensor=4"]


def tensor_mesh(tensor):
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices (conftest sets XLA_FLAGS)")
  return sharding.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": tensor}))


def test_six_heads_on_tensor_4_is_one_error_line_and_writes_nothing(tmp_path, capsys):
  workdir = tmp_path / "run"
  argv = ["train", "--workdir", str(workdir), *TINY, "model.num_heads=6", *MESH]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1, err
  assert err.startswith("error: mesh {'data': 2, 'fsdp': 1, 'tensor': 4} cannot shard")
  # The parameter, its shape, the dimension and the mesh axis with its size.
  assert (
    "decoder_layers_0/cross_attention/query/kernel: shape (24, 6, 4), dimension 1 (size 6) "
    "over mesh axis 'tensor' of size 4" in err
  )
  assert "mesh.allow_replicated_fallback=True" in err
  assert not workdir.exists()


def test_opting_in_replicates_and_trains(tmp_path, capsys):
  workdir = tmp_path / "run"
  argv = ["train", "--workdir", str(workdir), *TINY, "model.num_heads=6", *MESH]
  assert cli.main([*argv, "mesh.allow_replicated_fallback=True"]) == 0
  assert "Done: step 1" in capsys.readouterr().out


def test_undivided_dimensions_lists_exactly_the_uneven_ones():
  """Every parameter dimension tagged heads/mlp/vocab, checked by hand against tensor=4."""
  config = TransformerConfig(
    vocab_size=98, d_model=16, num_heads=4, d_ff=24, num_encoder_layers=1, num_decoder_layers=1
  )
  mesh = tensor_mesh(4)
  problems = sharding.undivided_dimensions(train_step.logical_params(Transformer(config)), mesh)
  # 4 heads and d_ff 24 divide by 4; the vocabulary of 98 does not: only the embedding.
  assert problems == [
    "source_embedder/embedding/embedding: shape (98, 16), dimension 0 (size 98) over mesh "
    "axis 'tensor' of size 4"
  ]
  even = config.replace(vocab_size=100)
  assert sharding.undivided_dimensions(train_step.logical_params(Transformer(even)), mesh) == []
  uneven_ffn = config.replace(vocab_size=100, d_ff=26)
  problems = sharding.undivided_dimensions(train_step.logical_params(Transformer(uneven_ffn)), mesh)
  assert problems and all("(size 26) over mesh axis 'tensor'" in p for p in problems)
  assert {p.split(":")[0].rsplit("/", 2)[-2] for p in problems} == {"wi", "wo"}


def test_check_parameter_layout_honours_the_opt_in():
  mesh = tensor_mesh(4)
  model = Transformer(
    TransformerConfig(
      vocab_size=98, d_model=16, num_heads=4, d_ff=24, num_encoder_layers=1, num_decoder_layers=1
    )
  )
  config = defaults.complete(
    ml_collections.ConfigDict({"mesh": {"data": -1, "fsdp": 1, "tensor": 4}})
  )
  with pytest.raises(ValueError, match="source_embedder/embedding/embedding"):
    run_setup.check_parameter_layout(config, model, mesh)
  config.mesh.allow_replicated_fallback = True
  run_setup.check_parameter_layout(config, model, mesh)
  # What the opt-in (and inference) gets: the embedding replicated, the heads still split.
  shardings = sharding.logical_shardings(train_step.logical_params(model), mesh)
  assert shardings["source_embedder"]["embedding"]["embedding"].spec[0] is None
  assert shardings["encoder_layers_0"]["self_attention"]["query"]["kernel"].spec[1] == "tensor"

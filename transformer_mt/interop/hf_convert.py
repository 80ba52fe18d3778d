"""Hugging Face translation checkpoints (Marian, FSMT, mBART, M2M100) as our config and params.

Each published architecture is one setting of `TransformerConfig`, not a model of its own:
`config_from_hf` picks the switches (activation, LayerNorm placement, position layout, ...),
and `params_from_hf` renames and reshapes the PyTorch weights into the Flax tree that
`model.Transformer` creates, as numpy arrays. Only `safetensors` (and numpy) is needed to read
a `save_pretrained` directory; torch only for the older `pytorch_model.bin` files, loaded with
`weights_only=True` (never a pickle of arbitrary objects).

Two PyTorch weights are left out, each because it cannot change the output:
* key-projection biases (`k_proj.bias`): a key bias adds q.b_k to every logit of a query, which
  softmax cancels exactly; our attention has no key bias (see attention.py);
* sinusoidal position tables (FSMT's saved `embed_positions`): we compute the same values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import flax
import numpy as np

from transformer_mt.data import text_files
from transformer_mt.interop import hf_names
from transformer_mt.model.attention import sinusoidal_encoding
from transformer_mt.model.transformer import parameter_shapes
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors

SUPPORTED_MODEL_TYPES = ("marian", "fsmt", "mbart", "m2m_100")

# Hugging Face activation_function -> TransformerConfig.activation.
_ACTIVATIONS = {
  "relu": "relu",
  "gelu": "gelu",
  "gelu_new": "gelu_tanh",
  "gelu_pytorch_tanh": "gelu_tanh",
  "swish": "swish",
  "silu": "swish",
}

# Per model type: LayerNorm placement, position layout and offset, embedding LayerNorm,
# whether the token embeddings are tied, and whether a final_logits_bias exists.
_ARCHITECTURES = {
  "marian": dict(
    layer_norm_position="post", position_encoding="sinusoidal_halves", embedding_layer_norm=False
  ),
  "fsmt": dict(
    layer_norm_position="post", position_encoding="sinusoidal_fairseq", embedding_layer_norm=False
  ),
  "mbart": dict(
    layer_norm_position="pre",
    position_encoding="learned",
    position_offset=2,  # MBartLearnedPositionalEmbedding.offset
    embedding_layer_norm=True,
    share_position_embeddings=False,  # the encoder and decoder have their own tables and LNs
    logits_bias=True,
  ),
  "m2m_100": dict(
    layer_norm_position="pre", position_encoding="sinusoidal_fairseq", embedding_layer_norm=False
  ),
}


def _field(hf_config: Any, name: str, default: Any = None) -> Any:
  """Reads `name` from a transformers config object or a config.json dict."""
  if isinstance(hf_config, Mapping):
    return hf_config.get(name, default)
  return getattr(hf_config, name, default)


def _model_type(hf_config: Any) -> str:
  model_type = _field(hf_config, "model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise errors.BadValue(
      f"Unsupported Hugging Face model_type {model_type!r}; "
      f"supported: {list(SUPPORTED_MODEL_TYPES)}"
    )
  return model_type


def _token_id(hf_config: Any, name: str) -> int:
  value = _field(hf_config, name)
  if not isinstance(value, int):
    raise errors.BadValue(f"Hugging Face config {name}={value!r}: a single token id is needed.")
  return value


def _same(hf_config: Any, encoder_name: str, decoder_name: str) -> int:
  """The value encoder and decoder must share in our model (one `num_heads`, one `d_ff`)."""
  encoder, decoder = _field(hf_config, encoder_name), _field(hf_config, decoder_name)
  if encoder != decoder:
    raise errors.BadValue(
      f"Unsupported Hugging Face config: {encoder_name}={encoder} != {decoder_name}={decoder}; "
      "our encoder and decoder share one value."
    )
  return encoder


def _shares_token_embeddings(hf_config: Any, model_type: str) -> bool:
  if model_type == "fsmt":  # separate source and target vocabularies
    return False
  if model_type == "marian":
    return bool(_field(hf_config, "share_encoder_decoder_embeddings", True))
  return True


def config_from_hf(hf_config: Any) -> TransformerConfig:
  """The `TransformerConfig` that computes what the Hugging Face model computes.

  Args:
    hf_config: a transformers config (MarianConfig, FSMTConfig, MBartConfig, M2M100Config) or
      the dict of its config.json.

  Raises:
    ValueError: an unsupported model type, activation or encoder/decoder asymmetry.
  """
  model_type = _model_type(hf_config)
  activation = _field(hf_config, "activation_function", "relu")
  if activation not in _ACTIVATIONS:
    raise errors.BadValue(
      f"Unsupported activation_function {activation!r}; supported: {sorted(_ACTIVATIONS)}"
    )
  d_model = _field(hf_config, "d_model")
  num_heads = _same(hf_config, "encoder_attention_heads", "decoder_attention_heads")
  if d_model % num_heads:
    raise errors.BadValue(f"d_model={d_model} is not divisible by {num_heads} attention heads.")
  shared = _shares_token_embeddings(hf_config, model_type)
  if model_type == "fsmt":
    vocab_size = _field(hf_config, "src_vocab_size")
    target_vocab_size = _field(hf_config, "tgt_vocab_size")
  else:
    vocab_size = _field(hf_config, "vocab_size")
    target_vocab_size = None if shared else _field(hf_config, "decoder_vocab_size", vocab_size)
  pad_id = _token_id(hf_config, "pad_token_id")
  architecture = dict(_ARCHITECTURES[model_type])
  if model_type in ("fsmt", "m2m_100"):
    # fairseq numbers positions from padding_idx + 1.
    architecture["position_offset"] = pad_id + 1
  if model_type == "marian":
    # The tied projection carries final_logits_bias; an untied one has it as its own bias.
    architecture["logits_bias"] = shared
  return TransformerConfig(
    vocab_size=vocab_size,
    target_vocab_size=target_vocab_size,
    d_model=d_model,
    num_heads=num_heads,
    d_ff=_same(hf_config, "encoder_ffn_dim", "decoder_ffn_dim"),
    num_encoder_layers=_field(hf_config, "encoder_layers"),
    num_decoder_layers=_field(hf_config, "decoder_layers"),
    dropout_rate=float(_field(hf_config, "dropout", 0.0)),
    attention_dropout_rate=float(_field(hf_config, "attention_dropout", 0.0)),
    relu_dropout_rate=float(_field(hf_config, "activation_dropout", 0.0)),
    activation=_ACTIVATIONS[activation],
    layer_norm_epsilon=1e-5,  # torch.nn.LayerNorm's default, used by all four
    max_len=_field(hf_config, "max_position_embeddings"),
    scale_embeddings=bool(_field(hf_config, "scale_embedding", False)),
    share_embeddings=shared,
    pad_id=pad_id,
    eos_id=_token_id(hf_config, "eos_token_id"),
    decoder_start_id=_token_id(hf_config, "decoder_start_token_id"),
    **architecture,
  )


def _pop_first(sd: dict, *names: str) -> np.ndarray:
  """The first of `names` present (tied weights are saved under one of their names only)."""
  for name in names:
    if name in sd:
      value = sd.pop(name)
      for other in names:  # the other copies of a tied weight are the same array
        sd.pop(other, None)
      return value
  raise errors.BadValue(f"Hugging Face checkpoint lacks {names[0]!r}.")


def _to_numpy(value: Any) -> np.ndarray:
  if hasattr(value, "detach"):  # a torch tensor
    value = value.detach().float().cpu().numpy()
  return np.asarray(value)


def params_from_hf(state_dict: Mapping[str, Any], hf_config: Any) -> dict:
  """Our Flax param tree (numpy arrays, `param_dtype`) from a Hugging Face state dict.

  Args:
    state_dict: parameter name -> array (numpy or torch), as saved by `save_pretrained`.
    hf_config: the model's transformers config or config.json dict.

  Raises:
    ValueError: a weight is missing, left over (an architecture we do not cover) or has a
      shape our model does not expect.
  """
  model_type = _model_type(hf_config)
  config = config_from_hf(hf_config)
  sd = {name.removeprefix("model."): _to_numpy(x) for name, x in state_dict.items()}
  flat: dict[str, np.ndarray] = {}  # our "/"-joined path -> array
  for row in hf_names.shared_rows(config):
    if row.theirs not in sd:
      raise errors.BadValue(f"Hugging Face checkpoint lacks {row.theirs!r}.")
    value = sd.pop(row.theirs)
    if row.ours is not None:  # None: the key bias, which softmax cancels
      flat[row.ours] = hf_names.to_ours(row, value, config.num_heads)

  final_logits_bias = sd.pop("final_logits_bias", None)
  if config.share_embeddings:
    embedding = _pop_first(
      sd, "shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"
    )
    lm_head = sd.pop("lm_head.weight", None)
    if lm_head is not None and not np.array_equal(lm_head, embedding):
      raise errors.BadValue("Unsupported: an lm_head that is not tied to the shared embeddings.")
    flat[hf_names.TIED_EMBEDDING.ours] = embedding
    if config.logits_bias:
      flat[hf_names.LOGITS_BIAS.ours] = hf_names.to_ours(hf_names.LOGITS_BIAS, final_logits_bias, 0)
  else:
    source = _pop_first(sd, "encoder.embed_tokens.weight")
    target = _pop_first(sd, "decoder.embed_tokens.weight")
    # FSMT has its own output projection; untied Marian ties lm_head to the decoder embeddings.
    output = sd.pop("decoder.output_projection.weight", None)
    output = sd.pop("lm_head.weight", output if output is not None else target)
    bias = np.zeros(output.shape[0], output.dtype)  # FSMT's projection has none
    if final_logits_bias is not None:
      bias = final_logits_bias.reshape(-1)
    flat["source_embedder/embedding/embedding"] = source
    flat["target_embedder/embedding/embedding"] = target
    flat["output_projection/kernel"] = output.T  # [d_model, vocab]
    flat["output_projection/bias"] = bias

  if config.position_encoding != "learned":
    # A fixed sinusoid (saved by FSMT): we compute it, so it must be the one we compute.
    for side in ("encoder", "decoder"):
      _check_sinusoid(sd.pop(f"{side}.embed_positions.weight", None), config, side)
  if sd:
    raise errors.BadValue(
      f"Unsupported {model_type} checkpoint: weights our model has no place for: {sorted(sd)[:8]}"
    )
  return _checked_against_model(flat, config)


def _check_sinusoid(table: np.ndarray | None, config: TransformerConfig, side: str) -> None:
  """A saved table [offset + positions, d_model] must hold our encoding from row `offset` on."""
  if table is None:
    return
  positions = np.arange(config.position_offset, table.shape[0])[None]  # [1, rows - offset]
  ours = np.asarray(sinusoidal_encoding(positions, config.d_model, config.position_encoding))[0]
  difference = np.abs(table[config.position_offset :] - ours).max(initial=0.0)
  if difference > 1e-4:
    raise errors.BadValue(
      f"Unsupported checkpoint: {side}.embed_positions is not the {config.position_encoding} "
      f"encoding (max difference {difference:.3g})."
    )


def _checked_against_model(flat: dict, config: TransformerConfig) -> dict:
  """Our param tree of `flat` ("/"-joined path -> array), cast to `param_dtype` once every
  name and shape is checked against the model's own tree."""
  expected = flax.traverse_util.flatten_dict(parameter_shapes(config), sep="/")
  problems = [f"missing {name}" for name in sorted(set(expected) - set(flat))]
  problems += [f"unexpected {name}" for name in sorted(set(flat) - set(expected))]
  problems += [
    f"{name}: {flat[name].shape} != {expected[name].shape}"
    for name in sorted(set(flat) & set(expected))
    if flat[name].shape != expected[name].shape
  ]
  if problems:
    raise errors.BadValue("Converted weights do not fit the model: " + "; ".join(problems[:8]))
  dtype = config.weight_dtype
  return flax.traverse_util.unflatten_dict(
    {name: np.asarray(x, dtype) for name, x in flat.items()}, sep="/"
  )


def read_state_dict(directory: str) -> dict[str, np.ndarray]:
  """The weights of a `save_pretrained` directory: safetensors, else PyTorch .bin files (each
  sharded or not; large hub models such as NLLB-200 3.3B come as several shards)."""
  safetensors_files = _weight_files(directory, "model.safetensors")
  if safetensors_files:
    from safetensors.numpy import load_file

    return {k: v for name in safetensors_files for k, v in load_file(name).items()}
  binary_files = _weight_files(directory, "pytorch_model.bin")
  if binary_files:
    import torch

    _check_torch_loads_safely(torch.__version__, binary_files[0])
    # weights_only=True: tensors only, no arbitrary pickled objects are run.
    return {
      key: _to_numpy(x)
      for name in binary_files
      for key, x in torch.load(name, map_location="cpu", weights_only=True).items()
    }
  raise errors.BadValue(
    f"No model.safetensors or pytorch_model.bin (or their shards) in {directory}."
  )


def _check_torch_loads_safely(version: str, path: str) -> None:
  """Refuses a torch older than 2.6, whose `torch.load(weights_only=True)` can still run code
  from a crafted file (CVE-2025-32434)."""
  major, minor = (int(re.match(r"\d+", part).group()) for part in version.split(".")[:2])
  if (major, minor) < (2, 6):
    raise errors.BadValue(
      f"Reading {path} needs torch >= 2.6 (older torch.load can run code from a crafted .bin "
      f"file, CVE-2025-32434); this is torch {version}: pip install -U 'torch>=2.6', or use "
      "model.safetensors weights."
    )


def _weight_files(directory: str, single_name: str) -> list[str]:
  """Paths of `single_name` in `directory`, or of the shards its `.index.json` lists; []
  when neither exists."""
  index = os.path.join(directory, f"{single_name}.index.json")
  if os.path.exists(index):
    content = text_files.read_json(index)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict):
      raise errors.BadValue(f"{index}: no weight_map (tensor name -> shard file) in it.")
    return sorted({_shard_path(directory, index, name) for name in weight_map.values()})
  single = os.path.join(directory, single_name)
  return [single] if os.path.exists(single) else []


def _shard_path(directory: str, index: str, name: object) -> str:
  """`directory`/`name`, once `name` (an entry of `index`) is a relative path inside it.

  The check is on the names, not on resolved links: hub snapshots are folders of links into
  the download cache, which lies outside them.
  """
  normal = os.path.normpath(name) if isinstance(name, str) and name else ""
  if normal in ("", os.curdir) or os.path.isabs(normal) or normal.split(os.sep)[0] == os.pardir:
    raise errors.BadValue(
      f"{index}: shard {name!r} is not a file name inside {directory}; refusing to read it."
    )
  path = os.path.join(directory, normal)
  if not os.path.isfile(path):
    raise errors.MissingFile(f"{index}: shard {name!r} is not in {directory}.")
  return path


def load_pretrained(directory: str) -> tuple[TransformerConfig, dict]:
  """(config, params) of the Hugging Face model saved in `directory` by `save_pretrained`."""
  config_path = os.path.join(directory, "config.json")
  if not os.path.exists(config_path):
    raise errors.BadValue(f"No config.json in {directory}.")
  hf_config = text_files.read_json(config_path)
  return config_from_hf(hf_config), params_from_hf(read_state_dict(directory), hf_config)

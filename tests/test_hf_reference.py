"""The full model against an implementation nobody here wrote: Hugging Face's PyTorch Marian
(post-LN) and mBART (pre-LN) give the same teacher-forced logits as our Transformer, to 1e-5
in float32, with the same weights.

Both are tiny (2+2 layers, d_model 16, 4 heads) and built with the Base row's architecture
choices where the PyTorch model has a switch for them: ReLU, tied source/target/output
embeddings over one vocabulary, token embeddings scaled by sqrt(d_model), PAD 0 / EOS 1 /
BOS 2. Every weight is random, LayerNorm gains and biases included, at scales that keep the
logits of order 1-10 (so 1e-5 is a few float32 roundings, not a loose bound). The weights go
through the importer (`hf_convert.load_pretrained` on a `save_pretrained` directory): its
mapping is the one under test, there is no second one here. Each comparison runs one padded
batch (3 sentences of different lengths on each side, attention masks on both sides) and
looks at the real target positions only.

Which of our config fields differ from the Base row
(experiments/transformer_base_wmt14_ende.py) is asserted, so the comparisons
provably cover the model the paper rows train:
* Marian differs only in its sinusoid's layout (sines then cosines instead of interleaved)
  and a zero logits bias. The layouts are one permutation of the d_model coordinates apart,
  so Marian's weights with every "embed" axis permuted, run by the Base row's exact config
  (interleaved sinusoid, no logits bias), must give the same logits too: the second check.
* mBART (pre-LN, final encoder/decoder LayerNorms) differs in what the architecture fixes:
  learned positions (offset 2) and a LayerNorm on each side's embeddings, with its own
  logits bias.

Select with `-m interop`; skipped when transformers (>= 5) or torch is not installed.
"""

from __future__ import annotations

import flax.linen as nn
import hf_fakes
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch, transformers = hf_fakes.require_interop()

from transformer_mt.config import registry  # noqa: E402

transformer_base_wmt14_ende = registry.experiment_module("transformer_base_wmt14_ende")
from transformer_mt.interop import hf_convert  # noqa: E402
from transformer_mt.model.transformer import Transformer  # noqa: E402
from transformer_mt.model.transformer_config import TransformerConfig  # noqa: E402

pytestmark = pytest.mark.interop

# The bar: the same float32 computation, op order aside.
LOGITS_TOLERANCE = 1e-5
VOCAB = 40
_SIZES = dict(
  hf_fakes.SIZES,  # the size of every tiny interop model (dropout 0.0 among them)
  vocab_size=VOCAB,
  # The Base row's switches that these configs have, and its token ids.
  activation_function="relu",
  scale_embedding=True,
  pad_token_id=0,
  eos_token_id=1,
  bos_token_id=2,
  decoder_start_token_id=2,
  dropout=0.0,
  attention_dropout=0.0,
  activation_dropout=0.0,
)
# Standard deviations of the random weights: embeddings (scaled by 4 = sqrt(16) on input, and
# the output projection), other matrices and biases, and LayerNorm gains around 1.
_EMBEDDING_STD, _WEIGHT_STD, _BIAS_STD, _GAIN_STD = 0.5, 0.3, 0.2, 0.2


def _hf_model(model_type: str):
  """A tiny random Marian or mBART model in eval mode (no dropout)."""
  if model_type == "marian":
    config = transformers.MarianConfig(
      decoder_vocab_size=VOCAB, share_encoder_decoder_embeddings=True, **_SIZES
    )
  else:
    config = transformers.MBartConfig(**_SIZES)
  torch.manual_seed(0)
  model = transformers.AutoModelForSeq2SeqLM.from_config(config).eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      if "embed_positions" in name and model_type == "marian":
        continue  # Marian's sinusoid is fixed (rebuilt on load), not a weight
      noise = torch.randn_like(parameter)
      if "layer_norm" in name or "layernorm" in name:
        value = (1.0 + _GAIN_STD * noise) if name.endswith("weight") else _BIAS_STD * noise
      elif name.endswith("bias"):
        value = _BIAS_STD * noise
      elif "embed" in name or "shared" in name:
        value = _EMBEDDING_STD * noise
      else:
        value = _WEIGHT_STD * noise
      parameter.copy_(value)
    if model_type == "mbart":  # a zero buffer at init: made to count
      model.final_logits_bias.copy_(_BIAS_STD * torch.randn_like(model.final_logits_bias))
  return model


def _import(model_type: str, tmp_path_factory):
  """(model_type, HF model, our config, our params), the weights read back by the importer."""
  model = _hf_model(model_type)
  directory = tmp_path_factory.mktemp(model_type)
  model.save_pretrained(directory)
  config, params = hf_convert.load_pretrained(str(directory))
  return model_type, model, config.replace(deterministic=True), params


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
  return _import("marian", tmp_path_factory)


@pytest.fixture(scope="module")
def mbart(tmp_path_factory):
  return _import("mbart", tmp_path_factory)


@pytest.fixture(params=["marian", "mbart"])
def imported(request):
  return request.getfixturevalue(request.param)


def _padded_batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Sources [3, 7] and decoder inputs [3, 7] (BOS first) of different lengths, PAD after
  them, and the real target positions, bool [3, 7]."""
  rng = np.random.default_rng(0)
  ordinary = np.arange(3, VOCAB)  # not PAD 0, EOS 1, BOS 2

  def rows(lengths, start=None):
    out = np.zeros((len(lengths), max(lengths) + (start is not None)), np.int64)
    for row, length in enumerate(lengths):
      tokens = ([start] if start is not None else []) + list(rng.choice(ordinary, length - 1))
      out[row, : len(tokens) + 1] = tokens + [1]  # EOS last
    return out

  sources = rows((7, 4, 2))
  targets_in = rows((5, 3, 6), start=2)
  return sources, targets_in, targets_in != 0


def _hf_logits(model, sources, targets_in, targets_valid) -> np.ndarray:
  with torch.no_grad():
    return model(
      input_ids=torch.tensor(sources),
      attention_mask=torch.tensor(sources != 0),
      decoder_input_ids=torch.tensor(targets_in),
      decoder_attention_mask=torch.tensor(targets_valid),
      use_cache=False,
    ).logits.numpy()  # [batch, tgt_len, vocab]


def _our_logits(config, params, sources, targets_in) -> np.ndarray:
  with jax.default_matmul_precision("highest"):
    logits = Transformer(config).apply(
      {"params": params}, jnp.asarray(sources, jnp.int32), jnp.asarray(targets_in, jnp.int32)
    )
  return np.asarray(logits)


def _max_difference(ours, theirs, valid, label) -> float:
  assert ours.shape == theirs.shape
  # Otherwise 1e-5 would prove little: logits of order 1-10 that differ between tokens.
  assert 1.0 < np.abs(theirs[valid]).max() < 50.0 and theirs[valid].std() > 0.5
  difference = float(np.abs(ours - theirs)[valid].max())
  print(f"{label}: max |logit difference| = {difference:.2e}")
  return difference


def _base_row_config(**changes) -> TransformerConfig:
  """The Base row's model section (experiments/transformer_base_wmt14_ende.py)
  at our tiny sizes, float32, with PyTorch's LayerNorm epsilon (1e-5; the Base row: 1e-6)."""
  section = transformer_base_wmt14_ende.get_config().model
  return TransformerConfig.from_mapping(
    section,
    vocab_size=VOCAB,
    d_model=16,
    num_heads=4,
    d_ff=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    layer_norm_epsilon=1e-5,
    dropout_rate=0.0,
    dtype="float32",
    deterministic=True,
    **changes,
  )


def _fields_that_differ(a: TransformerConfig, b: TransformerConfig) -> set[str]:
  a, b = a.to_dict(), b.to_dict()
  return {name for name in a if a[name] != b[name]}


def test_teacher_forced_logits_equal_transformers(imported):
  """Our logits = transformers' logits (1e-5) on a padded batch, the weights imported."""
  model_type, model, config, params = imported
  # The architecture is the Base row's (post-LN) or its pre-LN variant, up to what the
  # PyTorch model fixes (module docstring); max_len only bounds learned positions.
  if model_type == "marian":
    expected = {"position_encoding", "logits_bias", "max_len"}
    assert config.position_encoding == "sinusoidal_halves"
    assert _fields_that_differ(config, _base_row_config()) == expected
  else:
    expected = {
      "position_encoding",
      "position_offset",
      "embedding_layer_norm",
      "share_position_embeddings",
      "logits_bias",
      "max_len",
    }
    assert _fields_that_differ(config, _base_row_config(layer_norm_position="pre")) == expected
    assert "encoder_norm" in params and "decoder_norm" in params
  sources, targets_in, valid = _padded_batch()
  theirs = _hf_logits(model, sources, targets_in, valid)
  ours = _our_logits(config, params, sources, targets_in)
  assert _max_difference(ours, theirs, valid, model_type) < LOGITS_TOLERANCE


def _interleaving_permutation(d_model: int) -> np.ndarray:
  """perm with interleaved[..., k] = halves[..., perm[k]]: sin_i at 2i, cos_i at 2i + 1."""
  half = np.arange(d_model // 2)
  return np.stack([half, half + d_model // 2], axis=-1).reshape(-1)


def _permute_embed_axes(params: dict, config: TransformerConfig, perm: np.ndarray) -> dict:
  """`params` with every axis the model names "embed" (the d_model coordinates) permuted."""
  model = Transformer(config)
  dummy = jnp.ones((1, 2), jnp.int32)
  specs = nn.get_partition_spec(jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy)))
  specs = specs["params"]

  def permute(x, spec):
    for axis, name in enumerate(spec):
      if name == "embed":
        x = np.take(x, perm, axis=axis)
    return x

  return jax.tree.map(permute, params, specs, is_leaf=lambda x: isinstance(x, np.ndarray))


def test_base_row_config_equals_marian_with_permuted_coordinates(marian):
  """The Base row's own config (interleaved sinusoid, no logits bias) with Marian's weights,
  their d_model coordinates permuted into the interleaved order, gives Marian's logits (1e-5).

  A permutation of the residual stream's coordinates commutes with every op of the model
  (LayerNorm statistics, residual adds, x W products with the permuted W, the tied x E^T),
  so the only thing this adds to the test above is the interleaved sinusoid itself."""
  _, model, config, params = marian
  base = _base_row_config(max_len=config.max_len)
  params = dict(params)
  assert not np.any(params.pop("logits_bias"))  # Marian's final_logits_bias, zero: the Base's none
  permuted = _permute_embed_axes(params, base, _interleaving_permutation(base.d_model))
  sources, targets_in, valid = _padded_batch()
  theirs = _hf_logits(model, sources, targets_in, valid)
  ours = _our_logits(base, permuted, sources, targets_in)
  difference = _max_difference(ours, theirs, valid, "base row vs marian, permuted")
  assert difference < LOGITS_TOLERANCE
  # The permutation is what makes them equal: unpermuted, the interleaved sinusoid lands on
  # the wrong coordinates.
  unpermuted = _our_logits(base, params, sources, targets_in)
  assert np.abs(unpermuted - theirs)[valid].max() > 1e-2


def test_fused_qkv_gives_marians_logits(marian):
  """model.fuse_qkv on Marian's imported weights: its query and value projections carry real
  biases (random here; the key's is dropped on import, softmax cancels it), stacked with the
  kernels in the fused matmul. The logits equal transformers' (1e-5) and the unfused ones."""
  _, model, config, params = marian
  for layer, attention in (
    ("encoder_layers_0", "self_attention"),
    ("decoder_layers_1", "cross_attention"),
  ):
    for name in ("query", "value"):
      assert np.abs(params[layer][attention][name]["bias"]).max() > 0.1
  sources, targets_in, valid = _padded_batch()
  theirs = _hf_logits(model, sources, targets_in, valid)
  fused = _our_logits(config.replace(fuse_qkv=True), params, sources, targets_in)
  assert _max_difference(fused, theirs, valid, "marian, fuse_qkv") < LOGITS_TOLERANCE
  unfused = _our_logits(config, params, sources, targets_in)
  np.testing.assert_allclose(fused[valid], unfused[valid], rtol=0, atol=LOGITS_TOLERANCE)

"""The model's hyperparameters as one frozen dataclass.

Training, evaluation and decoding use the same `TransformerConfig`; the variants
differ only by `.replace(deterministic=True)` / `.replace(decode=True)`, never by
extra flags threaded through call sites (the flax `examples/wmt` convention).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from transformer_mt.runtime import errors

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Platforms whose matrix units run bfloat16 at (at least) twice the float32 rate: "auto"
# computes in bfloat16 there. On CPU bfloat16 buys nothing (XLA:CPU upcasts most of it) and
# costs precision, so "auto" stays float32.
BF16_PLATFORMS = ("gpu", "tpu")


def auto_dtype(platform: str | None = None) -> str:
  """The compute dtype `dtype="auto"` stands for on `platform` (default: JAX's default
  backend, "cpu", "gpu" or "tpu")."""
  platform = platform or jax.default_backend()
  return "bfloat16" if platform in BF16_PLATFORMS else "float32"


ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish")
POSITION_ENCODINGS = ("sinusoidal", "sinusoidal_halves", "sinusoidal_fairseq", "learned")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "cudnn_packed", "pallas")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyperparameters of the encoder-decoder (defaults: the paper's Base model)."""

  vocab_size: int = 37000
  # Separate target vocabulary size; None means source and target share one vocabulary.
  target_vocab_size: int | None = None
  # Embedding tables and the output projection get each vocabulary rounded up to a multiple of
  # this (1: none; 128 fills GPU matmul tiles). The extra ids are never trained, produced or
  # decoded: the model's logits stop at the real vocabulary (see `padded_vocab_size`).
  vocab_pad_multiple: int = 1
  d_model: int = 512
  num_heads: int = 8
  # Per-head width; None means d_model // num_heads as in the paper.
  head_dim: int | None = None
  d_ff: int = 2048
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  # Dropout on each sub-layer output before the residual add (P_drop in the paper).
  dropout_rate: float = 0.1
  # Dropout on the attention probabilities.
  attention_dropout_rate: float = 0.0
  # Dropout on the FFN's hidden ReLU activations.
  relu_dropout_rate: float = 0.0
  # FFN nonlinearity: "relu" (the paper), "gelu" (exact erf; mBART), "gelu_tanh", "swish" (Marian).
  activation: str = "relu"
  # "post": x = LN(x + sublayer(x)) as in the paper; "pre": x = x + sublayer(LN(x)).
  layer_norm_position: str = "post"
  use_residual: bool = True
  use_layer_norm: bool = True
  # LayerNorm epsilon; PyTorch models (Marian, FSMT, mBART, M2M100) use 1e-5.
  layer_norm_epsilon: float = 1e-6
  # LayerNorm after token + position embeddings, before dropout (mBART's layernorm_embedding).
  embedding_layer_norm: bool = False
  use_bias: bool = True
  # Glorot gain of the query, key and value projections' initialization: 1 (Glorot's), or
  # fairseq's 1/sqrt(2) (0.7071...), the bound of its one [3 d_model, d_model] in-projection.
  qkv_init_gain: float = 1.0
  # Project the concatenated heads with W^O; off only for single-head toy models.
  attention_output_projection: bool = True
  # "sinusoidal" (the paper: sin/cos interleaved), "sinusoidal_halves" (Marian: sin in the first
  # half, cos in the second), "sinusoidal_fairseq" (FSMT/M2M100: halves, frequencies
  # 10000^(-i/(d/2-1))) or "learned".
  position_encoding: str = "sinusoidal"
  # Added to every position before it is encoded (mBART: 2; fairseq: padding_idx + 1).
  position_offset: int = 0
  # Longest sequence learned position embeddings can address (the table has max_len + offset rows).
  max_len: int = 512
  # Multiply token embeddings by sqrt(d_model) (section 3.4 of the paper).
  scale_embeddings: bool = True
  # Tie source embedding, target embedding and pre-softmax projection (needs a shared vocab).
  share_embeddings: bool = True
  # With tied token embeddings, the decoder also reuses the encoder's learned position table and
  # embedding LayerNorm; False gives the decoder its own (mBART).
  share_position_embeddings: bool = True
  # A learned [vocab] bias on the tied pre-softmax projection (Marian/mBART final_logits_bias);
  # an untied output projection has its bias from use_bias.
  logits_bias: bool = False
  # Token ids the model and decoding rely on; the defaults are tokenizer.py's (pad 0, eos 1, bos 2).
  pad_id: int = 0
  eos_id: int = 1
  # First decoder input (BOS); imported models use their own (Marian: pad; mBART, FSMT: eos).
  decoder_start_id: int = 2
  # Recompute each layer's activations in the backward pass (nn.remat): less memory, more compute.
  remat: bool = False
  # Training attention's kernel: "auto" (JAX's choice, XLA as of JAX 0.11; see
  # fused_kernels.resolve), "xla", "cudnn" (fused flash attention on NVIDIA GPUs; needs dtype
  # bfloat16 or float16), "cudnn_packed" (the same, told packed rows' sentences as lengths and
  # offsets instead of a mask; Hopper or newer) or "pallas" (Pallas' Triton flash attention
  # with segment ids, for self-attention). See model/fused_kernels.py.
  attention_implementation: str = "auto"
  # Compute the Q, K and V projections (K and V of cross-attention) as one matmul against their
  # kernels stacked at call time; the parameters stay three kernels.
  fuse_qkv: bool = False
  # Compute dtype of activations and matmuls: "float32", "bfloat16", "float16", or "auto"
  # (resolved here, when the config is built: bfloat16 on GPU/TPU, float32 on CPU; see
  # `auto_dtype`). Parameters keep `param_dtype`; LayerNorm statistics, attention softmax,
  # logits and the loss are float32 whatever this says.
  dtype: str = "float32"
  param_dtype: str = "float32"
  # Set by .replace(): no dropout.
  deterministic: bool = False
  # Set by .replace(): the decoder runs one token at a time against a KV cache.
  decode: bool = False
  # Set by .replace(): the decode cache holds the cross-attention keys transposed, [batch,
  # heads, head_dim, src_len] (attention.py's `_cached_cross_key_value`); False keeps them as
  # the values, [batch, heads, src_len, head_dim] (the device run's comparison). The same
  # translations.
  cross_keys_transposed: bool = True

  def __post_init__(self):
    if self.dtype == "auto":  # Frozen: the one place the resolved value is written.
      object.__setattr__(self, "dtype", auto_dtype())
    problems = []
    if self.head_dim is None and self.d_model % self.num_heads:
      problems.append(
        f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
        "set head_dim explicitly"
      )
    if self.layer_norm_position not in ("pre", "post"):
      problems.append(f"layer_norm_position={self.layer_norm_position!r} must be 'pre' or 'post'")
    if self.position_encoding not in POSITION_ENCODINGS:
      problems.append(
        f"position_encoding={self.position_encoding!r} must be one of {list(POSITION_ENCODINGS)}"
      )
    if self.activation not in ACTIVATIONS:
      problems.append(f"activation={self.activation!r} must be one of {list(ACTIVATIONS)}")
    if not isinstance(self.vocab_pad_multiple, int) or self.vocab_pad_multiple < 1:
      problems.append(f"vocab_pad_multiple={self.vocab_pad_multiple!r} must be an integer >= 1")
    if self.position_offset < 0:
      problems.append(f"position_offset={self.position_offset} must be >= 0")
    if self.share_embeddings and self.target_vocab_size not in (None, self.vocab_size):
      problems.append(
        "share_embeddings=True needs one shared vocabulary; "
        f"got vocab_size={self.vocab_size}, target_vocab_size={self.target_vocab_size}"
      )
    if self.attention_implementation not in ATTENTION_IMPLEMENTATIONS:
      problems.append(
        f"attention_implementation={self.attention_implementation!r} must be one of "
        f"{list(ATTENTION_IMPLEMENTATIONS)}"
      )
    elif self.attention_implementation.startswith("cudnn") and self.dtype == "float32":
      problems.append(
        f"attention_implementation={self.attention_implementation!r} needs dtype='bfloat16' "
        "or 'float16'"
      )
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        allowed = sorted(_DTYPES) + (["auto"] if name == "dtype" else [])
        problems.append(f"{name}={getattr(self, name)!r} must be one of {allowed}")
    for name in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        problems.append(f"{name}={getattr(self, name)} must be in [0, 1)")
    if problems:
      raise errors.BadValue("Invalid model config: " + "; ".join(problems))

  # The fields set by .replace() for a use of the model, never part of an experiment's config.
  USE_FIELDS = ("deterministic", "decode", "cross_keys_transposed")

  def replace(self, **changes) -> TransformerConfig:
    return dataclasses.replace(self, **changes)

  @property
  def per_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

  @property
  def output_vocab_size(self) -> int:
    return self.target_vocab_size or self.vocab_size

  @property
  def padded_vocab_size(self) -> int:
    """Rows of the (source) embedding table: `vocab_size` rounded up to `vocab_pad_multiple`."""
    return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

  @property
  def padded_output_vocab_size(self) -> int:
    """Rows of the output projection (and target embedding): `output_vocab_size` rounded up to
    `vocab_pad_multiple`; the logits keep only the first `output_vocab_size`."""
    multiple = self.vocab_pad_multiple
    return -(-self.output_vocab_size // multiple) * multiple

  @property
  def suppressed_ids(self) -> tuple[int, ...]:
    """Ids decoding never emits: PAD, and the decoder start token unless it doubles as EOS."""
    if self.decoder_start_id in (self.pad_id, self.eos_id):
      return (self.pad_id,)
    return (self.pad_id, self.decoder_start_id)

  @property
  def compute_dtype(self) -> Any:
    return _DTYPES[self.dtype]

  @property
  def weight_dtype(self) -> Any:
    return _DTYPES[self.param_dtype]

  @classmethod
  def from_mapping(cls, values: Mapping[str, Any], **overrides) -> TransformerConfig:
    """Builds a config from an ml_collections `config.model` section (or any mapping)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    values = dict(values, **overrides)
    unknown = sorted(set(values) - fields)
    if unknown:
      raise errors.BadValue(f"Unknown model config keys {unknown}; valid keys: {sorted(fields)}")
    return cls(**values)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

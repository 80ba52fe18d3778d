"""Accelerator-time estimates of an experiment's training, computed from its config.

Why code and not docstrings: a hand-written figure goes stale when a row's model, batch or
dtype changes, and one written for bf16 misleads for a row that trains in float32. Here the
model is the row's own (shapes from `jax.eval_shape`, as `model.count_parameters`), the
tokens and steps are its `train` section, and the peak is the one of its `model.dtype` on
the accelerator: "auto" (the paper rows) counts as bfloat16, what it resolves to on GPU/TPU,
not as the float32 it would be on the CPU that prints the estimate.

  FLOPs/step = 6 x (P_enc x T_src + (P_dec + P_out) x T_tgt)

P_enc / P_dec: the encoder / decoder layers' parameters; P_out: the matrix multiplied at the
softmax (the tied embedding, or the untied output projection). Lookup-only tables (an untied
or target-side token embedding, learned positions) cost no matmul and are not counted.
T_src = T_tgt: packed token slots per update, (batch_tokens // max_len) x max_len over all
devices and accumulation steps (padding included: an upper bound, packing fills most).
6 = 2 (multiply-add) x 3 (forward, and a backward of twice its cost). The attention
scores (QK^T and AV: 12 x heads x head_dim x L FLOPs per token, attention and layer, with
L = data.max_len, the packed row the scores span, masked or not) are shown beside it as a
percentage and left out of the hours: a fused kernel that skips masked blocks does less.

hours = steps x FLOPs/step / (devices x peak[model.dtype] x UTILIZATION) / 3600
"""

from __future__ import annotations

import dataclasses
import math

import jax
import ml_collections

from transformer_mt.model.setup import model_config_for
from transformer_mt.model.transformer import parameter_shapes
from transformer_mt.model.transformer_config import auto_dtype

# Dense (no sparsity) peaks of one NVIDIA A100 SXM, from NVIDIA's A100 datasheet: bf16/fp16
# tensor cores 312 TFLOP/s, TF32 tensor cores 156, plain FP32 19.5. A float32 row is costed
# at the TF32 peak: JAX's default matmul precision computes float32 dots with TF32 on
# Ampere and later GPUs (docs.jax.dev, "Matmul precision"); the 19.5 FP32 peak applies only
# under jax_default_matmul_precision=highest.
DEVICE = "A100"
PEAK_FLOPS = {
  "bfloat16": (312e12, "bf16 tensor cores"),
  "float16": (312e12, "fp16 tensor cores"),
  "float32": (156e12, "TF32 tensor cores, JAX's default for float32 matmuls on GPU"),
}
FP32_HIGHEST_PEAK_FLOPS = 19.5e12  # For reference: float32 at precision "highest".
# Sustained fraction of the peak assumed for a well-fed Transformer step (model FLOPs
# utilization); measured runs land between ~30% and ~50%.
UTILIZATION = 0.4


@dataclasses.dataclass(frozen=True)
class Estimate:
  encoder_params: int
  decoder_params: int
  output_params: int
  lookup_params: int
  source_tokens: int  # Per update.
  target_tokens: int
  num_steps: int
  dtype: str  # The compute dtype on the accelerator ("auto" resolved for a GPU).
  devices: int
  # For the attention-score term: heads x head_dim, layers, packed row length.
  attention_width: int = 0
  encoder_layers: int = 0
  decoder_layers: int = 0
  row_length: int = 0
  configured_dtype: str = ""  # model.dtype as the row sets it ("auto", or a dtype).

  @property
  def total_params(self) -> int:
    return self.encoder_params + self.decoder_params + self.output_params + self.lookup_params

  @property
  def flops_per_step(self) -> float:
    return 6.0 * (
      self.encoder_params * self.source_tokens
      + (self.decoder_params + self.output_params) * self.target_tokens
    )

  @property
  def attention_flops_per_step(self) -> float:
    """Scores and their weighted sum over whole packed rows: encoder self-attention per
    source token, decoder self- and cross-attention per target token."""
    per_attention = 12.0 * self.attention_width * self.row_length
    return per_attention * (
      self.encoder_layers * self.source_tokens + 2 * self.decoder_layers * self.target_tokens
    )

  @property
  def total_flops(self) -> float:
    return self.flops_per_step * self.num_steps

  @property
  def peak_flops(self) -> float:
    return PEAK_FLOPS[self.dtype][0]

  @property
  def hours(self) -> float:
    return self.total_flops / (self.devices * self.peak_flops * UTILIZATION) / 3600


def parameter_parts(config: ml_collections.ConfigDict) -> dict[str, int]:
  """Parameters of the row's model by part: encoder, decoder, output (the softmax matrix),
  lookup (everything else: token and position tables only looked up). A padded vocabulary
  (model.vocab_pad_multiple) counts its real ids only, as `count_parameters` does."""
  model_config = model_config_for(config).replace(vocab_pad_multiple=1)
  params = parameter_shapes(model_config)
  parts = dict(encoder=0, decoder=0, output=0, lookup=0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [p.key for p in path]
    if keys[0].startswith("encoder"):
      part = "encoder"
    elif keys[0].startswith("decoder"):
      part = "decoder"
    elif keys[0] in ("output_projection", "logits_bias") or (
      model_config.share_embeddings and keys[:2] == ["source_embedder", "embedding"]
    ):
      part = "output"
    else:
      part = "lookup"
    parts[part] += math.prod(leaf.shape)
  return parts


def not_estimated(config: ml_collections.ConfigDict) -> str | None:
  """Why a row has no estimate: "import" (a published model evaluated as it is) or
  "fine-tune" (its model is the import's, known once imported); None: it has one."""
  if config.init["from"]:
    return "import" if config.train.num_steps == 0 else "fine-tune"
  return None


def accelerator_dtype(dtype: str) -> str:
  """The dtype a row configured with `dtype` computes in on the estimate's GPU."""
  return auto_dtype("gpu") if dtype == "auto" else dtype


def estimate(config: ml_collections.ConfigDict, devices: int = 1) -> Estimate:
  parts = parameter_parts(config)
  model_config = model_config_for(config)
  max_len = config.data.max_len
  slots = config.train.batch_tokens // max_len * max_len
  return Estimate(
    encoder_params=parts["encoder"],
    decoder_params=parts["decoder"],
    output_params=parts["output"],
    lookup_params=parts["lookup"],
    source_tokens=slots,
    target_tokens=slots,
    num_steps=config.train.num_steps,
    dtype=accelerator_dtype(config.model.dtype),
    devices=devices,
    attention_width=model_config.num_heads * model_config.per_head_dim,
    encoder_layers=model_config.num_encoder_layers,
    decoder_layers=model_config.num_decoder_layers,
    row_length=max_len,
    configured_dtype=config.model.dtype,
  )


def describe(e: Estimate) -> list[str]:
  """The estimate with its formula and every number in it, for `reproduce --dry-run`."""
  peak, peak_name = PEAK_FLOPS[e.dtype]
  lines = [
    f"parameters: encoder {e.encoder_params:,}, decoder {e.decoder_params:,}, "
    f"output projection {e.output_params:,}, lookup-only {e.lookup_params:,}",
    f"tokens per update: {e.source_tokens:,} source + {e.target_tokens:,} target (packed slots)",
    "FLOPs/update = 6 x (P_enc x T_src + (P_dec + P_out) x T_tgt) = "
    f"{e.flops_per_step:.3g}; x {e.num_steps:,} updates = {e.total_flops:.3g} FLOPs",
    f"estimate: {e.hours:.3g} hours on {e.devices} {DEVICE} at {UTILIZATION:.0%} of "
    f"{peak / 1e12:g} TFLOP/s ({e.dtype}: {peak_name})",
    f"not included: attention scores over packed rows of {e.row_length} tokens, "
    f"{e.attention_flops_per_step:.3g} FLOPs/update "
    f"(+{e.attention_flops_per_step / e.flops_per_step:.0%})",
  ]
  if e.configured_dtype == "auto":
    lines.append(
      f"dtype: model.dtype=auto computes in {e.dtype} on GPU/TPU (float32 parameters and "
      "loss), float32 on CPU; model.dtype=float32 on the command line costs it at TF32"
    )
  return lines

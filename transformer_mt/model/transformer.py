"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Every parameter carries logical axis names ("vocab", "embed", "heads", "kv", "mlp")
that `transformer_mt.runtime.sharding` maps onto the device mesh, so the same module runs
on one CPU or a pod. Packed batches (several sentences per row) are supported via
segment ids and per-sentence positions.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_mt.model.attention import (
  AttentionMask,
  MultiHeadAttention,
  bias_init,
  dense_init,
  sinusoidal_encoding,
)
from transformer_mt.model.transformer_config import ACTIVATIONS, TransformerConfig

# The function of each activation TransformerConfig accepts (its ACTIVATIONS, the names).
ACTIVATION_FUNCTIONS = {
  "relu": nn.relu,
  # Hugging Face's "gelu" is the exact erf form; jax.nn.gelu defaults to the tanh approximation.
  "gelu": functools.partial(nn.gelu, approximate=False),
  "gelu_tanh": functools.partial(nn.gelu, approximate=True),
  "swish": nn.swish,
}
assert set(ACTIVATION_FUNCTIONS) == set(ACTIVATIONS), "the two lists of activations differ"


class FeedForward(nn.Module):
  """FFN(x) = act(x W1 + b1) W2 + b2, applied at every position (act = ReLU in the paper)."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.config

    def dense(features, axes, name):
      return nn.Dense(
        features,
        use_bias=cfg.use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        kernel_init=dense_init(axes),
        bias_init=bias_init(axes[-1:]),
        name=name,
      )

    hidden = ACTIVATION_FUNCTIONS[cfg.activation](dense(cfg.d_ff, ("embed", "mlp"), "wi")(x))
    # hidden: [batch, len, d_ff]
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    if cfg.relu_dropout_rate > 0:
      hidden = nn.Dropout(cfg.relu_dropout_rate)(hidden, deterministic=cfg.deterministic)
    return dense(cfg.d_model, ("mlp", "embed"), "wo")(hidden)  # [batch, len, d_model]


def layer_norm(cfg: TransformerConfig, name: str | None = None) -> nn.LayerNorm:
  """The model's LayerNorm: its epsilon, bias, dtypes and the "embed" logical axis."""
  return nn.LayerNorm(
    epsilon=cfg.layer_norm_epsilon,
    use_bias=cfg.use_bias,
    dtype=cfg.compute_dtype,
    param_dtype=cfg.weight_dtype,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
    bias_init=bias_init(("embed",)),
    name=name,
  )


class SublayerConnection(nn.Module):
  """Wraps a sub-layer with dropout, the residual and LayerNorm (post- or pre-LN)."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array, sublayer) -> jax.Array:
    cfg = self.config
    norm = lambda: layer_norm(cfg, name="norm")  # noqa: E731  (one LayerNorm per sub-layer)
    pre_ln = cfg.use_layer_norm and cfg.layer_norm_position == "pre"
    y = sublayer(norm()(x) if pre_ln else x)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=cfg.deterministic)
    if cfg.use_residual:
      y = x + y
    if cfg.use_layer_norm and cfg.layer_norm_position == "post":
      y = norm()(y)
    return nn.with_logical_constraint(y, ("batch", "length", "embed"))


class EncoderLayer(nn.Module):
  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None) -> jax.Array:
    attention = MultiHeadAttention(self.config, name="self_attention")
    x = SublayerConnection(self.config, name="attention_block")(x, lambda h: attention(h, h, mask))
    return SublayerConnection(self.config, name="ffn_block")(
      x, FeedForward(self.config, name="ffn")
    )


class DecoderLayer(nn.Module):
  config: TransformerConfig

  @nn.compact
  def __call__(self, y, encoded, self_mask, cross_mask, cache_length=None):
    cfg = self.config
    self_attention = MultiHeadAttention(cfg, name="self_attention")
    cross_attention = MultiHeadAttention(cfg, is_cross_attention=True, name="cross_attention")
    y = SublayerConnection(cfg, name="self_attention_block")(
      y, lambda h: self_attention(h, h, self_mask, cache_length)
    )
    y = SublayerConnection(cfg, name="cross_attention_block")(
      y, lambda h: cross_attention(h, encoded, cross_mask)
    )
    return SublayerConnection(cfg, name="ffn_block")(y, FeedForward(cfg, name="ffn"))


class Embedder(nn.Module):
  """Token embedding (scaled by sqrt(d_model)) + position encoding (+ LayerNorm) + dropout.

  Attributes:
    tokens_from: another Embedder whose token embedding this one reuses (a decoder with
      tied token embeddings but its own positions and LayerNorm, as mBART's); None: its own.
  """

  config: TransformerConfig
  vocab_size: int  # rows of the table: the vocabulary padded to config.vocab_pad_multiple
  tokens_from: Embedder | None = None

  def setup(self):
    cfg = self.config
    if self.tokens_from is not None:
      return self._setup_positions()
    self.embedding = nn.Embed(
      self.vocab_size,
      cfg.d_model,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.weight_dtype,
      embedding_init=nn.with_logical_partitioning(
        nn.initializers.normal(stddev=cfg.d_model**-0.5), ("vocab", "embed")
      ),
    )
    self._setup_positions()

  def _setup_positions(self):
    cfg = self.config
    if cfg.position_encoding == "learned":
      self.position_embedding = nn.Embed(
        cfg.max_len + cfg.position_offset,
        cfg.d_model,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        embedding_init=nn.with_logical_partitioning(
          nn.initializers.normal(stddev=0.02), (None, "embed")
        ),
      )
    if cfg.embedding_layer_norm:
      self.embedding_norm = layer_norm(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def __call__(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    cfg = self.config
    token_embedding = self.embedding if self.tokens_from is None else self.tokens_from.embedding
    x = token_embedding(tokens)  # [batch, len, d_model]
    if cfg.scale_embeddings:
      x = x * jnp.sqrt(cfg.d_model).astype(x.dtype)
    positions = positions + cfg.position_offset if cfg.position_offset else positions
    if cfg.position_encoding == "learned":
      # Only padding may sit past the table (a batch padded to a bucket longer than max_len):
      # training refuses data.max_len > max_len and translation truncates longer lines. JAX's
      # out-of-range gather would give those rows NaN, which masked attention (0 * NaN) would
      # spread; the last row is as good as any for a padding position.
      table_rows = cfg.max_len + cfg.position_offset
      x = x + self.position_embedding(jnp.minimum(positions, table_rows - 1))
    else:
      x = x + sinusoidal_encoding(positions, cfg.d_model, cfg.position_encoding).astype(x.dtype)
    if cfg.embedding_layer_norm:
      x = self.embedding_norm(x)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    return self.dropout(x, deterministic=cfg.deterministic)

  def attend(self, x: jax.Array) -> jax.Array:
    """Pre-softmax projection with the (tied) embedding matrix: x E^T."""
    dtype = self.config.compute_dtype
    return tied_logits(x.astype(dtype), self.embedding.embedding.astype(dtype))

  def table(self) -> jax.Array:
    """The token embedding matrix [vocab rows, d_model] in the parameter dtype."""
    return self.embedding.embedding


@jax.custom_vjp
def tied_logits(x: jax.Array, embedding: jax.Array) -> jax.Array:
  """x E^T: [..., d_model] x [vocab, d_model] -> float32 [..., vocab], with a cheaper backward.

  The logits come out of the matmul's float32 accumulator as they are: in bfloat16 compute
  the softmax and the loss then see logits never rounded to bfloat16's 8-bit mantissa
  (~0.03 at a logit of 10). The backward takes the float32 cotangent back to the compute
  dtype first, so both of its matmuls run at the bfloat16 rate as the forward does (autodiff
  would multiply float32 by bfloat16, which XLA runs in float32).

  Autodiff also forms dE = g^T x by first copying the logits' cotangent g [tokens, vocab],
  the largest array of the step, into transposed layout; written as (x^T g)^T, XLA
  transposes only x [tokens, d_model] and folds the outer transpose into the matmul (on CPU:
  ~10% off the vocabulary projection and loss, fwd + bwd, at a 37k vocabulary).
  """
  return jnp.einsum("...d,vd->...v", x, embedding, preferred_element_type=jnp.float32)


def _tied_logits_forward(x, embedding):
  return tied_logits(x, embedding), (x, embedding)


def _tied_logits_backward(residuals, g):
  x, embedding = residuals
  g = g.astype(x.dtype)
  f32 = jnp.float32
  d_x = jnp.einsum("...v,vd->...d", g, embedding, preferred_element_type=f32)  # [..., d_model]
  d_embedding = jnp.einsum("...d,...v->dv", x, g, preferred_element_type=f32).T  # [vocab, d]
  return d_x.astype(x.dtype), d_embedding.astype(embedding.dtype)


tied_logits.defvjp(_tied_logits_forward, _tied_logits_backward)


def _default_positions(tokens: jax.Array) -> jax.Array:
  return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


class Transformer(nn.Module):
  """Encoder-decoder. `__call__` is teacher-forced training; `encode`/`decode` serve decoding."""

  config: TransformerConfig

  def setup(self):
    cfg = self.config
    self.source_embedder = Embedder(cfg, cfg.padded_vocab_size)
    if cfg.share_embeddings and not cfg.share_position_embeddings:
      self.target_embedder = Embedder(cfg, cfg.padded_vocab_size, tokens_from=self.source_embedder)
    if not cfg.share_embeddings:
      self.target_embedder = Embedder(cfg, cfg.padded_output_vocab_size)
      self.output_projection = nn.Dense(
        cfg.padded_output_vocab_size,
        use_bias=cfg.use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        kernel_init=dense_init(("embed", "vocab")),
        bias_init=bias_init(("vocab",)),
      )
    elif cfg.logits_bias:
      self.logits_bias = self.param(
        "logits_bias", bias_init(("vocab",)), (cfg.padded_output_vocab_size,), cfg.weight_dtype
      )
    # Remat only matters under jax.grad; decoding with the KV cache never needs it.
    remat = nn.remat if cfg.remat and not cfg.decode else lambda layer: layer
    self.encoder_layers = [remat(EncoderLayer)(cfg) for _ in range(cfg.num_encoder_layers)]
    self.decoder_layers = [remat(DecoderLayer)(cfg) for _ in range(cfg.num_decoder_layers)]
    # Pre-LN stacks end with a LayerNorm: their residual stream is never normalized otherwise.
    if cfg.use_layer_norm and cfg.layer_norm_position == "pre":
      self.encoder_norm, self.decoder_norm = layer_norm(cfg), layer_norm(cfg)

  def encode(self, inputs, inputs_positions=None, inputs_segmentation=None):
    """The encoder's output [batch, src_len, d_model].

    Args:
      inputs: int [batch, src_len] source ids, `config.pad_id` at padding.
      inputs_positions: int [batch, src_len], each token's position in its own sentence
        (packed rows restart at 0 per sentence); default 0, 1, 2, ... along the row.
      inputs_segmentation: int [batch, src_len], the sentence (1, 2, ...) of each token of a
        packed row, 0 at padding; tokens attend only within their sentence. None: one
        sentence per row.
    """
    cfg = self.config
    positions = _default_positions(inputs) if inputs_positions is None else inputs_positions
    valid = inputs != cfg.pad_id  # [batch, src_len]
    mask = AttentionMask(valid, valid, inputs_segmentation, inputs_segmentation)
    x = self.source_embedder(inputs, positions)
    for layer in self.encoder_layers:
      x = layer(x, mask)
    if cfg.use_layer_norm and cfg.layer_norm_position == "pre":
      x = self.encoder_norm(x)
    return x

  def decode(
    self,
    encoded,
    inputs_valid,
    targets_in,
    targets_positions=None,
    inputs_segmentation=None,
    targets_segmentation=None,
    cache_length=None,
  ):
    """Decoder logits: `output_logits` of `decode_hidden`'s states (same arguments).

    Returns:
      float32 logits [batch, tgt_len, output_vocab_size].
    """
    y = self.decode_hidden(
      encoded,
      inputs_valid,
      targets_in,
      targets_positions,
      inputs_segmentation,
      targets_segmentation,
      cache_length,
    )
    return self.output_logits(y)

  def decode_hidden(
    self,
    encoded,
    inputs_valid,
    targets_in,
    targets_positions=None,
    inputs_segmentation=None,
    targets_segmentation=None,
    cache_length=None,
  ):
    """The decoder's final states, the input of the output projection.

    Args:
      encoded: [batch, src_len, d_model]; may be None while decoding once the cache
        holds the cross-attention keys/values.
      inputs_valid: bool [batch, src_len], False at source padding.
      targets_in: int [batch, tgt_len], the target shifted right (BOS first); [batch, 1]
        when decoding step by step.
      targets_positions: int [batch, tgt_len]; required when decoding (the step index).
      cache_length: target positions the decode cache holds (only when creating it).

    Returns:
      [batch, tgt_len, d_model] in the compute dtype.
    """
    cfg = self.config
    if targets_positions is None:
      if cfg.decode:
        raise ValueError("decode=True needs targets_positions (the current step).")
      targets_positions = _default_positions(targets_in)
    targets_valid = targets_in != cfg.pad_id
    if cfg.decoder_start_id == cfg.pad_id:
      # Marian starts the decoder with PAD: the first position is a real token all the same.
      targets_valid = targets_valid | (targets_positions == 0)
    if cfg.decode:
      self_mask = None  # the attention cache masks not-yet-written positions itself.
      cross_mask = inputs_valid[:, None, None, :]  # [batch, 1, 1, src_len]
    else:
      self_mask = AttentionMask(
        targets_valid, targets_valid, targets_segmentation, targets_segmentation, causal=True
      )
      cross_mask = AttentionMask(
        targets_valid,
        inputs_valid,
        targets_segmentation,
        inputs_segmentation if targets_segmentation is not None else None,
      )
    shared = cfg.share_embeddings and cfg.share_position_embeddings
    embedder = self.source_embedder if shared else self.target_embedder
    y = embedder(targets_in, targets_positions)
    for layer in self.decoder_layers:
      y = layer(y, encoded, self_mask, cross_mask, cache_length)
    if cfg.use_layer_norm and cfg.layer_norm_position == "pre":
      y = self.decoder_norm(y)
    return y  # [batch, tgt_len, d_model]

  def output_logits(self, y: jax.Array) -> jax.Array:
    """float32 logits [..., output_vocab_size] of decoder states y [..., d_model].

    With a padded vocabulary (`vocab_pad_multiple`) the product runs over every row of the
    table and the padded ids' logits are then cut off: nothing downstream (the loss, its
    softmax and label smoothing, greedy, beam and sampled decoding, scoring) ever sees them, so
    they are never produced, and their rows never receive a gradient.
    """
    cfg = self.config
    if cfg.share_embeddings:
      logits = self.source_embedder.attend(y)
      if cfg.logits_bias:
        logits = logits + self.logits_bias.astype(logits.dtype)
    else:
      logits = self.output_projection(y)
    return logits[..., : cfg.output_vocab_size].astype(jnp.float32)  # [..., vocab]

  def output_layer(self) -> tuple[jax.Array, jax.Array | None]:
    """(W [padded output vocab, d_model], bias [padded output vocab] or None), in the parameter
    dtype: `output_logits(y)` is y W^T + bias cut to the real vocabulary. The chunked loss
    (training/chunked_loss.py) multiplies by them itself, a chunk of tokens at a time."""
    cfg = self.config
    if cfg.share_embeddings:
      return self.source_embedder.table(), self.logits_bias if cfg.logits_bias else None
    projection = self.output_projection.variables["params"]
    return projection["kernel"].T, projection.get("bias")

  def __call__(
    self,
    inputs,
    targets_in,
    inputs_positions=None,
    targets_positions=None,
    inputs_segmentation=None,
    targets_segmentation=None,
  ):
    """Teacher-forced float32 logits [batch, tgt_len, vocab] for source `inputs` and shifted
    targets `targets_in`, as `encode` then `decode` (which say what the positions and
    segmentations of packed rows are)."""
    return self.output_logits(
      self.hidden_states(
        inputs,
        targets_in,
        inputs_positions,
        targets_positions,
        inputs_segmentation,
        targets_segmentation,
      )
    )

  def hidden_states(
    self,
    inputs,
    targets_in,
    inputs_positions=None,
    targets_positions=None,
    inputs_segmentation=None,
    targets_segmentation=None,
  ):
    """Teacher-forced decoder states [batch, tgt_len, d_model] (the arguments of `__call__`):
    what the logits are computed from, for a loss that computes them itself."""
    encoded = self.encode(inputs, inputs_positions, inputs_segmentation)
    return self.decode_hidden(
      encoded,
      inputs != self.config.pad_id,
      targets_in,
      targets_positions,
      inputs_segmentation,
      targets_segmentation,
    )


def parameter_shapes(config: TransformerConfig) -> dict:
  """The model's parameter tree as `jax.ShapeDtypeStruct` leaves (unboxed, nothing allocated):
  names and shapes for counting parameters or checking converted weights.

  Every encoder layer is `EncoderLayer(config)` and every decoder layer `DecoderLayer(config)`,
  so they all hold the same shapes: the tree is traced with at most one layer of each kind and
  that layer's subtree repeated under each index. Tracing `init` costs in proportion to the
  layers (`run.py list` traces every experiment's model); tests/test_model.py compares this
  with the trace of the whole model. Repeated calls with one config reuse the trace."""
  shapes = _parameter_shapes(config.replace(deterministic=True))
  return jax.tree.map(lambda leaf: leaf, shapes)  # new dicts: callers may add or drop keys


@functools.lru_cache(maxsize=32)
def _parameter_shapes(config: TransformerConfig) -> dict:
  counts = {
    "encoder_layers": config.num_encoder_layers,
    "decoder_layers": config.num_decoder_layers,
  }
  one_of_each = config.replace(
    num_encoder_layers=min(config.num_encoder_layers, 1),
    num_decoder_layers=min(config.num_decoder_layers, 1),
  )
  shapes = traced_parameter_shapes(one_of_each)
  for kind, count in counts.items():
    for index in range(1, count):
      shapes[f"{kind}_{index}"] = shapes[f"{kind}_0"]
  return dict(sorted(shapes.items()))  # the order jax.eval_shape gives a dict's keys


def traced_parameter_shapes(config: TransformerConfig) -> dict:
  """`parameter_shapes` by tracing the whole model's `init`, every layer included."""
  model = Transformer(config.replace(deterministic=True))
  dummy = jnp.ones((1, 2), jnp.int32)
  return nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy))["params"])


def count_parameters(config: TransformerConfig) -> int:
  """Number of parameters; a tied embedding matrix is counted once (it is one array). The
  rows of a padded vocabulary (`vocab_pad_multiple`) are not counted: they are never used."""
  unpadded = parameter_shapes(config.replace(vocab_pad_multiple=1))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(unpadded))

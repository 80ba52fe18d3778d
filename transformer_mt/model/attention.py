"""Multi-head scaled dot-product attention, with a KV cache for incremental decoding.

Self-attention during decoding appends one key/value per step to a cache of fixed length
(so the decode loop has static shapes; its layouts and writes are model/decode_cache.py's).
Cross-attention during decoding projects the encoder output to keys/values once, when the
cache is created, and only reads them afterwards: the per-step cost is then independent of
the source projection, which is what beam search needs.

The attention itself goes through `jax.nn.dot_product_attention` (which a backend may replace
with a fused kernel that never stores the probabilities) unless the probabilities are needed
as an array: for attention dropout while training, or when a caller collects them with
`mutable=["intermediates"]` (the attention plots). Decoding
against the cache goes through `decode_cache.decode_attention` instead: the cache is kept
head-major and the cross-attention keys/values may be one row per sentence for all its beams.

Teacher-forced calls describe their mask as an `AttentionMask` (valid tokens, causality,
packing) rather than a dense [batch, 1, q, k] array, so the cuDNN kernel can be told
`is_causal` and the sequence lengths: a dense mask reaches cuDNN only as an additive bias
it must read in full, and a causal flag lets it skip the blocks above the diagonal. The
kernels that take packed rows' sentences directly ("cudnn_packed", "pallas") are adapted
in model/fused_kernels.py.
Softmax statistics are float32 on every path, whatever the compute dtype.

`config.fuse_qkv` computes the query, key and value projections of self-attention (the key
and value ones of cross-attention) as one matmul against their kernels stacked at call time;
the parameters stay three (checkpoints, imports and sharding rules see no difference).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from transformer_mt.model import decode_cache, fused_kernels
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors


def dense_init(logical_axes: tuple[str, ...]):
  return nn.with_logical_partitioning(nn.initializers.xavier_uniform(), logical_axes)


def bias_init(logical_axes: tuple[str, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), logical_axes)


def padding_mask(query_valid: jax.Array, key_valid: jax.Array) -> jax.Array:
  """[batch, q] and [batch, k] booleans -> [batch, 1, q, k]: True where both are real tokens."""
  return query_valid[:, None, :, None] & key_valid[:, None, None, :]


def causal_mask(length: int) -> jax.Array:
  """[1, 1, length, length]: position i may attend to positions <= i."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
  """[batch, 1, q, k]: True where query and key belong to the same packed sentence."""
  return query_segments[:, None, :, None] == key_segments[:, None, None, :]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  return functools.reduce(jnp.logical_and, masks)


@flax.struct.dataclass
class AttentionMask:
  """Who may attend to whom in a teacher-forced (non-decode) attention, by its parts.

  Padding is trailing in every batch the model sees (right-padded evaluation batches;
  packed rows fill from the left), so the valid tokens of a row are a prefix and their
  count is the row's sequence length.

  Attributes:
    query_valid, key_valid: bool [batch, q] / [batch, k]; False at padding.
    query_segments, key_segments: int [batch, q] / [batch, k] packed-sentence ids, or None
      for unpacked rows.
    causal: query i sees keys <= i (decoder self-attention); static.
  """

  query_valid: jax.Array
  key_valid: jax.Array
  query_segments: jax.Array | None = None
  key_segments: jax.Array | None = None
  causal: bool = flax.struct.field(pytree_node=False, default=False)

  def dense(self) -> jax.Array:
    """bool [batch, 1, q, k]: True = attend."""
    mask = padding_mask(self.query_valid, self.key_valid)
    if self.causal:
      mask = combine_masks(mask, causal_mask(self.query_valid.shape[1]))
    if self.query_segments is not None:
      mask = combine_masks(mask, segment_mask(self.query_segments, self.key_segments))
    return mask

  def flags(self) -> dict:
    """The same mask as `jax.nn.dot_product_attention` keywords: `is_causal` and the
    sequence lengths; only packed rows keep a dense part, their segment mask
    [batch, 1, q, k], because the public API (JAX 0.10) has no segment ids: cuDNN's packed
    layout (q_offsets/kv_offsets) is reachable only through jax._src.

    Outputs at padded query positions differ from the dense mask's (zeros here, an average
    of the values there); nothing reads them: later layers mask them as keys and the loss
    weighs them 0.
    """
    segments = None
    if self.query_segments is not None:
      segments = segment_mask(self.query_segments, self.key_segments)
    return dict(
      mask=segments,
      is_causal=self.causal,
      query_seq_lengths=jnp.sum(self.query_valid, axis=-1, dtype=jnp.int32),
      key_value_seq_lengths=jnp.sum(self.key_valid, axis=-1, dtype=jnp.int32),
    )


def fused_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  mask: AttentionMask | jax.Array | None,
  implementation: str = "auto",
  use_flags: bool | None = None,
  cross_attention: bool = False,
) -> jax.Array:
  """Attention over [batch, len, heads, head_dim] arrays that never stores the probabilities
  where the backend has a fused kernel: `jax.nn.dot_product_attention`, or for packed rows
  one of model/fused_kernels.py's kernels.

  Args:
    mask: an `AttentionMask`, or a dense boolean mask broadcastable to [batch, heads, q, k].
    implementation: "auto" (JAX's choice; see `fused_kernels.resolve`), "xla", "cudnn", or
      "cudnn_packed" / "pallas", which take an `AttentionMask`'s sentences as such. Where
      those kernels do not apply ("cudnn_packed": unpacked rows or a dense mask; "pallas":
      cross-attention, a dense mask or a length no Triton block divides), the call goes on
      as "cudnn" / "auto" would.
    use_flags: pass an `AttentionMask` as flags (`AttentionMask.flags`) rather than dense;
      default: for "cudnn" only, where flags select the causal/padding kernels. XLA builds
      the same dense mask from flags itself, so there the dense path costs nothing more and
      keeps outputs at padded queries as they were.
    cross_attention: queries and keys are different sequences ("pallas" serves only
      self-attention).
  """
  implementation = fused_kernels.resolve(implementation, query.dtype)
  if implementation in fused_kernels.FUSED_IMPLEMENTATIONS:
    context = _packed_kernel_attention(query, key, value, mask, implementation, cross_attention)
    if context is not None:
      return context
    implementation = "cudnn" if implementation == "cudnn_packed" else "auto"
  if use_flags is None:
    use_flags = implementation == "cudnn"
  if isinstance(mask, AttentionMask):
    masking = mask.flags() if use_flags else dict(mask=mask.dense())
  else:
    masking = dict(mask=mask)
  return jax.nn.dot_product_attention(
    query,
    key,
    value,
    **masking,
    implementation=None if implementation == "auto" else implementation,
  )


def _packed_kernel_attention(query, key, value, mask, implementation, cross_attention):
  """`fused_attention` through "cudnn_packed" or "pallas"; None where the kernel does not
  apply (the caller then takes JAX's "cudnn" or default path). Refuses, with one `error:`
  line, a backend the kernel cannot run on."""
  if implementation == "cudnn_packed":
    fused_kernels.require("cudnn_packed")
    if not isinstance(mask, AttentionMask) or mask.query_segments is None:
      return None
    return fused_kernels.cudnn_packed_attention(
      query, key, value, mask.query_segments, mask.key_segments, mask.causal
    )
  interpret = fused_kernels.pallas_interpret()
  if cross_attention or not isinstance(mask, AttentionMask):
    return None
  return fused_kernels.pallas_self_attention(
    query, key, value, mask.query_valid, mask.query_segments, mask.causal, interpret
  )


def _flat_xavier_uniform(in_ndim: int, gain: float = 1.0):
  """Glorot init of the 2-D [prod(in dims), prod(out dims)], reshaped; `gain` as torch's."""

  def init(key, shape, dtype=jnp.float32):
    fan_in, fan_out = math.prod(shape[:in_ndim]), math.prod(shape[in_ndim:])
    kernel = nn.initializers.xavier_uniform()(key, (fan_in, fan_out), dtype).reshape(shape)
    return kernel if gain == 1.0 else kernel * jnp.asarray(gain, dtype)

  return init


class HeadsProjection(nn.Module):
  """y = x W + b contracting the trailing `in_shape` dims of x into `out_shape` dims.

  Used for Q/K/V ([d_model] -> [heads, head_dim]) and the output projection W^O
  ([heads, head_dim] -> [d_model]); `axes` names the kernel's dims for sharding.
  """

  config: TransformerConfig
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  axes: tuple[str, ...]
  use_bias: bool = True
  init_gain: float = 1.0  # Glorot gain of the kernel's initialization

  @nn.compact
  def weights(self) -> tuple[jax.Array, jax.Array | None]:
    """The kernel [*in_shape, *out_shape] and the bias [*out_shape] (None without one), in
    the parameter dtype: what `__call__` applies, and what a fused Q/K/V matmul stacks."""
    cfg = self.config
    n_in = len(self.in_shape)
    # The kernel first: it draws the module's first parameter key, as it always has.
    kernel = self.param(
      "kernel",
      nn.with_logical_partitioning(_flat_xavier_uniform(n_in, self.init_gain), self.axes),
      self.in_shape + self.out_shape,
      cfg.weight_dtype,
    )
    bias = None
    if self.use_bias:
      bias = self.param("bias", bias_init(self.axes[n_in:]), self.out_shape, cfg.weight_dtype)
    return kernel, bias

  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.config
    kernel, bias = self.weights()
    n_in = len(self.in_shape)
    letters = "abcdefgh"
    x_dims, in_dims, out_dims = (
      "xyz"[: x.ndim - n_in],
      letters[:n_in],
      letters[n_in : n_in + len(self.out_shape)],
    )
    y = jnp.einsum(
      f"{x_dims}{in_dims},{in_dims}{out_dims}->{x_dims}{out_dims}",
      x.astype(cfg.compute_dtype),
      kernel.astype(cfg.compute_dtype),
    )
    if bias is not None:
      y = y + bias.astype(cfg.compute_dtype)
    return y


class MultiHeadAttention(nn.Module):
  """Attention(Q, K, V) = softmax(QK^T / sqrt(d_k)) V over `num_heads` heads.

  Attributes:
    config: model hyperparameters.
    is_cross_attention: keys/values come from the encoder; when decoding they are
      projected once into the cache and reused at every step.
  """

  config: TransformerConfig
  is_cross_attention: bool = False

  def _projection(self, name: str) -> HeadsProjection:
    cfg = self.config
    # Keys get no bias: a key bias b_k shifts every logit of a query by the same q.b_k,
    # which softmax cancels. Its gradient is exactly zero, and Adam (eps 1e-9) would
    # turn the rounding noise in it into full-size random updates.
    return HeadsProjection(
      cfg,
      in_shape=(cfg.d_model,),
      out_shape=(cfg.num_heads, cfg.per_head_dim),
      axes=("embed", "heads", "kv"),
      use_bias=cfg.use_bias and name != "key",
      init_gain=cfg.qkv_init_gain,
      name=name,
    )

  @nn.compact
  def __call__(
    self,
    queries: jax.Array,
    key_value_inputs: jax.Array | None,
    mask: AttentionMask | jax.Array | None,
    cache_length: int | None = None,
  ) -> jax.Array:
    """Attends from `queries` [batch, q, d_model] to `key_value_inputs` [batch, k, d_model].

    Args:
      queries: [batch, q_len, d_model].
      key_value_inputs: [batch, kv_len, d_model]; the encoder output for cross-attention.
        May be None for cross-attention once the decode cache holds the keys/values.
      mask: an `AttentionMask` (teacher-forced calls), or boolean, broadcastable to
        [batch, heads, q_len, kv_len]; True = attend. While decoding self-attention, the
        mask over the cache is built here.
      cache_length: while decoding, the number of target positions the self-attention
        cache holds (only read when the cache is created).

    Returns:
      [batch, q_len, d_model].
    """
    cfg = self.config
    if isinstance(mask, AttentionMask) and (cfg.decode or self._needs_weights()):
      mask = mask.dense()  # Only the fused call takes a mask by its parts.
    # Self-attention's keys and values come from its queries' input: one matmul for all three
    # under fuse_qkv. Each [batch, len, heads, head_dim].
    fuse_all = cfg.fuse_qkv and key_value_inputs is queries
    if fuse_all:
      query, key, value = self._fused_projections(("query", "key", "value"), queries)
    else:
      query = self._projection("query")(queries)  # [batch, q, heads, head_dim]

    if cfg.decode and self.is_cross_attention:
      # keys [batch, heads, head_dim, src_len] (transposed), values [batch, heads, src_len,
      # head_dim]
      key, value = self._cached_cross_key_value(key_value_inputs)
    else:
      if not fuse_all:
        key, value = self._key_value(key_value_inputs)  # [batch, k, heads, head_dim]
      if cfg.decode:  # [batch, heads, cache_length, head_dim] from here on
        key, value, mask = decode_cache.append_self_attention(self, key, value, mask, cache_length)

    query = nn.with_logical_constraint(query, ("batch", "length", "heads", "kv"))
    if cfg.decode and not self._needs_weights():
      context = decode_cache.decode_attention(
        query, key, value, mask, keys_transposed=self._decode_keys_transposed()
      )
    elif self._needs_weights():
      if cfg.decode and self.has_variable("cache", decode_cache.ANCESTRY):
        raise ValueError("No attention weights from a beam search cache kept in place.")
      if cfg.decode:  # the cache's layout, one row per sentence or per beam, back to the usual
        if self._decode_keys_transposed():
          key = jnp.swapaxes(key, 2, 3)
        key, value = (decode_cache.rows_first(x, query.shape[0]) for x in (key, value))
      context = self._attend_with_weights(query, key, value, mask)
    else:
      # No probabilities are needed afterwards: the fused op may skip materializing them
      # (a flash kernel where the backend has one; the same XLA ops on CPU).
      context = fused_attention(
        query,
        key,
        value,
        mask,
        cfg.attention_implementation,
        cross_attention=self.is_cross_attention,
      )
    # context: [batch, q, heads, head_dim]

    if cfg.attention_output_projection:
      out = HeadsProjection(
        cfg,
        in_shape=(cfg.num_heads, cfg.per_head_dim),
        out_shape=(cfg.d_model,),
        axes=("heads", "kv", "embed"),
        use_bias=cfg.use_bias,
        name="out",
      )(context)
    else:
      if cfg.num_heads * cfg.per_head_dim != cfg.d_model:
        raise errors.BadValue(
          "attention_output_projection=False needs num_heads * head_dim == d_model, "
          f"got {cfg.num_heads} * {cfg.per_head_dim} != {cfg.d_model}"
        )
      out = context.reshape(context.shape[:2] + (cfg.d_model,))
    return out  # [batch, q, d_model]

  def _key_value(self, inputs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys and values [batch, k, heads, head_dim] of `inputs` [batch, k, d_model]."""
    if self.config.fuse_qkv:
      return self._fused_projections(("key", "value"), inputs)
    return self._projection("key")(inputs), self._projection("value")(inputs)

  def _fused_projections(self, names: tuple[str, ...], x: jax.Array) -> tuple[jax.Array, ...]:
    """The projections `names` of x [batch, len, d_model] as one matmul: their kernels
    stacked at call time on a new axis (the "heads" axis keeps its sharding), the
    parameters still one HeadsProjection each. Returns one [batch, len, heads, head_dim]
    per name, as the separate projections give them (to float rounding)."""
    cfg = self.config
    weights = [self._projection(name).weights() for name in names]
    kernel = jnp.stack([k for k, _ in weights], axis=1)  # [d_model, n, heads, head_dim]
    y = jnp.einsum(
      "bld,dnhk->blnhk", x.astype(cfg.compute_dtype), kernel.astype(cfg.compute_dtype)
    )  # [batch, len, n, heads, head_dim]
    if any(b is not None for _, b in weights):  # the key has none: a zero in its place
      bias = jnp.stack([jnp.zeros_like(kernel[0, 0]) if b is None else b for _, b in weights])
      y = y + bias.astype(cfg.compute_dtype)  # bias: [n, heads, head_dim]
    return tuple(y[:, :, i] for i in range(len(names)))

  def _decode_keys_transposed(self) -> bool:
    """The decode cache holds this layer's keys transposed, [batch, heads, head_dim, len]
    (`decode_cache.decode_attention`'s keys_transposed): the cross-attention keys (unless
    `cross_keys_transposed` is off), and the self-attention keys of a beam search cache kept
    in place."""
    if self.is_cross_attention:
      return self.config.cross_keys_transposed
    return self.has_variable("cache", decode_cache.ANCESTRY)

  def _needs_weights(self) -> bool:
    """The probabilities must exist as an array: someone collects them (attention plots
    apply with mutable=["intermediates"]), or attention dropout is applied to them."""
    cfg = self.config
    return self.is_mutable_collection("intermediates") or (
      cfg.attention_dropout_rate > 0 and not cfg.deterministic
    )

  def _attend_with_weights(self, query, key, value, mask) -> jax.Array:
    """softmax(QK^T / sqrt(d_k)) V spelled out, sowing the probabilities [batch, heads, q, k]."""
    cfg = self.config
    query = query / jnp.sqrt(query.shape[-1]).astype(query.dtype)
    logits = jnp.einsum(
      "bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32
    )  # [batch, heads, q, k]
    if mask is not None:
      logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(cfg.compute_dtype)
    # Kept only when the caller asks (mutable=["intermediates"]), e.g. for attention plots.
    self.sow("intermediates", "attention_weights", weights)  # [batch, heads, q, k]
    if cfg.attention_dropout_rate > 0:
      weights = nn.Dropout(cfg.attention_dropout_rate)(weights, deterministic=cfg.deterministic)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, value)  # [batch, q, heads, head_dim]

  def _cached_cross_key_value(self, encoded: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Encoder keys [batch, heads, head_dim, src_len] and values [batch, heads, src_len,
    head_dim], projected when the cache is created and read back afterwards (head-major:
    `decode_attention`). The keys are kept transposed: the product of a step's queries with
    them is then a plain matrix product, where keys [src_len, head_dim] made XLA's CPU
    kernels repack them at every step (Base shape, batch 32, beam 4, 2 cores: 6.5 against
    2.5 ms a step for the six layers' key and value products, docs/performance.md)."""
    if not self.has_variable("cache", "cross_key") and encoded is None:
      raise ValueError("Cross-attention cache is empty: create it with the encoder output first.")
    projected = []

    def head_major(index):  # projects both (one matmul under fuse_qkv) on the first call
      if not projected:
        projected.extend(self._key_value(encoded))  # each [batch, src_len, heads, head_dim]
      keys = index == 0 and self.config.cross_keys_transposed
      return jnp.transpose(projected[index], (0, 2, 3, 1) if keys else (0, 2, 1, 3))

    # Initializers run only when the variable does not exist yet, i.e. once per sentence batch.
    key = self.variable("cache", "cross_key", lambda: head_major(0))
    value = self.variable("cache", "cross_value", lambda: head_major(1))
    return key.value, value.value


def sinusoidal_encoding(
  positions: jax.Array, d_model: int, layout: str = "sinusoidal"
) -> jax.Array:
  """Sinusoidal position encodings, in one of three published layouts.

  "sinusoidal" (the paper): PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same).
  "sinusoidal_halves" (Marian): the same sines in the first ceil(d/2) dims, cosines after them.
  "sinusoidal_fairseq" (fairseq, FSMT, M2M100): sines then cosines of pos * 10000^(-i/(d/2-1)),
  i < d/2, and a zero last dim when d is odd.

  Computed from the positions themselves, so packed rows (positions restart at each
  sentence) and decode steps need no table of maximum length.

  Args:
    positions: integer [batch, length].
  Returns:
    float32 [batch, length, d_model].
  """
  if layout == "sinusoidal_fairseq":
    half = d_model // 2
    inverse_frequency = np.exp(np.arange(half) * -(math.log(10000.0) / (half - 1)))
  else:
    two_i = np.arange(0, d_model, 2, dtype=np.float32)  # [ceil(d/2)]
    inverse_frequency = 1.0 / (10000.0 ** (two_i / d_model))
  inverse_frequency = jnp.asarray(inverse_frequency, jnp.float32)
  angles = positions[..., None].astype(jnp.float32) * inverse_frequency  # [b, l, ceil(d/2)]
  if layout == "sinusoidal":
    encoding = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [b, l, ceil(d/2), 2]
    return encoding.reshape(positions.shape + (-1,))[..., :d_model]
  sines, cosines = jnp.sin(angles), jnp.cos(angles)[..., : d_model // 2]
  if layout == "sinusoidal_fairseq" and d_model % 2:
    cosines = jnp.pad(cosines, [(0, 0)] * (cosines.ndim - 1) + [(0, 1)])
  return jnp.concatenate([sines, cosines], axis=-1)  # [b, l, d_model]

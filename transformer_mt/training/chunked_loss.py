"""The label-smoothed cross-entropy of `losses.cross_entropy_sums`, computed from the decoder's
final states and the output projection a chunk of target positions at a time, so that the
float32 logits [tokens, vocab] never exist whole (`train.loss_chunk_tokens` > 0).

Why: on the default path the output projection writes float32 logits [tokens, vocab] (3.6 GB
for Base at 24.6k target tokens) and keeps them for the backward pass, whose cotangent of
the same size, and take_along_axis's scatter into yet another, come on top; with the
activations of a Big step they are the largest buffers of the step. This is MaxText's
"vocabulary tiling": a custom VJP whose forward pass keeps, per token, only the logsumexp,
and whose backward pass recomputes each chunk's logits and turns them into their cotangent in
one elementwise pass (softmax minus the smoothed target distribution, in the compute dtype:
bfloat16 on accelerators), which the two matmuls of the chunk then consume:

  z = h W^T + b                                      [rows, c, V] float32, one chunk
  dz = g_loss (p - (1 - eps) onehot(y) - eps/V) + g_nll (p - onehot(y)),  p = exp(z - log Z)
  dh = dz W,   dW += dz^T h,   db += sum dz

Only one chunk's logits (and its dz) are live at a time; the forward and backward each scan
the chunks. The cost is the logits matmul once more in the backward pass (4 vocabulary-sized
matmuls per token instead of 3).

The chunks cut every row's positions, not the flattened tokens: each chunk holds the same
positions of all rows, so under data parallelism every device computes its own rows' share
of every chunk (a flat cut would put a chunk on one device's rows). `chunk_tokens` counts one
device's tokens, so a device's largest buffer is the same at any data-parallel degree: over
its rows / row_shards rows (the traced, global rows over the devices the batch is split over)
it asks for c = chunk_tokens // (rows / row_shards) positions a chunk. A row of `len`
positions is cut into n = ceil(len / c) chunks of ceil(len / n) positions (as even as they
come: 256 positions at c = 85 give 4 chunks of 64, not 4 of 85 with 84 wasted), the rows
padded at their end to n such chunks with positions whose outputs are cut off again.

A padded vocabulary (`TransformerConfig.vocab_pad_multiple`) is masked inside each chunk: the
padded ids are outside the softmax's normalizer and outside label smoothing's uniform mass
(eps is spread over the real ids only), and their rows get no gradient, so the loss is the
unpadded model's.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer_mt.runtime import errors


@dataclasses.dataclass(frozen=True)
class _Chunking:
  """The static settings of one loss (hashable: a custom_vjp's nondiff argument)."""

  label_smoothing: float
  vocab_size: int  # real ids; the weight may have more rows (a padded vocabulary)
  num_chunks: int
  positions: int  # target positions per chunk: num_chunks * positions >= the row length
  compute_dtype: Any  # of the logits matmuls and of dz


def check_chunk_tokens(value: object) -> int:
  """`train.loss_chunk_tokens`, checked: 0 (the full logits) or a positive token count."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise errors.BadValue(
      f"train.loss_chunk_tokens={value!r} must be 0 (the loss from the full float32 logits) or "
      "a number of target tokens per chunk (e.g. 8192)."
    )
  return value


def chunk_shape(chunk_tokens: int, rows: int, length: int) -> tuple[int, int]:
  """(chunks, positions per chunk) cutting rows of `length` positions into chunks of at most
  about `chunk_tokens` tokens over `rows` rows (one device's), as evenly as possible (module
  docstring)."""
  most = max(1, chunk_tokens // rows)
  num_chunks = -(-length // most)
  return num_chunks, -(-length // num_chunks)  # the last chunk may be partial


def cross_entropy_sums(
  hidden: jax.Array,
  weight: jax.Array,
  bias: jax.Array | None,
  targets: jax.Array,
  weights: jax.Array,
  *,
  label_smoothing: float,
  vocab_size: int,
  chunk_tokens: int,
  compute_dtype: Any,
  row_shards: int = 1,
) -> dict[str, jax.Array]:
  """`losses.cross_entropy_sums` of the logits `hidden W^T + bias` (cut to `vocab_size`),
  never materialized whole.

  Args:
    hidden: [batch, len, d_model], the decoder's final states (compute dtype).
    weight: [padded vocab, d_model], the output projection (the tied embedding), in the
      parameter dtype: its gradient is accumulated in float32 and returned in that dtype.
    bias: [padded vocab] float, or None.
    targets: int [batch, len], ids below `vocab_size`.
    weights: float [batch, len]; 0 at padding.
    label_smoothing: eps; the smoothed target puts eps / vocab_size on every real id.
    vocab_size: the real vocabulary: rows of `weight` from here on are padding.
    chunk_tokens: about this many target tokens per chunk on each device (over its rows).
    compute_dtype: dtype of the logits matmuls' inputs and of their cotangent.
    row_shards: the devices the rows are split over (`sharding.batch_shards()` of the step's
      mesh): each holds rows / row_shards of them.

  Returns:
    The sums of `losses.cross_entropy_sums`: loss, nll, correct, num_tokens.
  """
  if bias is None:
    bias = jnp.zeros(weight.shape[0], jnp.float32)
  rows, length = hidden.shape[:2]  # global rows: traced shapes are the whole batch's
  device_rows = max(1, rows // row_shards)
  chunking = _Chunking(
    float(label_smoothing),
    vocab_size,
    *chunk_shape(chunk_tokens, device_rows, length),
    compute_dtype,
  )
  token_loss, token_nll, correct = _token_losses(hidden, weight, bias, targets, chunking)
  return {
    "loss": jnp.sum(token_loss * weights),
    "nll": jnp.sum(token_nll * weights),
    "correct": jnp.sum(correct * weights),
    "num_tokens": jnp.sum(weights),
  }


def _to_chunks(x: jax.Array, chunking: _Chunking) -> jax.Array:
  """[batch, len, ...] -> [chunks, batch, chunk, ...]: the positions padded (with zeros) at
  the end of the rows to chunks x chunk, then cut."""
  length, num_chunks, chunk = x.shape[1], chunking.num_chunks, chunking.positions
  # lax.pad: a negative amount would crop, so the padded length is exactly num_chunks * chunk.
  x = jax.lax.pad(
    x,
    jnp.zeros((), x.dtype),
    [(0, 0, 0), (0, num_chunks * chunk - length, 0)] + [(0, 0, 0)] * (x.ndim - 2),
  )
  x = x.reshape((x.shape[0], num_chunks, chunk) + x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _from_chunks(x: jax.Array, length: int) -> jax.Array:
  """[chunks, batch, chunk, ...] -> [batch, length, ...]: `_to_chunks` undone, its padding cut."""
  x = jnp.moveaxis(x, 0, 1)
  x = x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])
  pad = [(0, 0, 0), (0, length - x.shape[1], 0)] + [(0, 0, 0)] * (x.ndim - 2)
  return jax.lax.pad(x, jnp.zeros((), x.dtype), pad)


def _chunk_logits(h, weight, bias, chunking: _Chunking):
  """float32 logits [batch, chunk, padded vocab] of one chunk, padded ids at -inf."""
  z = jnp.einsum("bcd,vd->bcv", h, weight, preferred_element_type=jnp.float32) + bias
  if weight.shape[0] > chunking.vocab_size:
    z = jnp.where(jnp.arange(weight.shape[0]) < chunking.vocab_size, z, -jnp.inf)
  return z


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _token_losses(hidden, weight, bias, targets, chunking: _Chunking):
  """Per-token (smoothed loss, nll, correct), each float32 [batch, len]."""
  return _forward(hidden, weight, bias, targets, chunking)[0]


def _forward(hidden, weight, bias, targets, chunking: _Chunking):
  eps, vocab = chunking.label_smoothing, chunking.vocab_size
  weight_c = weight.astype(chunking.compute_dtype)
  hidden_c = hidden.astype(chunking.compute_dtype)
  bias = bias.astype(jnp.float32)

  def chunk_stats(chunk):
    h, y = chunk  # [batch, c, d_model], [batch, c]
    z = _chunk_logits(h, weight_c, bias, chunking)  # [batch, c, padded vocab]
    log_z = jax.nn.logsumexp(z, axis=-1)  # [batch, c]
    target_logit = jnp.take_along_axis(z, y[..., None], axis=-1)[..., 0]
    # The smoothing term's mean logit, over the real ids only (padded ones are -inf).
    real = jnp.arange(z.shape[-1]) < vocab
    mean_logit = jnp.sum(jnp.where(real, z, 0.0), axis=-1) / vocab
    correct = (target_logit >= jnp.max(z, axis=-1)).astype(jnp.float32)
    return log_z, target_logit, mean_logit, correct

  length = hidden.shape[1]
  log_z, target_logit, mean_logit, correct = (
    _from_chunks(x, length)
    for x in jax.lax.map(
      chunk_stats, (_to_chunks(hidden_c, chunking), _to_chunks(targets, chunking))
    )
  )
  token_nll = log_z - target_logit
  token_loss = (1.0 - eps) * token_nll + eps * (log_z - mean_logit)
  return (token_loss, token_nll, correct), log_z


def _token_losses_forward(hidden, weight, bias, targets, chunking):
  outputs, log_z = _forward(hidden, weight, bias, targets, chunking)
  return outputs, (hidden, weight, bias, targets, log_z)


def _token_losses_backward(chunking: _Chunking, residuals, cotangents):
  hidden, weight, bias, targets, log_z = residuals
  g_loss, g_nll, _ = cotangents  # [batch, len] each; "correct" has no gradient
  eps, vocab, dtype = chunking.label_smoothing, chunking.vocab_size, chunking.compute_dtype
  weight_c = weight.astype(dtype)
  bias32 = bias.astype(jnp.float32)
  length = hidden.shape[1]
  # Per token: dz = a p - b onehot(y) - c [real id]
  g_loss, g_nll = g_loss.astype(jnp.float32), g_nll.astype(jnp.float32)
  coefficients = jnp.stack(
    [g_loss + g_nll, (1.0 - eps) * g_loss + g_nll, eps / vocab * g_loss, log_z], axis=-1
  )  # [batch, len, 4]

  def chunk_grads(carry, chunk):
    d_weight_t, d_bias = carry  # [d_model, padded vocab] float32, [padded vocab] float32
    h, y, coefficient = chunk  # [batch, c, d_model], [batch, c], [batch, c, 4]
    a, b, c, log_z = (coefficient[..., i : i + 1] for i in range(4))
    z = _chunk_logits(h, weight_c, bias32, chunking)  # [batch, c, padded vocab]
    ids = jnp.arange(z.shape[-1])
    p = jnp.exp(z - log_z)  # 0 at padded ids
    dz = a * p - b * (ids == y[..., None]) - c * (ids < vocab)  # [batch, c, padded vocab]
    d_bias = d_bias + jnp.sum(dz, axis=(0, 1))
    dz = dz.astype(dtype)
    d_h = jnp.einsum("bcv,vd->bcd", dz, weight_c, preferred_element_type=jnp.float32)
    # (h^T dz)^T, as tied_logits's backward: only h is transposed, never dz.
    d_weight_t = d_weight_t + jnp.einsum("bcd,bcv->dv", h, dz, preferred_element_type=jnp.float32)
    return (d_weight_t, d_bias), d_h.astype(hidden.dtype)

  zeros = (
    jnp.zeros((weight.shape[1], weight.shape[0]), jnp.float32),
    jnp.zeros(weight.shape[0], jnp.float32),
  )
  (d_weight_t, d_bias), d_hidden = jax.lax.scan(
    chunk_grads,
    zeros,
    (
      _to_chunks(hidden.astype(dtype), chunking),
      _to_chunks(targets, chunking),
      _to_chunks(coefficients, chunking),
    ),
  )
  d_targets = np.zeros(targets.shape, jax.dtypes.float0)
  return (
    _from_chunks(d_hidden, length),
    d_weight_t.T.astype(weight.dtype),
    d_bias.astype(bias.dtype),
    d_targets,
  )


_token_losses.defvjp(_token_losses_forward, _token_losses_backward)

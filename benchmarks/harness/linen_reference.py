"""The reference of benchmarks/train_step.py: a plain Flax Linen encoder-decoder and its train step,
written independently of transformer_mt's model, as a strong user would write it in the style of
google/flax examples/wmt. It lives apart from the runner so that what we are compared against can
be read (and reviewed for fairness) on its own; only `TransformerConfig` is shared, as a holder of
the dimensions, so that both models have the same shapes.

Like examples/wmt it is packing-aware: segment ids (when the batch has them) make block-diagonal
masks and positions index the sinusoid table per sentence, so on full rows it gets the very batch
ours gets.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer_mt.model.transformer_config import TransformerConfig


class ReferenceLayer(nn.Module):
  """Post-LN layer: self-attention, optional cross-attention, FFN; each with dropout + residual."""

  config: TransformerConfig
  cross: bool

  @nn.compact
  def __call__(self, x, self_mask, encoded=None, cross_mask=None, deterministic=False):
    cfg = self.config
    attention = functools.partial(
      nn.MultiHeadDotProductAttention,
      num_heads=cfg.num_heads,
      dropout_rate=cfg.attention_dropout_rate,
      deterministic=deterministic,
    )
    sublayer = lambda x, y: nn.LayerNorm(epsilon=1e-6)(  # noqa: E731
      x + nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)
    )
    x = sublayer(x, attention()(x, x, mask=self_mask))
    if self.cross:
      x = sublayer(x, attention()(x, encoded, mask=cross_mask))
    hidden = nn.relu(nn.Dense(cfg.d_ff)(x))
    return sublayer(x, nn.Dense(cfg.d_model)(hidden))


class ReferenceTransformer(nn.Module):
  """Encoder-decoder as examples/wmt builds it, packing-aware: segment ids (when given) make
  block-diagonal masks and positions (when given) index the sinusoid table per sentence."""

  config: TransformerConfig

  @nn.compact
  def __call__(
    self,
    inputs,
    targets_in,
    inputs_positions=None,
    targets_positions=None,
    inputs_segment_ids=None,
    targets_segment_ids=None,
    deterministic=False,
  ):
    cfg = self.config
    embed = nn.Embed(
      cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(stddev=cfg.d_model**-0.5)
    )
    position = np.arange(max(inputs.shape[1], targets_in.shape[1]))[:, None]
    angle = position / 10000 ** (np.arange(0, cfg.d_model, 2) / cfg.d_model)
    table = jnp.asarray(
      np.stack([np.sin(angle), np.cos(angle)], -1).reshape(len(position), cfg.d_model), jnp.float32
    )

    def embed_tokens(tokens, positions):
      # [batch, len, d_model]
      pe = table[None, : tokens.shape[1]] if positions is None else table[positions]
      x = embed(tokens) * np.sqrt(cfg.d_model) + pe
      return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)

    def mask(query_ids, key_ids, query_segments, key_segments):
      padding = nn.make_attention_mask(query_ids > 0, key_ids > 0)
      if query_segments is None:
        return padding
      return nn.combine_masks(
        padding, nn.make_attention_mask(query_segments, key_segments, jnp.equal)
      )

    source_mask = mask(inputs, inputs, inputs_segment_ids, inputs_segment_ids)
    x = embed_tokens(inputs, inputs_positions)
    for _ in range(cfg.num_encoder_layers):
      x = ReferenceLayer(cfg, cross=False)(x, source_mask, deterministic=deterministic)
    self_mask = nn.combine_masks(
      mask(targets_in, targets_in, targets_segment_ids, targets_segment_ids),
      nn.make_causal_mask(targets_in),
    )
    cross_mask = mask(targets_in, inputs, targets_segment_ids, inputs_segment_ids)
    y = embed_tokens(targets_in, targets_positions)
    for _ in range(cfg.num_decoder_layers):
      y = ReferenceLayer(cfg, cross=True)(y, self_mask, x, cross_mask, deterministic=deterministic)
    return embed.attend(y)  # [batch, tgt_len, vocab]


PACKING_KEYS = (
  "inputs_positions",
  "targets_positions",
  "inputs_segment_ids",
  "targets_segment_ids",
)


def reference_train_step(model, tx, label_smoothing):
  """Adam on the label-smoothed cross-entropy averaged over non-pad target tokens, jitted with
  the state donated; packing fields are passed through when the batch has them."""

  def loss_fn(params, batch, key):
    packing = {k: batch[k] for k in PACKING_KEYS if k in batch}
    logits = model.apply(
      {"params": params},
      batch["inputs"],
      batch["targets_in"],
      **packing,
      rngs={"dropout": key},
    )
    vocab = logits.shape[-1]
    soft = optax.smooth_labels(jax.nn.one_hot(batch["targets"], vocab), label_smoothing)
    weights = (batch["targets"] > 0).astype(jnp.float32)
    loss = optax.softmax_cross_entropy(logits, soft)
    return jnp.sum(loss * weights) / jnp.sum(weights)

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state, batch):
    params, opt_state, count = state
    key = jax.random.fold_in(jax.random.key(0), count)
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, count + 1), loss

  return step

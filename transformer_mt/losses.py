"""Label-smoothed cross-entropy and token accuracy, summed over non-pad target tokens.

The step divides by the number of non-pad target tokens of the whole (possibly
accumulated) batch, so gradient accumulation gives exactly the large-batch gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def smoothed_targets(targets: jax.Array, vocab_size: int, label_smoothing: float) -> jax.Array:
  """q(k) = (1 - eps) 1[k = y] + eps / |V|, as float32 [batch, len, vocab]."""
  one_hot = jax.nn.one_hot(targets, vocab_size, dtype=jnp.float32)
  return (1.0 - label_smoothing) * one_hot + label_smoothing / vocab_size


def cross_entropy_sums(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                       label_smoothing: float = 0.0) -> dict[str, jax.Array]:
  """Summed losses of one (micro-)batch; divide by `num_tokens` to get means.

  Args:
    logits: float [batch, len, vocab].
    targets: int [batch, len].
    weights: float [batch, len]; 0 at padding.
    label_smoothing: epsilon of the smoothed target distribution.

  Returns:
    loss: sum of -sum_k q(k) log p(k) (what is optimized).
    nll: sum of -log p(y) (the unsmoothed negative log-likelihood, for perplexity).
    correct: number of tokens whose argmax equals the target.
    num_tokens: sum of weights.
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  q = smoothed_targets(targets, logits.shape[-1], label_smoothing)
  token_loss = -jnp.sum(q * log_probs, axis=-1)  # [batch, len]
  token_nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {
      "loss": jnp.sum(token_loss * weights),
      "nll": jnp.sum(token_nll * weights),
      "correct": jnp.sum(correct * weights),
      "num_tokens": jnp.sum(weights),
  }

"""Sampling translations (back-translation): temperature, top-k and top-p over each step's
next-token distribution, reproducible for a seed whatever the batching or the devices.

Back-translation with sampled rather than beam outputs gives more diverse synthetic
sources and better models (Edunov et al., 2018, "Understanding Back-Translation at
Scale"), so the defaults sample the model's distribution unrestricted (temperature 1, no
top-k, no top-p).

* Filtering follows transformers' `generate(do_sample=True)`: the ids the model must never
  generate and the forced first token (decode.never_generated, decode.force_first_token)
  first, then `TemperatureLogitsWarper` (logits / T), `TopKLogitsWarper` (keep the k
  largest; ties with the k-th are kept) and `TopPLogitsWarper` (keep the most probable
  tokens until their mass reaches p, the token that crosses p included), in that order.
  The token is drawn from the softmax of what is left (`jax.random.categorical`).
* Randomness. Row r of a batch translates input line `line_ids[r]` as its sample
  `sample_ids[r]`; its key is fold_in(fold_in(key(seed), line), sample), and step t draws
  with fold_in(that key, t). A draw therefore depends only on (seed, line, sample, step)
  and the logits, never on the row's batch position, the batch size or the device that
  holds it: the same seed gives the same samples on 1 and 8 devices.
* Length. Each row stops at EOS or at its own maximum length (source length + 50, capped),
  the rule of greedy decoding and beam search (`decode.decode_loop`), without EOS there.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import incremental as decode
from transformer_mt.runtime import errors

# Seeds are folded into a threefry key as uint32.
MAX_SEED = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """How each step's distribution is reshaped before a token is drawn (hashable: a static
  argument of the jitted decoder, so each setting compiles once)."""

  # Logits are divided by it: < 1 sharpens the distribution, > 1 flattens it.
  temperature: float = 1.0
  # Keep only the k most probable tokens; 0 keeps all.
  top_k: int = 0
  # Keep the most probable tokens whose mass reaches p (nucleus sampling); 1.0 keeps all.
  top_p: float = 1.0

  def check(self) -> SamplingSettings:
    """Returns self; raises ValueError naming the flag for a value sampling cannot use."""
    if not self.temperature > 0 or self.temperature == float("inf"):
      raise errors.BadValue(
        f"--temperature {self.temperature}: must be a positive number "
        "(1 samples the model's distribution; for argmax decoding drop --sample)."
      )
    if self.top_k < 0:
      raise errors.BadValue(f"--top_k {self.top_k}: must be >= 0 (0 keeps every token).")
    if not 0 < self.top_p <= 1:
      raise errors.BadValue(f"--top_p {self.top_p}: must be in (0, 1] (1 keeps every token).")
    return self


def check_seed(seed: int) -> int:
  if not 0 <= seed <= MAX_SEED:
    raise errors.BadValue(f"--seed {seed}: must be an integer in [0, {MAX_SEED}].")
  return seed


def warp_logits(logits: jax.Array, settings: SamplingSettings) -> jax.Array:
  """float32 [rows, vocab]: `logits` / temperature, -inf outside the top-k and the top-p set.

  The order and the boundary rules are transformers' (module docstring); tokens already at
  -inf (never generated, not the forced first token) stay there.
  """
  logits = logits.astype(jnp.float32) / settings.temperature
  vocab = logits.shape[-1]
  if 0 < settings.top_k < vocab:
    kth = jax.lax.top_k(logits, settings.top_k)[0][..., -1:]  # [rows, 1]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if settings.top_p < 1.0:
    # As TopPLogitsWarper: in ascending order, drop the tokens whose cumulative probability
    # is <= 1 - p (the least probable ones, which together hold at most 1 - p); the most
    # probable token always stays.
    ascending = jnp.sort(logits, axis=-1)  # [rows, vocab]
    cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
    dropped = cumulative <= 1.0 - settings.top_p
    dropped = dropped.at[..., -1].set(False)
    # The least probable kept logit; ties with it are kept too (no sort order decides).
    first_kept = jnp.argmin(dropped, axis=-1)  # [rows]: the first False
    cutoff = jnp.take_along_axis(ascending, first_kept[:, None], axis=-1)  # [rows, 1]
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return logits


def row_keys(seed: jax.Array, line_ids: jax.Array, sample_ids: jax.Array) -> jax.Array:
  """Keys [rows]: fold_in(fold_in(key(seed), line_ids[r]), sample_ids[r]) for each row r."""
  base = jax.random.key(jnp.asarray(seed, jnp.uint32))

  def key_of(line, sample):
    return jax.random.fold_in(jax.random.fold_in(base, line), sample)

  return jax.vmap(key_of)(line_ids, sample_ids)


def sample(
  tokens_to_logits: decode.TokensToLogits,
  initial_cache: Any,
  keys: jax.Array,
  settings: SamplingSettings,
  max_len: int,
  max_lengths: jax.Array | None = None,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  pad_id: int = PAD_ID,
) -> jax.Array:
  """One sampled sequence per row over any step function: int32 [batch, max_len], EOS then
  PAD. Call it inside `jax.jit`.

  Args:
    tokens_to_logits: as in `decode.decode_loop` (ids never to generate already -inf).
    keys: [batch] PRNG keys, one per row (`row_keys`); step t draws with fold_in(key, t).
    max_lengths: optional int [batch], each row's maximum number of tokens.
  """

  def choose(logits: jax.Array, position: jax.Array) -> jax.Array:
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, position)  # [batch]
    return jax.vmap(jax.random.categorical)(step_keys, warp_logits(logits, settings))

  return decode.decode_loop(
    tokens_to_logits,
    initial_cache,
    choose,
    batch_size=keys.shape[0],
    max_len=max_len,
    max_lengths=max_lengths,
    eos_id=eos_id,
    bos_id=bos_id,
    pad_id=pad_id,
  )


@functools.partial(jax.jit, static_argnames=("config", "max_len", "settings", "forced_first_id"))
def sample_decode(
  params: Any,
  inputs: jax.Array,
  seed: jax.Array,
  line_ids: jax.Array,
  sample_ids: jax.Array,
  config: decode.ModelConfig,
  max_len: int,
  settings: SamplingSettings = SamplingSettings(),
  max_lengths: jax.Array | None = None,
  forced_first_id: int | None = None,
) -> jax.Array:
  """Samples a translation of each row of `inputs` int [batch, src_len]: int32 [batch, max_len].

  Args:
    seed: uint32 [], the same for the whole run.
    line_ids, sample_ids: int [batch], the input line and the sample index each row is;
      with `seed` they alone decide the row's draws (module docstring).
    max_lengths: optional int [batch] (source length + 50); empty rows get all PAD.
    forced_first_id: the first token of every row (a target language code), or None.

  An ensemble (`decode`'s module docstring) samples from the normalised mean of its members'
  log-probabilities (their renormalised geometric mean), warped like logits.
  """
  ids = decode.lead_config(config)
  inputs_valid = inputs != ids.pad_id  # [batch, src_len]
  return sample(
    decode.model_step(params, inputs_valid, config, forced_first_id),
    decode.init_cache(params, inputs, config, max_len),
    row_keys(seed, line_ids, sample_ids),
    settings,
    max_len,
    decode.source_max_lengths(inputs, max_lengths, ids.pad_id),
    eos_id=ids.eos_id,
    bos_id=ids.decoder_start_id,
    pad_id=ids.pad_id,
  )


def samples_tsv(samples: Sequence[Sequence[str]]) -> str:
  """`line_index<TAB>sample<TAB>text` lines, both indices from 0, in input order: one group of
  N lines per input line, empty input lines included (with empty texts). Tabs and line
  breaks inside a text are written as spaces so that every record stays one line."""
  rows = []
  for index, texts in enumerate(samples):
    for number, text in enumerate(texts):
      text = " ".join(text.replace("\t", " ").splitlines())
      rows.append(f"{index}\t{number}\t{text}\n")
  return "".join(rows)

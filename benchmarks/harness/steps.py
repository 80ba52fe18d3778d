"""Our train step as a benchmark times it, written once: the model shapes, the batches, the
useful-FLOP count and `TrainStepBench` (setup, state, ahead-of-time compile, timed calls).

`TrainStepBench` builds the step as `run.py train` does (training_setup, a sharded state on a
1-device mesh, Adam, label smoothing 0.1, dropout 0.1, the state donated). The state is made
once and carried across calls; each batch shape is compiled once, ahead of time, so the
program timed is the one whose memory XLA reports (`memory_analysis()`).

Useful FLOPs per step (`useful_flops`), counted over real (non-pad) tokens only:
  6 x P_enc x S                                     encoder layers
  + 6 x (P_dec - P_xkv) x T + 6 x P_xkv x S         decoder layers; cross-attention keys and
                                                    values (P_xkv) are projected per source token
  + 6 x d_model x V x T                             output projection onto the vocabulary
  + 12 x d_attn x (L_enc x sum s_i^2 + L_dec x sum (t_i^2 + t_i s_i))   attention scores and
                                                    weighted values (forward 4 x, backward 8 x)
P_* are parameter counts of our model (biases and LayerNorm included, embeddings excluded),
S / T the real source / target tokens, s_i / t_i one sentence's lengths, d_attn =
heads x head_dim, V the vocabulary. Causal self-attention is counted in full (t_i^2), as in
the PaLM MFU convention. Packed rows compute attention across the whole row; that extra work
is not counted as useful.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import jax
import ml_collections
import numpy as np
from flax import linen as nn

from benchmarks.harness import timing
from transformer_mt.config import defaults
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID
from transformer_mt.model.transformer import parameter_shapes
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import sharding
from transformer_mt.training import train_step
from transformer_mt.training.setup import training_setup

# Dense bf16 peaks (no sparsity), FLOP/s, from the vendors' datasheets; matched by substring of
# `device_kind`, first match wins (so "H100 PCIe" before "H100").
PEAK_BF16 = (
  ("H100 PCIe", 756e12),
  ("H100", 989e12),  # SXM
  ("H200", 989e12),
  ("GH200", 989e12),
  ("A100", 312e12),
  ("L40S", 362e12),
  ("L4", 121e12),
  ("A10", 125e12),
  ("TPU v6", 918e12),
  ("TPU v5p", 459e12),
  ("TPU v5", 197e12),  # v5e ("TPU v5 lite")
  ("TPU v4", 275e12),
)
SIZES = {
  # name: (d_model, d_ff, heads, layers, vocabulary, rows, max_len)
  "Base": (512, 2048, 8, 6, 37_000, 96, 256),
  "Big": (1024, 4096, 16, 6, 37_000, 48, 256),
}
# --tiny: the same programs at the smallest shapes that still have every part (CI, on CPU).
# Big is Base's shape there, so that one compiled step serves both (`TrainStepBench`).
TINY = {
  "Base": (32, 64, 2, 1, 256, 4, 16),
  "Big": (32, 64, 2, 1, 256, 4, 16),
}
# Compiled train steps of this process, by what the program depends on (TrainStepBench.compiled):
# a script that times one configuration in several sections compiles it once.
_COMPILED = {}


def peak_of(device_kind: str) -> float | None:
  """The published dense bf16 peak of a device kind, FLOP/s; None if not in PEAK_BF16."""
  for name, peak in PEAK_BF16:
    if name.lower() in device_kind.lower():
      return peak
  return None


def model_config(size, dtype: str = "float32", attention_implementation="auto"):
  """The TransformerConfig of a SIZES / TINY tuple."""
  d_model, d_ff, heads, layers, vocab, _, _ = size
  return TransformerConfig(
    attention_implementation=attention_implementation,
    vocab_size=vocab,
    d_model=d_model,
    d_ff=d_ff,
    num_heads=heads,
    num_encoder_layers=layers,
    num_decoder_layers=layers,
    dtype=dtype,
  )


def one_device_mesh():
  return sharding.make_mesh(
    ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1}), devices=jax.devices()[:1]
  )


# ---------------------------------------------------------------------------------------------
# Batches [1, rows, max_len] in the packed layout the training pipeline gives the step
# ---------------------------------------------------------------------------------------------


def full_rows_batch(rows: int, max_len: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
  """One sentence pair per row filling every slot (segment ids all 1, positions
  0..max_len-1, targets_in = BOS + targets[:-1]): no padding, no packing."""
  rng = np.random.default_rng(seed)
  shape = (1, rows, max_len)
  targets = rng.integers(4, vocab, size=shape).astype(np.int32)
  targets_in = np.concatenate([np.full((*shape[:2], 1), BOS_ID, np.int32), targets[..., :-1]], -1)
  ones = np.ones(shape, np.int32)
  positions = np.broadcast_to(np.arange(max_len, dtype=np.int32), shape).copy()
  return {
    "inputs": rng.integers(4, vocab, size=shape).astype(np.int32),
    "targets": targets,
    "targets_in": targets_in,
    "inputs_segment_ids": ones,
    "targets_segment_ids": ones.copy(),
    "inputs_positions": positions,
    "targets_positions": positions.copy(),
  }


def packed_rows_batch(rows: int, max_len: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
  """Packed like the training pipeline's rows: per row, sentence pairs of random lengths (2 to
  max_len / 4 tokens a side, sources and targets of different lengths) until the next would
  not fit, then trailing padding; segment ids 1, 2, ..., positions restarting per sentence,
  targets_in shifted right within each sentence."""
  rng = np.random.default_rng(seed)
  shape = (1, rows, max_len)
  batch = {name: np.zeros(shape, np.int32) for name in ("inputs", "targets", "targets_in")}
  for side in ("inputs", "targets"):
    batch[f"{side}_segment_ids"] = np.zeros(shape, np.int32)
    batch[f"{side}_positions"] = np.zeros(shape, np.int32)
  longest = max(2, max_len // 4)
  for row in range(rows):
    used = {"inputs": 0, "targets": 0}
    segment = 0
    while True:
      lengths = {side: int(rng.integers(2, longest + 1)) for side in used}
      if any(used[side] + lengths[side] > max_len for side in used):
        break
      segment += 1
      for side, n in lengths.items():
        where = slice(used[side], used[side] + n)
        batch[side][0, row, where] = rng.integers(4, vocab, size=n)
        batch[f"{side}_segment_ids"][0, row, where] = segment
        batch[f"{side}_positions"][0, row, where] = np.arange(n)
        if side == "targets":
          batch["targets_in"][0, row, where] = np.concatenate(
            [[BOS_ID], batch[side][0, row, where][:-1]]
          )
        used[side] += n
  for side in ("inputs", "targets", "targets_in"):
    segments = batch["inputs_segment_ids" if side == "inputs" else "targets_segment_ids"]
    batch[side] = np.where(segments > 0, batch[side], PAD_ID).astype(np.int32)
  return batch


# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------


def parameter_groups(config: TransformerConfig) -> dict[str, int]:
  """Non-embedding parameter counts: encoder layers, decoder layers, cross-attention K/V."""
  counts = {"encoder": 0, "decoder": 0, "cross_kv": 0}
  for path, leaf in jax.tree_util.tree_flatten_with_path(parameter_shapes(config))[0]:
    names = [p.key for p in path]
    size = math.prod(leaf.shape)
    if names[0].startswith("encoder_layers"):
      counts["encoder"] += size
    elif names[0].startswith("decoder_layers"):
      counts["decoder"] += size
      if names[1] == "cross_attention" and names[2] in ("key", "value"):
        counts["cross_kv"] += size
  return counts


def useful_flops(
  config: TransformerConfig, source_lengths: np.ndarray, target_lengths: np.ndarray
) -> dict[str, float]:
  """The module docstring's formula, term by term, for one step over these sentences."""
  p = parameter_groups(config)
  s, t = source_lengths.astype(np.float64), target_lengths.astype(np.float64)
  d_attn = config.num_heads * config.per_head_dim
  terms = {
    "encoder": 6.0 * p["encoder"] * s.sum(),
    "decoder": 6.0 * (p["decoder"] - p["cross_kv"]) * t.sum() + 6.0 * p["cross_kv"] * s.sum(),
    "vocab_projection": 6.0 * config.d_model * config.output_vocab_size * t.sum(),
    "attention": 12.0
    * d_attn
    * (
      config.num_encoder_layers * np.sum(s * s) + config.num_decoder_layers * np.sum(t * t + t * s)
    ),
  }
  terms["total"] = sum(terms.values())
  return terms


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------


def peak_bytes(stats) -> int:
  """XLA's peak of a compiled program: arguments + outputs - aliased (donated buffers
  reused) + temporaries."""
  return (
    stats.argument_size_in_bytes
    + stats.output_size_in_bytes
    - stats.alias_size_in_bytes
    + stats.temp_size_in_bytes
  )


def compile_train_step(setup, mesh, batch, label_smoothing: float, loss_chunk_tokens: int = 0):
  """One train step compiled ahead of time as train_step.jit_train_step compiles it (sharded
  in/out, the state donated); `batch` may be abstract (ShapeDtypeStruct). Its
  `memory_analysis()` is the program's own figure, where a backend's `peak_bytes_in_use` is
  the whole process's peak so far. `loss_chunk_tokens`: train.loss_chunk_tokens (0: the loss
  from the full logits)."""
  step = functools.partial(
    train_step.train_step,
    model=setup.model,
    tx=setup.tx,
    schedule=setup.schedule,
    label_smoothing=label_smoothing,
    loss_chunk_tokens=loss_chunk_tokens,
    # The dropout key's PRNG the setup's state was made for (train.prng_impl).
    prng_impl=setup.prng_impl,
  )
  jitted = jax.jit(
    step,
    in_shardings=(setup.state_shardings, sharding.batch_sharding(mesh, 3, batch_dim=1)),
    out_shardings=(setup.state_shardings, sharding.replicated(mesh)),
    donate_argnums=0,
  )
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
    return jitted.lower(setup.abstract_state, batch).compile()


class TrainStepBench:
  """Our train step on one device, ready to time: `time(batch)` compiles the batch's shape once
  and times steps that carry the state (seed 0's at the start) from call to call.

  `train_changes` update config.train (e.g. {"prng_impl": "unsafe_rbg"}); the model is
  `config` itself, not an experiment's."""

  def __init__(
    self,
    config: TransformerConfig,
    train_changes: Mapping | None = None,
    label_smoothing: float = 0.1,
  ):
    self.mesh = one_device_mesh()
    base = defaults.base_config()
    base.train.update(dict(train_changes or {}))
    self.setup = training_setup(base, None, self.mesh, model_config=config)
    self.key = (config, base.train.to_json(sort_keys=True), label_smoothing)
    self.label_smoothing = label_smoothing
    self.loss_chunk_tokens = base.train.loss_chunk_tokens
    self.state = train_step.create_sharded_state(
      0,
      self.setup.model,
      self.setup.tx,
      self.mesh,
      self.setup.prng_impl,
      shardings=self.setup.state_shardings,  # the setup's trace, not a second one
    )

  def put(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """A [1, rows, len] host batch on the mesh."""
    return sharding.global_batch_from_local(batch, self.mesh, batch_dim=1)

  def compiled(self, device_batch):
    """The compiled step for this batch's shapes: compiled on first use in this process, by
    any bench of the same model, train config and label smoothing."""
    shapes = tuple(sorted((name, value.shape, value.dtype) for name, value in device_batch.items()))
    key = (*self.key, shapes)
    if key not in _COMPILED:
      _COMPILED[key] = compile_train_step(
        self.setup, self.mesh, device_batch, self.label_smoothing, self.loss_chunk_tokens
      )
    return _COMPILED[key]

  def step(self, device_batch) -> dict[str, jax.Array]:
    """One step; the state moves on. Returns the step's metrics (loss, grad_norm, ...)."""
    compiled = self.compiled(device_batch)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
      self.state, metrics = compiled(self.state, device_batch)
    return metrics

  def time(self, batch, warmup: int = 1, reps: int = 3) -> timing.Timing:
    """Timing of `reps` steps on `batch` after `warmup` untimed ones (compilation apart)."""
    device_batch = self.put(batch)
    self.compiled(device_batch)
    return timing.time_calls(lambda: self.step(device_batch), warmup=warmup, reps=reps)

  def memory(self, batch) -> int:
    """XLA's peak bytes for the compiled step of this batch's shape."""
    return peak_bytes(self.compiled(self.put(batch)).memory_analysis())

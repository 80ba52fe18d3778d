"""Tokenized sentence pairs -> fixed-shape training batches through Grain.

The Grain iterator is deterministic for a seed and its state (a small dict) goes
into every checkpoint, so a resumed run sees exactly the batches an uninterrupted
run would. Batches are padded to a fixed length so the train step compiles once.
"""

from __future__ import annotations

import logging
from typing import Sequence

import grain
import numpy as np

from transformer_mt.tokenizer import BOS_ID, PAD_ID


def tokenize_pairs(tokenizer, pairs: Sequence[tuple[str, str]], max_len: int
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
  """Encodes pairs, dropping (and counting) empty pairs and pairs longer than `max_len`."""
  sources = tokenizer.encode([s for s, _ in pairs])
  targets = tokenizer.encode([t for _, t in pairs])
  kept, empty, too_long = [], 0, 0
  for (src_text, tgt_text), src, tgt in zip(pairs, sources, targets):
    if not src_text.strip() or not tgt_text.strip():
      empty += 1
    elif len(src) > max_len or len(tgt) > max_len:
      too_long += 1
    else:
      kept.append((np.asarray(src, np.int32), np.asarray(tgt, np.int32)))
  if empty or too_long:
    logging.info("Dropped %d empty pairs and %d pairs longer than %d tokens; kept %d.",
                 empty, too_long, max_len, len(kept))
  if not kept:
    raise ValueError(f"No training pairs left after filtering ({empty} empty, {too_long} longer "
                     f"than data.max_len={max_len}).")
  return kept


def pad_pairs(examples: Sequence[tuple[np.ndarray, np.ndarray]], length: int
              ) -> dict[str, np.ndarray]:
  """Stacks pairs into [batch, length] arrays: inputs, targets_in (BOS-shifted) and targets."""
  batch = len(examples)
  inputs = np.full((batch, length), PAD_ID, np.int32)
  targets = np.full((batch, length), PAD_ID, np.int32)
  targets_in = np.full((batch, length), PAD_ID, np.int32)
  for row, (src, tgt) in enumerate(examples):
    inputs[row, :len(src)] = src
    targets[row, :len(tgt)] = tgt
    targets_in[row, 0] = BOS_ID
    targets_in[row, 1:len(tgt)] = tgt[:-1]
  return {"inputs": inputs, "targets_in": targets_in, "targets": targets}


def training_batches(examples: Sequence[tuple[np.ndarray, np.ndarray]], batch_size: int,
                     grad_accum_steps: int, length: int, seed: int,
                     process_index: int = 0, process_count: int = 1):
  """An endless, reshuffled-every-epoch Grain iterator of [accum, micro, length] batches.

  `batch_size` is global; each process yields its own `batch_size / process_count`
  rows, read from its own shard of the examples.
  """
  if batch_size % (grad_accum_steps * process_count):
    raise ValueError(f"train.batch_size={batch_size} must be divisible by grad_accum_steps="
                     f"{grad_accum_steps} x processes={process_count}")
  local_batch = batch_size // process_count
  micro = local_batch // grad_accum_steps

  def to_batch(rows):
    arrays = pad_pairs(rows, length)
    return {k: v.reshape(grad_accum_steps, micro, length) for k, v in arrays.items()}

  dataset = (grain.MapDataset.source(list(examples))[process_index::process_count]
             .shuffle(seed=seed)
             .repeat(None)
             .batch(local_batch, drop_remainder=True, batch_fn=to_batch))
  return iter(dataset.to_iter_dataset())

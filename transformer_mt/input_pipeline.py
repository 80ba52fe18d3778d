"""Tokenized sentence pairs -> packed, fixed-shape training batches through Grain.

The Grain iterator is deterministic for a seed and its state (a small dict) goes
into every checkpoint, so a resumed run sees exactly the batches an uninterrupted
run would. Rows have a fixed length so the train step compiles once; packing
several sentences per row keeps padding (wasted compute) low.
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


def shift_right_per_segment(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Adds `targets_in`: each packed target shifted right within its own sentence, BOS first."""
  targets = packed["targets"]
  targets_in = np.roll(targets, 1, axis=-1)
  targets_in[packed["targets_positions"] == 0] = BOS_ID
  targets_in[packed["targets_segment_ids"] == 0] = PAD_ID
  return dict(packed, targets_in=targets_in)


def training_batches(examples: Sequence[tuple[np.ndarray, np.ndarray]], batch_size: int,
                     grad_accum_steps: int, length: int, seed: int,
                     process_index: int = 0, process_count: int = 1):
  """An endless, reshuffled-every-epoch Grain iterator of packed training batches.

  Sentence pairs are packed first-fit into rows of `length` tokens (source and target
  each), with segment ids (1, 2, ... per sentence, 0 at padding) and positions that
  restart at every sentence; the model never attends across sentences. Each batch is a
  dict of [grad_accum_steps, micro_batch, length] arrays. `batch_size` counts packed
  rows over all processes; each process packs its own shard of the examples.
  """
  if batch_size % (grad_accum_steps * process_count):
    raise ValueError(f"train.batch_size={batch_size} must be divisible by grad_accum_steps="
                     f"{grad_accum_steps} x processes={process_count}")
  local_batch = batch_size // process_count
  micro = local_batch // grad_accum_steps
  records = [{"inputs": src, "targets": tgt} for src, tgt in examples]
  dataset = (grain.MapDataset.source(records)[process_index::process_count]
             .shuffle(seed=seed)
             .repeat(None)
             .to_iter_dataset())
  dataset = grain.experimental.FirstFitPackIterDataset(
      dataset, length_struct={"inputs": length, "targets": length},
      num_packing_bins=local_batch, seed=seed, shuffle_bins=True)
  dataset = (dataset.map(shift_right_per_segment)
             .batch(local_batch, drop_remainder=True)
             .map(lambda batch: {k: v.reshape(grad_accum_steps, micro, length)
                                 for k, v in batch.items()}))
  return iter(dataset)

"""Sentence pairs -> tokenized, packed, fixed-shape training batches through Grain.

Training: pairs are shuffled (reshuffled every epoch), tokenized lazily, filtered
(empty or longer than `max_len` tokens; both counted), packed first-fit into rows
of `max_len` tokens with segment ids and per-sentence positions, and batched as
[grad_accum_steps, micro_batch, max_len]. The Grain iterator is deterministic for a
seed and its state (a small dict) goes into every checkpoint, so a resumed run sees
exactly the batches an uninterrupted run would.

With `data.num_workers` N > 0 all of that runs in N Grain worker processes
(`IterDataset.mp_prefetch`) and the training process only receives finished batches. N = 1
yields exactly the batches of N = 0 (one worker runs the same pipeline). With N >= 2 each
worker reads every N-th pair of the shuffled stream and packs its own rows, and the batches
are taken from the workers in turn: deterministic for a seed and N, resumed exactly, but a
different stream from N = 0 or 1 (first-fit packing is sequential: which pairs share a row
depends on which pairs one packer sees). A checkpoint therefore resumes only with the
number of workers that wrote it.

Evaluation: padded, length-bucketed batches in corpus order; nothing is packed and
nothing is dropped.

Padding and the decoder's first input are the model's `pad_id` and `decoder_start_id`
(ours: tokenizer.py's PAD_ID and BOS_ID; an imported Marian model: its pad id for both),
so a model fine-tuned from an import (`init.from`) sees the ids it was trained with.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence

import grain
import numpy as np
from absl import flags

from transformer_mt.data import corpus_fingerprint
from transformer_mt.data import tokenizer as tokenizers
from transformer_mt.data.batch_stream import FilterCounts, TrainingBatches
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID, AnyTokenizer
from transformer_mt.runtime import errors


def _with_stream_index(index: int, example: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Grain map_with_index: tags a tokenized pair with its position in this process's shuffled
  stream (`KeepPair` logs it; packing drops the tag)."""
  return dict(example, stream_index=np.int64(index))


class TokenizePair:
  """(source, target) text -> {"inputs", "targets"} id arrays, EOS-terminated.

  The source is cut by `encode`, the target by `encode_targets` (an imported model may cut
  the two sides differently: Marian's two SentencePiece models, FSMT's two vocabularies,
  mBART/NLLB's language tags). Pickles as the tokenizer's files and languages, so it travels
  into Grain worker processes (SentencePiece processors do not pickle).
  """

  def __init__(self, tokenizer: AnyTokenizer):
    self._tokenizer = tokenizer

  def __getstate__(self):
    languages = None
    if tokenizers.has_language_tags(self._tokenizer):
      languages = (self._tokenizer.source_lang, self._tokenizer.target_lang)
    return {"files": tokenizers.to_files(self._tokenizer), "languages": languages}

  def __setstate__(self, state):
    self._tokenizer = tokenizers.from_files(state["files"])
    if state["languages"] is not None:
      self._tokenizer = self._tokenizer.with_languages(*state["languages"])

  def __call__(self, pair: tuple[str, str]) -> dict[str, np.ndarray]:
    source, target = pair[0].strip(), pair[1].strip()
    eos = [self._tokenizer.eos_id]
    # An empty side is the EOS alone (which KeepPair drops), whatever tags the model adds.
    source_ids = self._tokenizer.encode([source])[0] if source else eos
    target_ids = self._tokenizer.encode_targets([target])[0] if target else eos
    return {"inputs": np.asarray(source_ids, np.int32), "targets": np.asarray(target_ids, np.int32)}


class KeepPair:
  """Grain filter: drops pairs with an empty side or a side over `max_len` tokens."""

  def __init__(self, max_len: int, counts: FilterCounts):
    self.max_len = max_len
    self.counts = counts

  def __call__(self, example: dict[str, np.ndarray]) -> bool:
    # Length 1 is the EOS alone: the line was empty or whitespace.
    empty = len(example["inputs"]) <= 1 or len(example["targets"]) <= 1
    too_long = not empty and max(len(example["inputs"]), len(example["targets"])) > self.max_len
    index = example.get("stream_index")
    self.counts.count(empty, too_long, None if index is None else int(index))
    return not (empty or too_long)


def shift_right_per_segment(
  packed: dict[str, np.ndarray], pad_id: int = PAD_ID, start_id: int = BOS_ID
) -> dict[str, np.ndarray]:
  """Adds `targets_in`: each packed target shifted right within its own sentence, `start_id`
  (BOS) first; every padding slot (segment 0, which the packer fills with 0) becomes `pad_id`."""
  packed = dict(packed)
  for name in ("inputs", "targets"):
    packed[name] = np.where(packed[f"{name}_segment_ids"] == 0, pad_id, packed[name])
  targets = packed["targets"]
  targets_in = np.roll(targets, 1, axis=-1)
  targets_in[packed["targets_positions"] == 0] = start_id
  targets_in[packed["targets_segment_ids"] == 0] = pad_id
  return dict(packed, targets_in=targets_in)


def rows_per_batch(
  batch_tokens: int, max_len: int, grad_accum_steps: int, process_count: int, batch_shards: int = 1
) -> int:
  """Packed rows per update for a budget of `batch_tokens` target tokens (padding included).

  Each micro-batch (rows / grad_accum_steps) is split over `batch_shards` devices (the
  mesh's data x fsdp) and the rows over the processes, so all must divide evenly.
  """
  rows = batch_tokens // max_len
  unit = math.lcm(grad_accum_steps * batch_shards, grad_accum_steps * process_count)
  if rows < 1 or rows % unit:
    raise errors.BadValue(
      f"train.batch_tokens={batch_tokens} gives {rows} rows of data.max_len={max_len} tokens; "
      f"the rows must be a positive multiple of {unit} (grad_accum_steps={grad_accum_steps} x "
      f"data-parallel shards={batch_shards}, and processes={process_count}); "
      f"adjust train.batch_tokens (e.g. {max(unit, rows // unit * unit) * max_len})."
    )
  return rows


def check_num_workers(num_workers: int) -> None:
  """`data.num_workers` must be 0 (tokenize and pack in this process) or a worker count."""
  if num_workers < 0:
    raise errors.BadValue(f"data.num_workers={num_workers} must be 0 (no workers) or more.")


def training_batches(
  pairs: Sequence[tuple[str, str]],
  tokenizer: AnyTokenizer,
  batch_rows: int,
  grad_accum_steps: int,
  max_len: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
  packing_bins: int = 256,
  pad_id: int = PAD_ID,
  start_id: int = BOS_ID,
  num_workers: int = 0,
  worker_buffer: int = 2,
  allow_changed_corpus: bool = False,
) -> tuple[TrainingBatches, FilterCounts]:
  """An endless iterator of packed [accum, micro, max_len] batches, and its filter counts.

  `batch_rows` counts packed rows over all processes; each process reads every
  `process_count`-th pair starting at `process_index` and yields its own rows.
  First-fit packing fills `packing_bins` rows at a time (at least one batch): more
  bins leave less padding (news, 128 tokens: 32 bins 93.6% of target slots used,
  256 bins 96.6%). With `num_workers` > 0, tokenizing, filtering and packing run in that
  many worker processes, each keeping up to `worker_buffer` finished batches (see the
  module docstring for how the stream depends on the number). The iterator's state carries
  the data's fingerprint (corpus_fingerprint.py): restoring it over other data stops with one
  error naming what changed, or, with `allow_changed_corpus`, warns and goes on.
  """
  check_num_workers(num_workers)
  local_rows = batch_rows // process_count
  micro = local_rows // grad_accum_steps
  # Counted where the filter runs: here, or in each worker's copy.
  counted = FilterCounts()
  dataset = (
    grain.MapDataset.source(pairs)[process_index::process_count]
    .shuffle(seed=seed)
    .repeat(None)
    .map(TokenizePair(tokenizer))
    .map_with_index(_with_stream_index)
    .filter(KeepPair(max_len, counted))
    # In this thread, without Grain's default 16 prefetch threads: tokenizing a pair takes
    # ~15 us, less than the threads cost in GIL hand-offs and in polling their 500-deep
    # buffer on every element (3x the pipeline's CPU time on the demo). The device step
    # runs asynchronously meanwhile, so the work still overlaps it.
    .to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  )
  dataset = packed_rows(dataset, local_rows, max_len, seed, packing_bins, pad_id, start_id)
  dataset = dataset.map(
    lambda batch: {k: v.reshape(grad_accum_steps, micro, max_len) for k, v in batch.items()}
  )
  # A map keeps its parent's iterator state, so with no workers the state (and a checkpoint
  # written before workers existed) is what it was without this map.
  dataset = dataset.map(_CountsInBatch(counted))
  if num_workers:
    # The workers read the pairs; the files this process opened (to sample the tokenizer's
    # sentences) would only take descriptors from its own limit.
    if hasattr(pairs, "close"):
      pairs.close()
    if not flags.FLAGS.is_parsed():
      # Grain reads its absl flags when it starts workers; our command line is argparse's,
      # so Grain's flags keep their defaults.
      flags.FLAGS.mark_as_parsed()
    dataset = dataset.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=worker_buffer),
      worker_init_fn=_worker_setup,
    )
  counts = FilterCounts()
  data = corpus_fingerprint.fingerprint(pairs, tokenizer)
  return TrainingBatches(iter(dataset), counts, num_workers, data, allow_changed_corpus), counts


class _CountsInBatch:
  """Grain map: adds `filter_log`, int64 [1 + n, 3], the (stream index, empty, too long) of
  the pairs filtered since the previous batch, so that counts made in a worker process reach
  the training process. Row 0 is a (-1, 0, 0) placeholder: the array is never empty."""

  def __init__(self, counts: FilterCounts):
    self.counts = counts

  def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    log = np.concatenate([np.array([[-1, 0, 0]], np.int64), self.counts.drain_log()])
    return dict(batch, filter_log=log)


def _worker_setup(worker_index: int, worker_count: int) -> None:
  """Workers leave Ctrl-C and SIGTERM to the training process, which finishes its step and
  checkpoint (reading batches the workers already made) and then closes them; and a worker
  exits by itself within a second once that process is gone (killed with SIGKILL, say),
  instead of waiting forever to hand over its next batch."""
  del worker_index, worker_count
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  parent = os.getppid()

  def exit_when_orphaned():
    while os.getppid() == parent:
      time.sleep(1.0)
    os._exit(0)

  threading.Thread(target=exit_when_orphaned, daemon=True, name="orphan-watch").start()


def packed_rows(
  examples: grain.IterDataset,
  rows: int,
  max_len: int,
  seed: int,
  packing_bins: int = 256,
  pad_id: int = PAD_ID,
  start_id: int = BOS_ID,
) -> grain.IterDataset:
  """Tokenized {"inputs", "targets"} examples -> batches of [rows, max_len] packed rows.

  First-fit packing over `packing_bins` open rows (at least `rows`), with per-sentence
  segment ids and positions, and decoder inputs shifted right within each sentence.
  """
  dataset = grain.experimental.FirstFitPackIterDataset(
    examples,
    length_struct={"inputs": max_len, "targets": max_len},
    num_packing_bins=max(rows, packing_bins),
    seed=seed,
    shuffle_bins=True,
  )
  shift = functools.partial(shift_right_per_segment, pad_id=pad_id, start_id=start_id)
  return dataset.map(shift).batch(rows, drop_remainder=True)


def bucket_length(length: int, multiple: int = 16) -> int:
  """Rounds up to a multiple of 16 so a few shapes cover every batch (few recompiles)."""
  return max(multiple, -(-length // multiple) * multiple)


def evaluation_bucket(length: int, smallest: int = 16) -> int:
  """The padded length of an evaluation or decoding batch: `smallest` doubled until `length`
  fits (16, 32, 64, ...). Each bucket is one more compiled program (about 10 s for a beam
  search on a CPU, more on a GPU); doubling needs 5 buckets up to 256 tokens where multiples
  of 16 need 16, for at most twice the padding of the source side, which the masks ignore."""
  bucket = smallest
  while bucket < length:
    bucket *= 2
  return bucket


def evaluation_batches(
  pairs: Sequence[tuple[str, str]],
  tokenizer: AnyTokenizer,
  batch_rows: int,
  pad_id: int = PAD_ID,
  start_id: int = BOS_ID,
) -> Iterator[dict[str, np.ndarray]]:
  """Padded [1, batch_rows, bucket] batches covering every non-empty pair exactly once.

  Pairs are sorted by length so each batch pads little; rows beyond the last pair
  are all padding (weight 0). No pair is truncated or dropped.
  """
  tokenize = TokenizePair(tokenizer)
  examples = [tokenize(pair) for pair in pairs if pair[0].strip() and pair[1].strip()]
  examples.sort(key=lambda e: max(len(e["inputs"]), len(e["targets"])))
  for start in range(0, len(examples), batch_rows):
    chunk = examples[start : start + batch_rows]
    length = evaluation_bucket(max(max(len(e["inputs"]), len(e["targets"])) for e in chunk))
    batch = {
      k: np.full((batch_rows, length), pad_id, np.int32)
      for k in ("inputs", "targets", "targets_in")
    }
    for row, example in enumerate(chunk):
      source, target = example["inputs"], example["targets"]
      batch["inputs"][row, : len(source)] = source
      batch["targets"][row, : len(target)] = target
      batch["targets_in"][row, 0] = start_id
      batch["targets_in"][row, 1 : len(target)] = target[:-1]
    yield {k: v[None] for k, v in batch.items()}

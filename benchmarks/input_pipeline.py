"""Does the input pipeline keep up with accelerators? Tokens/s per worker count against what a
Base step consumes, and (`--fed`) a row's train step fed by the pipeline against the same step
on one fixed batch.

    python benchmarks/input_pipeline.py [--workers 0 1 2] [--batches 60] [--max_len 128]
                                        [--batch_tokens 4096] [--devices 8] [--data_root DIR]
    python benchmarks/input_pipeline.py --fed [--fed_workers auto 0] [--steps 40] [--pairs N]
    python benchmarks/input_pipeline.py --tiny [--fed]     # toy sizes, no data, seconds (CI)

Rates: the pipeline (read + tokenize (SentencePiece) + filter + first-fit pack + batch) runs on
the ~28k EN-DE news pairs of ../shared/data (--tiny: a generated corpus) with
`data.num_workers` = each of --workers (0: in this process); its rate is the non-pad target
tokens of the batches the training process receives per second, after the first batch (worker
start-up is not throughput). Workers help only up to the host's free cores: each runs the
whole pipeline on 1/N of the pairs, and the training process itself needs a core.

The demand, the reference each rate is printed against, is computed, not measured: the Base
WMT14 EN-DE row (transformer_base_wmt14_ende) on --devices A100s at the model FLOP utilization
estimates.py assumes (its UTILIZATION and its bf16/TF32 peak), with the attention scores
included (they are real work on full packed rows), so one update of train.batch_tokens target
slots takes FLOPs / (devices x peak x MFU) seconds (also printed for float32).

--fed: is a WMT row's training input-bound? The row's own run (`training.setup.setup_run`: the
batches, the worker processes of data.num_workers, the prefetch onto the devices and the
compiled step `run.py train` gets) on a local corpus written for it: --pairs pairs of
news-like lengths (benchmarks/harness/corpus.py; a share of its words new compounds, as Heaps'
law has them, so that the row's 37k BPE vocabulary can be trained on it; --tiny shrinks the
model, the rows and the corpus). For each worker count of --fed_workers ("auto": what
data.num_workers="auto" gives this host; counts that resolve alike run once), after --warmup
steps (compilation, worker start-up):
  * fed: --steps steps, each taking its batch from the pipeline, timed from the first to the
    last step's end (one device sync at the end, so the pipeline works while the device
    computes, as in training); waiting: the time spent inside next(batches), as a share;
  * fixed: --steps steps of the same compiled step on one batch already on the device (what
    train_step.py and accelerator.py time);
  * fed / fixed: the step rate with the pipeline over the rate without. Within 10% (>= 0.90)
    on a GPU host means the row is not input-bound; on a CPU the step is slow and shares the
    cores with the pipeline: the figure is only reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from benchmarks.harness import corpus, timing  # noqa: E402
from transformer_mt.config import registry  # noqa: E402
from transformer_mt.data import input_pipeline, worker_count  # noqa: E402
from transformer_mt.data import sources as data_sources  # noqa: E402
from transformer_mt.data.tokenizer import PAD_ID, train_tokenizer  # noqa: E402
from transformer_mt.model import estimates  # noqa: E402

ROW = "transformer_base_wmt14_ende"
news_ende_small = registry.experiment_module("news_ende_small")
transformer_base_wmt14_ende = registry.experiment_module(ROW)

# --fed at --tiny: the Base row's code path, a toy model and rows (CPU, CI).
TINY_OVERRIDES = (
  "model.d_model=32",
  "model.d_ff=64",
  "model.num_heads=2",
  "model.num_encoder_layers=1",
  "model.num_decoder_layers=1",
  "tokenizer.vocab_size=300",
  "data.max_len=32",
  "train.batch_tokens=256",
)


@dataclasses.dataclass(frozen=True)
class FedSize:
  pairs: int  # generated training pairs
  tokenizer_sample: int  # sentences the tokenizer is trained on
  warmup: int  # untimed steps before the timed ones
  steps: int  # timed steps, fed and fixed each


FED_SIZES = {
  "tiny": FedSize(pairs=1000, tokenizer_sample=1000, warmup=2, steps=3),
  # 200k sentences: a 37k BPE vocabulary needs that many of the generated text (its words are
  # pseudo-words where ../shared/data is missing); ~12 s to train on 2 busy cores.
  "row": FedSize(pairs=300_000, tokenizer_sample=200_000, warmup=12, steps=40),
}


# --- rates against the demand ------------------------------------------------------------------


def base_demand(devices: int, dtype: str = "") -> tuple[float, str]:
  """Target tokens/s a Base step consumes on `devices` A100s at estimates.UTILIZATION, for
  the row's model.dtype or `dtype`."""
  config = transformer_base_wmt14_ende.get_config()
  config.model.dtype = dtype or config.model.dtype
  row = estimates.estimate(config, devices=devices)
  flops = row.flops_per_step + row.attention_flops_per_step
  seconds = flops / (devices * row.peak_flops * estimates.UTILIZATION)
  tokens = row.target_tokens
  dtype_name = "auto: bfloat16 on the GPU" if config.model.dtype == "auto" else config.model.dtype
  note = (
    f"Base WMT14 EN-DE ({row.total_params / 1e6:.0f}M params, {tokens:,} target slots/update, "
    f"{dtype_name}): {flops / 1e12:.1f} TFLOP/update incl. attention scores, on "
    f"{devices}x {estimates.DEVICE} at {estimates.UTILIZATION:.0%} of "
    f"{row.peak_flops / 1e12:.0f} TFLOP/s -> {seconds * 1e3:.1f} ms/update"
  )
  return tokens / seconds, note


def pipeline_rate(pairs, tokenizer, rows, max_len, workers, batches) -> tuple[float, float]:
  """(non-pad target tokens/s, non-pad fraction) of `batches` batches after the first."""
  iterator, _ = input_pipeline.training_batches(
    pairs, tokenizer, rows, 1, max_len, seed=0, num_workers=workers
  )
  next(iterator)  # start-up: worker processes, the first packing round
  start = time.perf_counter()
  real = 0
  for _ in range(batches):
    real += int((next(iterator)["targets"] != PAD_ID).sum())
  seconds = time.perf_counter() - start
  iterator.close()
  return real / seconds, real / (batches * rows * max_len)


def rates(args, folder: str) -> None:
  need, note = base_demand(args.devices)
  print(f"demand: {need:12,.0f} target tokens/s  [{note}]")
  f32, f32_note = base_demand(args.devices, "float32")
  print(f"        {f32:12,.0f} target tokens/s with model.dtype=float32  [{f32_note}]")
  data_config = news_ende_small.get_config().data
  if args.tiny:
    corpus.generate_corpus(os.path.join(folder, "pairs"), 1000, seed=0)
    data_config.root = folder
    data_config.train_prefixes = ["pairs"]
    data_config.validation_prefixes = data_config.test_prefixes = []
  else:
    data_config.root = args.data_root and os.path.abspath(os.path.expanduser(args.data_root))
  pairs = data_sources.load_pairs(data_config)["train"]
  sample = 1000 if args.tiny else 60_000
  tokenizer = train_tokenizer(pairs, args.vocab_size, "unigram", sample_size=sample)
  rows = input_pipeline.rows_per_batch(args.batch_tokens, args.max_len, 1, 1)
  print(
    f"{len(pairs)} {'generated' if args.tiny else 'news'} pairs, SentencePiece "
    f"{args.vocab_size}, batches of {rows}x{args.max_len}; {os.cpu_count()} CPU cores"
  )
  for workers in args.workers:
    rate, filled = pipeline_rate(pairs, tokenizer, rows, args.max_len, workers, args.batches)
    print(
      f"num_workers={workers}: {rate:12,.0f} target tokens/s ({filled:.1%} non-pad) = "
      f"{rate / need:.2f}x the demand"
    )


# --- --fed: the step fed by the pipeline against one fixed batch --------------------------------


def row_config(corpus_dir: str, workers, tokenizer_sample: int, tiny: bool):
  """The row's config on the local corpus in `corpus_dir`, with `workers` as data.num_workers;
  no validation, no BLEU, no test split."""
  overrides = [
    "data.source='local'",
    f"data.root='{corpus_dir}'",
    "data.train_prefixes=['train']",
    "data.test_prefixes=[]",
    "data.validation_prefixes=[]",
    f"data.prepared_dir='{corpus_dir}/prepared'",
    f"data.num_workers={workers!r}",
    f"tokenizer.sample_size={tokenizer_sample}",
    "train.num_steps=1000000",
    "train.eval_every=0",
    "train.bleu_every=0",
  ]
  return registry.load_experiment(ROW, overrides + list(TINY_OVERRIDES if tiny else ()))


def _timed_steps(run, state, steps: int, batch=None) -> tuple[object, float, float]:
  """(state, seconds, seconds inside next(batches)) of `steps` steps, each on the pipeline's
  next batch, or on `batch` when given; one device sync, at the end."""
  waited = 0.0
  start = time.perf_counter()
  for _ in range(steps):
    if batch is None:
      fetch = time.perf_counter()
      step_batch = next(run.batches)
      waited += time.perf_counter() - fetch
    else:
      step_batch = batch
    state, metrics = run.step_fn(state, step_batch)
  jax.block_until_ready((state, metrics))
  return state, time.perf_counter() - start, waited


def fed_measure(config, workdir: str, warmup: int, steps: int) -> dict:
  """One worker setting: the fed and fixed step rates and the share spent waiting."""
  from transformer_mt.training.setup import setup_run

  run = setup_run(config, workdir)
  try:
    state = run.state
    state, _, _ = _timed_steps(run, state, warmup)  # compiles; workers start
    state, fed_seconds, waited = _timed_steps(run, state, steps)
    fixed_batch = next(run.batches)
    state, fixed_seconds, _ = _timed_steps(run, state, steps, batch=fixed_batch)
  finally:
    run.batches.close()
    run.writer.close()
  tokens = config.train.batch_tokens
  return {
    "workers": run.config.data.num_workers,
    "target_slots_per_step": tokens,
    "fed_step_ms": fed_seconds / steps * 1e3,
    "fixed_step_ms": fixed_seconds / steps * 1e3,
    "fed_over_fixed": fixed_seconds / fed_seconds,
    "waiting_share": waited / fed_seconds,
    "fed_slots_per_s": tokens * steps / fed_seconds,
    "fixed_slots_per_s": tokens * steps / fixed_seconds,
  }


def format_line(figures: dict) -> str:
  return (
    f"input-bound check, data.num_workers={figures['workers']}: fed by the pipeline "
    f"{figures['fed_step_ms']:.1f} ms/step ({figures['fed_slots_per_s']:,.0f} target slots/s), "
    f"one fixed batch {figures['fixed_step_ms']:.1f} ms/step: fed/fixed "
    f"{figures['fed_over_fixed']:.2f}, {figures['waiting_share']:.1%} of the fed time waiting "
    "for input"
  )


def fed_figures(args, folder: str) -> list[dict]:
  """--fed for each distinct worker count of --fed_workers, a line printed per count."""
  size = FED_SIZES["tiny" if args.tiny else "row"]
  counts = []
  for value in args.fed_workers:
    count = worker_count.resolve(value)
    if count not in counts:
      counts.append(count)
  corpus_dir = pathlib.Path(folder) / "fed_corpus"
  corpus_dir.mkdir()
  corpus.generate_corpus(corpus_dir / "train", args.pairs or size.pairs, seed=0, heaps_types=True)
  results = []
  for count in counts:
    sample = args.tokenizer_sample or size.tokenizer_sample
    config = row_config(str(corpus_dir), count, sample, args.tiny)
    workdir = str(pathlib.Path(folder) / f"run_{count}")
    figures = fed_measure(config, workdir, args.warmup or size.warmup, args.steps or size.steps)
    results.append(figures)
    print(format_line(figures), flush=True)
  print(json.dumps({"benchmark": "input_pipeline", "fed": results}))
  return results


def _worker_value(text: str):
  return text if text == worker_count.AUTO else int(text)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tiny", action="store_true", help="toy sizes, no data (CI)")
  parser.add_argument("--workers", type=int, nargs="+", help="worker counts (default 0 1 2)")
  parser.add_argument("--batches", type=int, help="batches timed per worker count (default 60)")
  parser.add_argument("--batch_tokens", type=int, default=4096, help="rows x max_len per batch")
  parser.add_argument("--max_len", type=int, default=128)
  parser.add_argument("--vocab_size", type=int, default=None, help="default 8000")
  parser.add_argument("--devices", type=int, default=8, help="A100s the demand is computed for")
  parser.add_argument(
    "--data_root",
    default="",
    help="folder holding news_ende_small's news/en-de/* files (default: ../shared/data beside "
    "the repository)",
  )
  parser.add_argument("--fed", action="store_true", help="also the fed / fixed step check")
  parser.add_argument(
    "--fed_workers", nargs="+", type=_worker_value, default=["auto", 0], help="'auto' or counts"
  )
  parser.add_argument("--steps", type=int, default=None, help="--fed: timed steps")
  parser.add_argument("--warmup", type=int, default=None, help="--fed: untimed steps first")
  parser.add_argument("--pairs", type=int, default=None, help="--fed: generated training pairs")
  parser.add_argument("--tokenizer_sample", type=int, default=None, help="--fed: tokenizer text")
  args = parser.parse_args(argv)
  args.workers = args.workers or ([0] if args.tiny else [0, 1, 2])
  args.batches = args.batches or (3 if args.tiny else 60)
  args.vocab_size = args.vocab_size or (300 if args.tiny else 8000)
  if args.tiny:
    args.batch_tokens, args.max_len = 256, 32
  print(timing.machine_line())
  with tempfile.TemporaryDirectory(prefix="input_pipeline_") as folder:
    rates(args, folder)
    if args.fed:
      fed_figures(args, folder)
  return 0


if __name__ == "__main__":
  sys.exit(main())

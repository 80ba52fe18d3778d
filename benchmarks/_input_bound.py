"""Is a WMT row's training input-bound? Its jitted train step fed by the real input pipeline,
against the same step on one fixed device batch.

    python benchmarks/_input_bound.py --tiny                # seconds on a CPU (CI)
    python benchmarks/_input_bound.py                       # the Base WMT14 EN-DE row, a GPU
    python benchmarks/_input_bound.py --workers auto 0 --steps 40 --pairs 300000

The run is the row's own (`training.setup.setup_run`, so the batches, the worker processes of
`data.num_workers`, the prefetch onto the devices and the compiled step are what `run.py train`
gets), on a local corpus written for it: `--pairs` line-aligned EN-DE pairs of news-like
lengths from benchmarks/_generated_corpus.py (words from ../shared/data's news files, or
pseudo-words where that folder is missing, as on a lent GPU machine), read through the
prepared-corpus index like any local corpus; a share of its words are new compounds, as
Heaps' law has them at that size (`heaps_types`), so that the row's 37k BPE vocabulary can be
trained on it. The tokenizer is trained on `--tokenizer_sample` sentences (the row's vocabulary
size and kind; the row itself samples 2M, minutes that say nothing about the input rate).
`--tiny` shrinks the model, the rows and the corpus.

For each worker count (`--workers`; "auto" is what data.num_workers="auto" gives this host,
data/worker_count.py; counts that resolve alike run once), after `--warmup` steps (compilation,
worker start-up, and draining the batches the workers made meanwhile):
  * fed: `--steps` steps, each taking its batch from the pipeline, timed from the first to
    the last step's end (one device sync at the end; JAX dispatches the steps asynchronously,
    so the pipeline works while the device computes, as in training);
  * waiting: the time the loop spent inside next(batches), as a share of the fed time: the
    part of the step time the device waited for input (0 when the batches were ready);
  * fixed: `--steps` steps of the same compiled step on one batch already on the device:
    what the benchmarks of train_step.py and accelerator.py time;
  * fed / fixed: the step rate with the pipeline over the rate without. The issue's
    acceptance: within 10% (>= 0.90) on a GPU host. On a CPU the step is slow and shares
    the cores with the pipeline: the figure is only reported.

`input_bound_figures` is the function benchmarks/accelerator.py can call as a section; it
returns one dict per worker count, and `format_line` prints one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from benchmarks import _generated_corpus  # noqa: E402
from transformer_mt.config import registry  # noqa: E402
from transformer_mt.data import worker_count  # noqa: E402

ROW = "transformer_base_wmt14_ende"
# The tiny size: the Base row's code path, a toy model and rows (CPU, CI).
TINY_OVERRIDES = (
  "model.d_model=64",
  "model.d_ff=128",
  "model.num_heads=4",
  "model.num_encoder_layers=2",
  "model.num_decoder_layers=2",
  "tokenizer.vocab_size=400",
  "data.max_len=64",
  "train.batch_tokens=512",
)


@dataclasses.dataclass(frozen=True)
class Size:
  pairs: int  # generated training pairs
  tokenizer_sample: int  # sentences the tokenizer is trained on
  warmup: int  # untimed steps before the timed ones
  steps: int  # timed steps, fed and fixed each


SIZES = {
  "tiny": Size(pairs=3000, tokenizer_sample=3000, warmup=3, steps=8),
  # 200k sentences: a 37k BPE vocabulary needs that many of the generated text (its words are
  # pseudo-words where ../shared/data is missing); ~12 s to train on 2 busy cores.
  "row": Size(pairs=300_000, tokenizer_sample=200_000, warmup=12, steps=40),
}


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


def measure(config, workdir: str, warmup: int, steps: int) -> dict:
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


def input_bound_figures(
  tiny: bool = False,
  workers=("auto", 0),
  steps: int | None = None,
  warmup: int | None = None,
  pairs: int | None = None,
  tokenizer_sample: int | None = None,
  print_line=print,
) -> list[dict]:
  """The check for each distinct worker count of `workers` ("auto" resolved for this host),
  one line printed per count (`print_line`, None: nothing printed); returns their dicts."""
  size = SIZES["tiny" if tiny else "row"]
  counts = []
  for value in workers:
    count = worker_count.resolve(value)
    if count not in counts:
      counts.append(count)
  results = []
  with tempfile.TemporaryDirectory(prefix="input_bound_") as folder:
    corpus = pathlib.Path(folder) / "corpus"
    corpus.mkdir()
    # With Heaps' law's share of new compounds: enough word types for the row's vocabulary.
    _generated_corpus.generate_corpus(
      corpus / "train", pairs or size.pairs, seed=0, heaps_types=True
    )
    for count in counts:
      config = row_config(str(corpus), count, tokenizer_sample or size.tokenizer_sample, tiny)
      figures = measure(
        config,
        str(pathlib.Path(folder) / f"run_{count}"),
        warmup or size.warmup,
        steps or size.steps,
      )
      results.append(figures)
      if print_line:
        print_line(format_line(figures))
  return results


def _worker_value(text: str):
  return text if text == worker_count.AUTO else int(text)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tiny", action="store_true", help="toy model and corpus (CPU, CI)")
  parser.add_argument(
    "--workers", nargs="+", type=_worker_value, default=["auto", 0], help="'auto' or counts"
  )
  parser.add_argument("--steps", type=int, default=None, help="timed steps (fed and fixed each)")
  parser.add_argument("--warmup", type=int, default=None, help="untimed steps first")
  parser.add_argument("--pairs", type=int, default=None, help="generated training pairs")
  parser.add_argument("--tokenizer_sample", type=int, default=None, help="tokenizer sentences")
  args = parser.parse_args()
  device = jax.devices()[0]
  print(f"device: {device.device_kind} ({device.platform}), jax {jax.__version__}, row {ROW}")
  results = input_bound_figures(
    args.tiny, args.workers, args.steps, args.warmup, args.pairs, args.tokenizer_sample
  )
  print(json.dumps({"device": device.device_kind, "tiny": args.tiny, "results": results}))
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""How fast is our train step? Target tokens/s, achieved FLOP/s against this machine's matmul
peak, and a strong plain Flax Linen reference, all measured in one run, in two modes:

    python benchmarks/train_step.py [--mode both|packed|full_rows|scaling] [--layers 2] ...
    python benchmarks/train_step.py --tiny [--mode ...]      # toy sizes, seconds (CI)

  packed      (today's end-to-end comparison) ours on one packed batch, the reference on the
              *same sentences* one per row, padded to the batch's longest source / target:
              same real target tokens, but the reference spends compute on padding. Most of
              this ratio is packing.
  full_rows   both models on the *same* batch of fully-filled rows: every row one sentence
              pair whose source and target fill all max_len slots (segment ids all 1,
              positions 0..max_len-1, no padding, no packing), so the ratio isolates per-slot
              speed: how fast each implementation turns a real token into a training update.
  scaling     ours alone on full rows: step time against sequence length at a fixed token
              budget (--lengths at --tokens), and against the budget at a fixed length
              (--token_budgets at --length), with the exponent b of step_seconds ~ a * x^b
              fitted on log-log: ~0 for length if attention is a small share of the work, ~1
              for tokens if the step is throughput-bound (below 1 when small batches leave
              the cores partly idle).
`--mode both` (the default) runs packed and full_rows and prints both ratios.

Measures (after compilation; best of --reps steps, median shown too):
  peak        a jitted [--matmul_size]^2 matmul in float32 (and bfloat16 where the hardware
              has it): the denominator of "fraction of peak".
  ours        our step as `run.py train` builds it (benchmarks/harness/steps.py's
              TrainStepBench: sharded state on a 1-device mesh, Adam, label smoothing 0.1,
              dropout 0.1, the state donated) on [1, batch_tokens /
              max_len rows, max_len]: packed by the training pipeline's own first-fit packer
              (`input_pipeline.packed_rows`, 256 open rows), or full rows.
  reference   what a strong user writes, in the style of google/flax examples/wmt: a Linen
              encoder-decoder of `nn.MultiHeadDotProductAttention`, `nn.Dense`, `nn.LayerNorm`
              with our dimensions, biases and post-LN, tied embeddings, dropout 0.1, Adam (our
              optimizer) and label-smoothed cross-entropy over non-pad tokens, jitted with the
              state donated. Like examples/wmt it is packing-aware (segment-id masks and
              per-sentence positions when the batch has them): on full rows it gets the very
              batch ours gets; in packed mode it gets the padded batch described above.
              Its code: benchmarks/harness/linen_reference.py.

Sentence lengths (packed mode): (source, target) word counts of the real newstest2014 EN-DE
pairs (../shared/data/news/en-de/newstest2014.{en,de}) times --tokens_per_word (1.4, about
what a 37k BPE gives on WMT news: mean ~27 tokens) plus EOS, drawn in random order; a
log-normal with mean ~27 tokens (sigma 0.5) if the files are absent. Token ids are random.

Useful FLOPs per step: benchmarks/harness/steps.py's `useful_flops` (its docstring gives the
formula), over real (non-pad) tokens only, the same for both models (so FLOP/s ratios equal
token/s ratios); in full_rows mode every slot is real.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grain  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.harness import timing  # noqa: E402
from benchmarks.harness.linen_reference import (  # noqa: E402
  ReferenceTransformer,
  reference_train_step,
)
from benchmarks.harness.steps import TrainStepBench, full_rows_batch, useful_flops  # noqa: E402
from transformer_mt.config import defaults as _defaults  # noqa: E402
from transformer_mt.data import input_pipeline  # noqa: E402
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID  # noqa: E402
from transformer_mt.model.transformer_config import TransformerConfig  # noqa: E402
from transformer_mt.training import optimizer  # noqa: E402

NEWS = ROOT.parent / "shared" / "data" / "news" / "en-de" / "newstest2014"


# ---------------------------------------------------------------------------------------------
# Sentences, packed (ours) and padded (reference)
# ---------------------------------------------------------------------------------------------


def sentence_lengths(
  max_len: int, tokens_per_word: float, seed: int, news: bool = True
) -> tuple[np.ndarray, str]:
  """(source, target) token lengths [n, 2] in random order, each in [2, max_len], and a label;
  from newstest2014 when `news` and its files are there."""
  rng = np.random.default_rng(seed)
  source, target = NEWS.with_suffix(".en"), NEWS.with_suffix(".de")
  if news and source.exists() and target.exists():
    words = [
      [len(line.split()) for line in path.read_text(encoding="utf-8").splitlines()]
      for path in (source, target)
    ]
    lengths = np.round(np.asarray(words, np.float64).T * tokens_per_word).astype(np.int64) + 1
    label = f"newstest2014 EN-DE words x {tokens_per_word} + EOS"
  else:
    lengths = np.round(rng.lognormal(np.log(27) - 0.125, 0.5, size=(3000, 2))).astype(np.int64)
    label = "log-normal, mean ~27 tokens"
  lengths = lengths[(lengths.min(axis=1) >= 2) & (lengths.max(axis=1) <= max_len)]
  return lengths[rng.permutation(len(lengths))], label


def packed_batch(
  lengths: np.ndarray, rows: int, max_len: int, vocab: int, seed: int
) -> dict[str, np.ndarray]:
  """[1, rows, max_len]: sentences of these (source, target) lengths with random ids, packed
  by the training pipeline's own packer (`input_pipeline.packed_rows`); its first batch."""
  rng = np.random.default_rng(seed)
  examples = [
    {
      "inputs": rng.integers(4, vocab, size=s).astype(np.int32),
      "targets": rng.integers(4, vocab, size=t).astype(np.int32),
    }
    for s, t in lengths
  ]
  dataset = input_pipeline.packed_rows(
    grain.MapDataset.source(examples).to_iter_dataset(), rows, max_len, seed
  )
  return {k: v[None] for k, v in next(iter(dataset)).items()}


def padded_batch(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The packed batch's sentences one per row, padded to the longest source / target."""
  sentences = []  # (source ids, target ids)
  for row in range(packed["inputs"].shape[1]):
    segment_ids = {side: packed[f"{side}_segment_ids"][0, row] for side in ("inputs", "targets")}
    for segment in range(1, segment_ids["inputs"].max() + 1):
      sentences.append(
        tuple(packed[side][0, row][segment_ids[side] == segment] for side in ("inputs", "targets"))
      )
  src_len = max(len(s) for s, _ in sentences)
  tgt_len = max(len(t) for _, t in sentences)
  batch = {
    "inputs": np.full((len(sentences), src_len), PAD_ID, np.int32),
    "targets": np.full((len(sentences), tgt_len), PAD_ID, np.int32),
    "targets_in": np.full((len(sentences), tgt_len), PAD_ID, np.int32),
  }
  for row, (source, target) in enumerate(sentences):
    batch["inputs"][row, : len(source)] = source
    batch["targets"][row, : len(target)] = target
    batch["targets_in"][row, 0] = BOS_ID
    batch["targets_in"][row, 1 : len(target)] = target[:-1]
  return batch


# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------


def ours_timer(config, label_smoothing, reps):
  """Our step (TrainStepBench: one state, one compilation per batch shape); the returned
  function times it on a batch [1, rows, max_len]."""
  bench = TrainStepBench(config, label_smoothing=label_smoothing)
  return lambda batch: bench.time(batch, warmup=1, reps=reps)


def reference_timer(config, label_smoothing, reps):
  """As `ours_timer`, for the reference on [rows, len] batches."""
  model = ReferenceTransformer(config)
  tx, _ = optimizer.make_optimizer(_defaults.base_config().train, config.d_model)
  dummy = jnp.ones((1, 2), jnp.int32)
  params = jax.jit(
    lambda: model.init(jax.random.key(0), dummy, dummy, deterministic=True)["params"]
  )()
  step = reference_train_step(model, tx, label_smoothing)
  holder = {"state": (params, tx.init(params), jnp.array(0, jnp.int32))}

  def time_batch(batch):
    device_batch = jax.device_put(batch)

    def call():
      holder["state"], loss = step(holder["state"], device_batch)
      return loss

    return timing.time_calls(call, warmup=1, reps=reps)

  return time_batch


def mode_batches(mode, args, lengths, length_source):
  """(ours' batch [1, rows, max_len], the reference's batch, per-sentence (source, target)
  lengths [n, 2], a one-line description) for one mode."""
  rows = args.batch_tokens // args.max_len
  if mode == "full_rows":
    batch = full_rows_batch(rows, args.max_len, args.vocab_size, args.seed)
    chosen = np.full((rows, 2), args.max_len, np.int64)
    line = (
      f"{rows} sentences of {args.max_len} source + {args.max_len} target tokens: both models "
      f"run the same {batch['targets'].shape[1:]} rows, 100% of slots real"
    )
    return batch, {k: v[0] for k, v in batch.items()}, chosen, line
  packed = packed_batch(lengths, rows, args.max_len, args.vocab_size, args.seed)
  padded = padded_batch(packed)
  # The packed sentences' (source, target) lengths: token ids are >= 4, so nonzero.
  chosen = np.stack([(padded["inputs"] != PAD_ID).sum(1), (padded["targets"] != PAD_ID).sum(1)], 1)
  target_tokens = chosen[:, 1].sum()
  line = (
    f"{len(chosen)} sentences ({length_source}): {target_tokens} target tokens, mean "
    f"{chosen[:, 1].mean():.1f}; ours packed {packed['inputs'].shape[1:]} "
    f"({target_tokens / packed['targets'].size:.1%} of target slots real), reference padded "
    f"{padded['targets'].shape} ({target_tokens / padded['targets'].size:.1%} real)"
  )
  return packed, padded, chosen, line


# Each flag's default, and at --tiny (seconds on 2 CPU cores).
DEFAULTS = dict(
  layers=2,
  d_model=512,
  d_ff=2048,
  heads=8,
  vocab_size=37000,
  batch_tokens=2048,
  max_len=128,
  reps=3,
  matmul_size=2048,
  lengths=[64, 128, 256, 512],
  tokens=4096,
  token_budgets=[1024, 2048, 4096, 8192],
  length=128,
)
TINY = dict(
  layers=1,
  d_model=32,
  d_ff=64,
  heads=2,
  vocab_size=256,
  batch_tokens=128,
  max_len=16,
  reps=1,
  matmul_size=256,
  # The scaling sweeps share their (8, 16) rows with the full_rows mode's batch, so that a
  # process running both compiles that shape once.
  lengths=[8, 16],
  tokens=128,
  token_budgets=[64, 128],
  length=16,
)


def fitted_exponent(x: list[float], seconds: list[float]) -> float:
  """b of seconds = a * x^b by least squares on (log x, log seconds)."""
  return float(np.polyfit(np.log(x), np.log(seconds), 1)[0])


def scaling(config, args) -> None:
  """--mode scaling: our step's time against length and against tokens per step, on full rows
  (one state and compiled step per shape), a line per shape and the fitted exponents."""
  sweeps = {
    "length": [(length, args.tokens) for length in args.lengths],
    "tokens": [(args.length, tokens) for tokens in args.token_budgets],
  }
  record = {"benchmark": "train_step", "mode": "scaling", "config": vars(args)}
  print(
    f"{'sweep':8}{'length':>8}{'rows':>6}{'tokens':>8}{'step s (best)':>15}{'median':>9}"
    f"{'tokens/s':>10}"
  )
  time_batch = ours_timer(config, 0.1, args.reps)
  for sweep, shapes in sweeps.items():
    points = []
    for length, tokens in shapes:
      rows = tokens // length
      step = time_batch(full_rows_batch(rows, length, args.vocab_size, args.seed))
      points.append(
        {"length": length, "rows": rows, "tokens": rows * length, "step_seconds": step.best}
      )
      print(
        f"{sweep:8}{length:8d}{rows:6d}{rows * length:8d}{step.best:15.3f}"
        f"{step.median:9.3f}{rows * length / step.best:10,.0f}",
        flush=True,
      )
    exponent = fitted_exponent([r[sweep] for r in points], [r["step_seconds"] for r in points])
    print(f"  step time ~ {sweep}^{exponent:.2f}")
    record[sweep] = {"points": points, "exponent": exponent}
  print(json.dumps(record))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--mode",
    default="both",
    choices=["both", "packed", "full_rows", "scaling"],
    help="packed: ours packed vs the reference padded; full_rows: both on the same full rows; "
    "scaling: ours alone, step time against length and tokens per step",
  )
  parser.add_argument("--tiny", action="store_true", help="toy sizes, seconds on a CPU (CI)")
  parser.add_argument("--layers", type=int, help="encoder and decoder layers (default 2)")
  parser.add_argument("--d_model", type=int, help="default 512")
  parser.add_argument("--d_ff", type=int, help="default 2048")
  parser.add_argument("--heads", type=int, help="default 8")
  parser.add_argument("--vocab_size", type=int, help="default 37000")
  parser.add_argument("--batch_tokens", type=int, help="target slots per step (default 2048)")
  parser.add_argument("--max_len", type=int, help="default 128")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--tokens_per_word", type=float, default=1.4)
  parser.add_argument("--reps", type=int, help="timed steps per model and mode (default 3)")
  parser.add_argument("--matmul_size", type=int, help="default 2048")
  parser.add_argument("--skip_reference", action="store_true")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--lengths", type=int, nargs="+", help="scaling: lengths (64 ... 512)")
  parser.add_argument("--tokens", type=int, help="scaling: tokens/step of the length sweep (4096)")
  parser.add_argument(
    "--token_budgets", type=int, nargs="+", help="scaling: tokens/step (1024 ... 8192)"
  )
  parser.add_argument("--length", type=int, help="scaling: length of the tokens sweep (128)")
  args = parser.parse_args(argv)
  for key, value in (TINY if args.tiny else DEFAULTS).items():
    if getattr(args, key) is None:
      setattr(args, key, value)

  config = TransformerConfig(
    vocab_size=args.vocab_size,
    d_model=args.d_model,
    num_heads=args.heads,
    d_ff=args.d_ff,
    num_encoder_layers=args.layers,
    num_decoder_layers=args.layers,
    dropout_rate=0.1,
    dtype=args.dtype,
  )
  print(timing.machine_line())
  if args.mode == "scaling":
    scaling(config, args)
    return
  modes = ["packed", "full_rows"] if args.mode == "both" else [args.mode]
  lengths, length_source = sentence_lengths(
    args.max_len, args.tokens_per_word, args.seed, news=not args.tiny
  )
  setups = {}
  for mode in modes:
    ours_batch, reference_batch, chosen, line = mode_batches(mode, args, lengths, length_source)
    flops = useful_flops(config, chosen[:, 0], chosen[:, 1])
    setups[mode] = (ours_batch, reference_batch, chosen, flops)
    print(f"[{mode}] {line}")
    print(
      f"[{mode}] useful FLOPs/step {flops['total']:.3e}: "
      + ", ".join(f"{k} {v / flops['total']:.0%}" for k, v in flops.items() if k != "total")
    )

  dtypes = {"float32": jnp.float32}
  if timing.hardware_has_bf16():
    dtypes["bfloat16"] = jnp.bfloat16
  load_before = os.getloadavg()[0]
  peaks = {name: timing.matmul_peak(args.matmul_size, dtype) for name, dtype in dtypes.items()}
  timers = {"ours": ours_timer(config, 0.1, args.reps)}
  if not args.skip_reference:
    timers["reference"] = reference_timer(config, 0.1, args.reps)
  results = {}
  for mode in modes:
    ours_batch, reference_batch = setups[mode][:2]
    batches = {"ours": ours_batch, "reference": reference_batch}
    results[mode] = {name: timer(batches[name]) for name, timer in timers.items()}
  # The peak again after the steps, keeping the better one: on a shared machine a quiet
  # moment during either measurement is the closer estimate of what the hardware does.
  peaks = {
    name: tuple(map(max, peaks[name], timing.matmul_peak(args.matmul_size, dtype)))
    for name, dtype in dtypes.items()
  }
  peak, cpu_peak = peaks.get(args.dtype, peaks["float32"])
  load_after = os.getloadavg()[0]

  print(
    f"\n{'':30}{'step s best/median':>20}{'target tok/s':>13}{'GFLOP/s':>9}{'of peak':>9}"
    f"{'of peak, CPU time':>19}"
  )
  for name, (value, _) in peaks.items():
    print(f"{'matmul ' + name + ' peak':30}{'':>20}{'':>13}{value / 1e9:9.1f}")
  record = {
    "benchmark": "train_step",
    "device": jax.devices()[0].device_kind,
    "load_average": [load_before, load_after],
    "config": vars(args),
    "lengths": length_source,
    "matmul_peak_flops": {name: value for name, (value, _) in peaks.items()},
  }
  ratios = {}
  for mode in modes:
    _, _, chosen, flops = setups[mode]
    target_tokens = int(chosen[:, 1].sum())
    record[mode] = {
      "sentences": len(chosen),
      "target_tokens": target_tokens,
      "useful_flops_per_step": flops["total"],
      "flops_terms": flops,
    }
    for name, measured in results[mode].items():
      achieved = measured.rate(flops["total"])
      cpu_fraction = measured.cpu_rate(flops["total"]) / cpu_peak
      label = f"{mode} {name} ({args.dtype})"
      print(
        f"{label:30}{measured.best:10.3f} / {measured.median:7.3f}"
        f"{measured.rate(target_tokens):13,.0f}{achieved / 1e9:9.1f}{achieved / peak:9.1%}"
        f"{cpu_fraction:19.1%}"
      )
      record[mode][name] = {
        "step_seconds": measured.best,
        "step_seconds_median": measured.median,
        "target_tokens_per_second": measured.rate(target_tokens),
        "flops_per_second": achieved,
        "fraction_of_peak": achieved / peak,
        "fraction_of_peak_cpu_time": cpu_fraction,
      }
    if "reference" in results[mode]:
      ratios[mode] = results[mode]["reference"].best / results[mode]["ours"].best
      record[mode]["ours_over_reference"] = ratios[mode]
  what = {
    "packed": "ours packed / reference padded (end to end, mostly packing)",
    "full_rows": "ours / reference on the same full rows (per-slot speed)",
  }
  for mode, ratio in ratios.items():
    print(f"{what[mode]}: {ratio:.2f}x target tokens/s")
  print(
    f"1-minute load average {load_before:.1f} before, {load_after:.1f} after on "
    f"{os.cpu_count()} CPUs; 'of peak, CPU time' compares FLOPs per CPU-second of this "
    "process, which other processes on the machine hardly change"
  )
  print(json.dumps(record))


if __name__ == "__main__":
  main()

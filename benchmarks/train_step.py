"""How fast is our train step? Target tokens/s, achieved FLOP/s against this machine's matmul
peak, and a strong plain Flax Linen reference, all measured in one run, in two modes:

    python benchmarks/train_step.py [--mode both|packed|full_rows] [--layers 2] ...

  packed      (today's end-to-end comparison) ours on one packed batch, the reference on the
              *same sentences* one per row, padded to the batch's longest source / target:
              same real target tokens, but the reference spends compute on padding. Most of
              this ratio is packing.
  full_rows   both models on the *same* batch of fully-filled rows: every row one sentence
              pair whose source and target fill all max_len slots (segment ids all 1,
              positions 0..max_len-1, no padding, no packing), so the ratio isolates per-slot
              speed: how fast each implementation turns a real token into a training update.
`--mode both` (the default) runs both and prints both ratios.

Measures (after compilation; best of --reps steps, median shown too):
  peak        a jitted [--matmul_size]^2 matmul in float32 (and bfloat16 where the hardware
              has it): the denominator of "fraction of peak".
  ours        `train_step.jit_train_step` exactly as `train.py` builds it (sharded state on a
              1-device mesh, Adam, label smoothing 0.1, dropout 0.1) on [1, batch_tokens /
              max_len rows, max_len]: packed by the training pipeline's own first-fit packer
              (`input_pipeline.packed_rows`, 256 open rows), or full rows.
  reference   what a strong user writes, in the style of google/flax examples/wmt: a Linen
              encoder-decoder of `nn.MultiHeadDotProductAttention`, `nn.Dense`, `nn.LayerNorm`
              with our dimensions, biases and post-LN, tied embeddings, dropout 0.1, Adam (our
              optimizer) and label-smoothed cross-entropy over non-pad tokens, jitted with the
              state donated. Like examples/wmt it is packing-aware (segment-id masks and
              per-sentence positions when the batch has them): on full rows it gets the very
              batch ours gets; in packed mode it gets the padded batch described above.
              Its code: benchmarks/_linen_reference.py.

Sentence lengths (packed mode): (source, target) word counts of the real newstest2014 EN-DE
pairs (../shared/data/news/en-de/newstest2014.{en,de}) times --tokens_per_word (1.4, about
what a 37k BPE gives on WMT news: mean ~27 tokens) plus EOS, drawn in random order; a
log-normal with mean ~27 tokens (sigma 0.5) if the files are absent. Token ids are random.

Useful FLOPs per step, counted analytically over real (non-pad) tokens only, the same for
both models (so FLOP/s ratios equal token/s ratios); in full_rows mode every slot is real
(s_i = t_i = max_len):
  6 x P_enc x S                                     encoder layers
  + 6 x (P_dec - P_xkv) x T + 6 x P_xkv x S         decoder layers; cross-attention keys and
                                                    values (P_xkv) are projected per source token
  + 6 x d_model x V x T                             output projection onto the vocabulary
  + 12 x d_attn x (L_enc x sum s_i^2 + L_dec x sum (t_i^2 + t_i s_i))   attention scores and
                                                    weighted values (forward 4 x, backward 8 x)
P_* are parameter counts of our model (biases and LayerNorm included, embeddings excluded),
S / T the real source / target tokens, s_i / t_i one sentence's lengths, d_attn =
heads x head_dim, V the vocabulary. Causal self-attention is counted in full (t_i^2), as
in the PaLM MFU convention. Packed rows compute attention across the whole row; that extra
work is not counted as useful.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grain  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import _timing  # noqa: E402
from benchmarks._linen_reference import ReferenceTransformer, reference_train_step  # noqa: E402
from transformer_mt.config import defaults as _defaults  # noqa: E402
from transformer_mt.data import input_pipeline  # noqa: E402
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID  # noqa: E402
from transformer_mt.model.transformer import parameter_shapes  # noqa: E402
from transformer_mt.model.transformer_config import TransformerConfig  # noqa: E402
from transformer_mt.runtime import sharding  # noqa: E402
from transformer_mt.training import optimizer, train_step  # noqa: E402
from transformer_mt.training.setup import training_setup  # noqa: E402

NEWS = ROOT.parent / "shared" / "data" / "news" / "en-de" / "newstest2014"


# ---------------------------------------------------------------------------------------------
# Sentences, packed (ours) and padded (reference)
# ---------------------------------------------------------------------------------------------


def sentence_lengths(max_len: int, tokens_per_word: float, seed: int) -> tuple[np.ndarray, str]:
  """(source, target) token lengths [n, 2] in random order, each in [2, max_len], and a label."""
  rng = np.random.default_rng(seed)
  source, target = NEWS.with_suffix(".en"), NEWS.with_suffix(".de")
  if source.exists() and target.exists():
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


def full_rows_batch(rows: int, max_len: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
  """[1, rows, max_len]: one sentence pair per row filling every slot, in the packed layout
  (segment ids all 1, positions 0..max_len-1, targets_in = BOS + targets[:-1])."""
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


# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------


def parameter_groups(config: TransformerConfig) -> dict[str, int]:
  """Non-embedding parameter counts: encoder layers, decoder layers, cross-attention K/V."""
  shapes = parameter_shapes(config)
  counts = {"encoder": 0, "decoder": 0, "cross_kv": 0}
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
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
  """The docstring's formula, term by term, for one step over these sentences."""
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
# Measurement
# ---------------------------------------------------------------------------------------------


def ours_timer(config, label_smoothing, reps):
  """Builds our state and jitted step once; the returned function times it on a batch
  [1, rows, max_len] (one compilation per batch shape, the state carried across batches)."""
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1}), devices=jax.devices()[:1]
  )
  setup = training_setup(_defaults.base_config(), None, mesh, model_config=config)
  step = train_step.jit_train_step(
    setup.model, setup.tx, setup.schedule, label_smoothing, mesh, setup.state_shardings
  )
  holder = {"state": train_step.create_sharded_state(0, setup.model, setup.tx, mesh)}

  def time_batch(batch):
    device_batch = sharding.global_batch_from_local(batch, mesh, batch_dim=1)

    def call():
      holder["state"], metrics = step(holder["state"], device_batch)
      return metrics

    return _timing.time_calls(call, warmup=1, reps=reps)

  return time_batch


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

    return _timing.time_calls(call, warmup=1, reps=reps)

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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--mode",
    default="both",
    choices=["both", "packed", "full_rows"],
    help="packed: ours packed vs the reference padded; full_rows: both on the same full rows",
  )
  parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers")
  parser.add_argument("--d_model", type=int, default=512)
  parser.add_argument("--d_ff", type=int, default=2048)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--vocab_size", type=int, default=37000)
  parser.add_argument("--batch_tokens", type=int, default=2048, help="target slots per step")
  parser.add_argument("--max_len", type=int, default=128)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--tokens_per_word", type=float, default=1.4)
  parser.add_argument("--reps", type=int, default=3, help="timed steps per model and mode")
  parser.add_argument("--matmul_size", type=int, default=2048)
  parser.add_argument("--skip_reference", action="store_true")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

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
  modes = ["packed", "full_rows"] if args.mode == "both" else [args.mode]
  lengths, length_source = sentence_lengths(args.max_len, args.tokens_per_word, args.seed)
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
  if _timing.hardware_has_bf16():
    dtypes["bfloat16"] = jnp.bfloat16
  load_before = os.getloadavg()[0]
  peaks = {name: _timing.matmul_peak(args.matmul_size, dtype) for name, dtype in dtypes.items()}
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
    name: tuple(map(max, peaks[name], _timing.matmul_peak(args.matmul_size, dtype)))
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
    for name, timing in results[mode].items():
      achieved = timing.rate(flops["total"])
      cpu_fraction = timing.cpu_rate(flops["total"]) / cpu_peak
      label = f"{mode} {name} ({args.dtype})"
      print(
        f"{label:30}{timing.best:10.3f} / {timing.median:7.3f}"
        f"{timing.rate(target_tokens):13,.0f}{achieved / 1e9:9.1f}{achieved / peak:9.1%}"
        f"{cpu_fraction:19.1%}"
      )
      record[mode][name] = {
        "step_seconds": timing.best,
        "step_seconds_median": timing.median,
        "target_tokens_per_second": timing.rate(target_tokens),
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

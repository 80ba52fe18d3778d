"""One command for the minutes an accelerator is lent: what the paper's models do on it.

    python benchmarks/accelerator.py            # Base and Big, ~5-8 minutes on one H100/H200
    python benchmarks/accelerator.py --tiny     # the same program at toy sizes (CI, on CPU)
    python benchmarks/accelerator.py --sections big,levers   # only these (a rerun of failures)

Prints, for the first device:
  * its kind;
  * the Base and the Big train step in bfloat16 (`model.dtype="auto"`: bfloat16 compute on a
    GPU or TPU, float32 parameters, Adam and loss; float32 on a CPU, whose XLA runtime has no
    bf16 x bf16 -> f32 matmul at these sizes): target tokens/s on full rows (one sentence
    pair filling each packed row, no padding), MFU against the device's published dense
    bf16 peak (harness.steps.PEAK_BF16, by device kind; "n/a" for a device not in the table,
    such as a CPU), and the step's memory as XLA's analysis of the very program timed reports it
    (arguments, outputs and temporaries; the process's peak so far, `memory_stats()`, beside
    it, is cumulative: Big's line includes what Base took);
  * beam-4 decoding of the Base model as users run it (the experiment defaults' decode
    section through the Translator: on a GPU or TPU cache_reorder "auto" is "gather"), target
    tokens/s: random weights seldom emit EOS, so every sentence runs to its length limit
    (source + 50), an upper bound on the work;
  * the same decoding, then with each decode lever of DECODE_LEVERS changed alone (the cache
    reorders, the growing cache, the shrinking batch, the transposed cross keys, the blocked
    top-k): target tokens/s, the ratio to the defaults, compile seconds, and whether the best
    hypotheses are the defaults';
  * our beam 4 against transformers' `generate` on a Base-shaped Marian model, same weights,
    256 sentences, bf16 on both sides (benchmarks/harness/models.py);
  * which attention implementation XLA chose for the training attention (a cuDNN fused
    attention custom call in the compiled program, or XLA's own dot/softmax ops);
  * whether a bfloat16 step's loss is within BF16_TOLERANCE (relative) of float32's, on the
    same parameters and batch (on a CPU at the toy size of tests/test_bf16.py, which XLA:CPU
    compiles; at --tiny, TINY's Base shape, as on a GPU);
  * the Base step on packed rows (several pairs a row, padding) under each attention
    implementation: time, fused kernels compiled, loss and gradient norm against "auto"
    (benchmarks/harness/packed_attention.py; what decides whether "auto" may pick cuDNN's packed
    kernel);
  * on a GPU, the Base step under XLA's GPU flags (Triton GEMMs, command buffers) and with
    model.fuse_qkv, each in its own process, as ratios (benchmarks/harness/xla_gpu_flags.py);
  * the Base step with each of issue 42's levers on alone (LEVERS: unsafe_rbg dropout, the
    chunked loss, the vocabulary padded to 128, fused Q/K/V), beside the plain Base line;
  * Base and Big with all of them on and cuDNN attention (on a GPU), at the paper's 3.1k target
    tokens per GPU (12 rows of 256), at SIZES' rows and at twice them.
Each is a named section (--sections), run in this order.

Useful FLOPs are counted by benchmarks/harness/steps.py's `useful_flops` (parameters x tokens
x 6, the vocabulary projection, and the attention scores over the full rows), as train_step.py
and torch_reference.py count them. Nothing is asserted about speed: figures depend on the
machine. tests/test_benchmarks.py runs `--tiny` on CPU so this script cannot rot before an
accelerator is lent; at --tiny, "levers" and "decode_levers" run one lever each and
"combined" one batch size.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402

from benchmarks.harness import models, packed_attention, timing, xla_gpu_flags  # noqa: E402
from benchmarks.harness.steps import (  # noqa: E402
  SIZES,
  TINY,
  TrainStepBench,
  full_rows_batch,
  model_config,
  one_device_mesh,
  peak_of,
  useful_flops,
)
from transformer_mt.config import defaults as _defaults  # noqa: E402
from transformer_mt.decoding import beam_decode, translator  # noqa: E402
from transformer_mt.decoding.settings import decode_settings  # noqa: E402
from transformer_mt.model import attention  # noqa: E402
from transformer_mt.model.transformer import Transformer  # noqa: E402
from transformer_mt.runtime import sharding  # noqa: E402
from transformer_mt.training import train_step  # noqa: E402
from transformer_mt.training.setup import training_setup  # noqa: E402

# |loss_bf16 / loss_f32 - 1| allowed: bf16 has an 8-bit mantissa (relative steps of 2^-8 =
# 0.4% per rounding), and LayerNorm statistics, softmax, logits and loss stay float32.
BF16_TOLERANCE = 0.02

# Issue 42's levers of the train step, each on alone: name -> (TransformerConfig changes,
# config.train changes). Off is the plain Base line.
LEVERS = {
  "": ({}, {}),
  "unsafe_rbg dropout": ({}, {"prng_impl": "unsafe_rbg"}),
  "chunked loss 8192": ({}, {"loss_chunk_tokens": 8192}),
  "vocabulary padded to 128": ({"vocab_pad_multiple": 128}, {}),
  "fused Q/K/V": ({"fuse_qkv": True}, {}),
}
# Every lever of LEVERS on at once (the "combined" section).
LEVERS["all levers"] = tuple(
  {key: value for changes in LEVERS.values() for key, value in changes[side].items()}
  for side in (0, 1)
)
# The one lever of the "levers" section at --tiny: TINY's vocabulary (256) is a multiple of 128
# already, so its step is the plain Base step's program, which a compilation cache (the tests')
# serves; the "combined" section compiles every lever's changes.
TINY_LEVER = "vocabulary padded to 128"
# Target tokens per GPU of the paper's batch (25k over 8 GPUs): rows of 256 at the "combined"
# section's smallest batch.
PAPER_ROWS = 12
# The printed sections, in their order (--sections picks some).
SECTIONS = (
  "base",
  "big",
  "decode",
  "decode_levers",
  "generate",
  "attention",
  "bf16",
  "cudnn",
  "packed",
  "xla_flags",
  "levers",
  "combined",
)
# The decode section's levers (issue 57), each changed alone from what users run (the
# defaults' decode section through the Translator): name -> (beam_decode arguments,
# TransformerConfig changes). "cache_reorder ancestry" keeps the growing cache of
# beam_decode.GROW_CACHE_FROM_BYTES, which the next row turns off; a lever that is the default
# on the device is not timed twice.
DECODE_LEVERS = {
  "cache_reorder gather": ({"cache_reorder": "gather"}, {}),
  "cache_reorder chunked": ({"cache_reorder": "chunked"}, {}),
  "cache_reorder ancestry": ({"cache_reorder": "ancestry"}, {}),
  "cache_reorder ancestry, cache never grown": (
    {"cache_reorder": "ancestry", "grow_cache_from_bytes": None},
    {},
  ),
  "shrink_batch off": ({"shrink_batch": False}, {}),
  "cross keys not transposed": ({}, {"cross_keys_transposed": False}),
  "blocked top-k off (jax.lax.top_k)": ({"blocked_top_k": False}, {}),
}
# The one decode lever at --tiny: the GPU's and TPU's default reorder, where a CPU's is
# "ancestry" (TINY's 256-entry vocabulary is below vocab_top_k.BLOCKED_FROM: top-k is not
# blocked there).
TINY_DECODE_LEVER = "cache_reorder gather"
# The decode section's compiled programs, by their static arguments and batch shape.
_COMPILED_DECODES = {}
# The bf16 check's model on a CPU (but at --tiny, TINY's Base): test_bf16.py's size.
CPU_BF16_CHECK = (32, 64, 4, 2, 64, 8, 12)


def peak_memory() -> str:
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return f"{peak / 2**30:.2f} GiB" if peak else "n/a (not reported by this backend)"


def train_step_figures(name, size, reps, peak, attention_implementation="auto", lever=""):
  """One model's train step in "auto" precision: tokens/s, MFU and peak memory, one line.
  `lever`: a key of LEVERS, the step with that switch on (issue 42)."""
  model_changes, train_changes = LEVERS[lever]
  config = model_config(size, "auto", attention_implementation).replace(**model_changes)
  rows, max_len = size[5], size[6]
  bench = TrainStepBench(config, train_changes)
  batch = full_rows_batch(rows, max_len, config.vocab_size, seed=0)
  step_timing = bench.time(batch, warmup=2, reps=reps)
  tokens = rows * max_len
  lengths = np.full(rows, max_len)
  flops = useful_flops(config, lengths, lengths)["total"]
  mfu = f"{flops / step_timing.best / peak:.1%}" if peak else "n/a (no published peak)"
  print(
    f"{name} train step{f' ({lever})' if lever else ''}, {config.dtype}, "
    f"attention {attention_implementation}, "
    f"{rows} x {max_len} target tokens: "
    f"{step_timing.best * 1e3:.1f} ms "
    f"(median {step_timing.median * 1e3:.1f}), {tokens / step_timing.best:,.0f} tokens/s, "
    f"{flops / step_timing.best / 1e12:.2f} TFLOP/s useful, MFU {mfu}, "
    f"XLA's peak for the step {bench.memory(batch) / 2**30:.2f} GiB "
    f"(process peak so far {peak_memory()})"
  )


def lever_figures(size, reps, peak, tiny=False):
  """The Base step with each lever of LEVERS on alone, a line each (the plain step is "base");
  `tiny`: TINY_LEVER only (the "combined" section compiles every lever's changes at once)."""
  levers = [lever for lever in LEVERS if lever and lever != "all levers"]
  for lever in [TINY_LEVER] if tiny else levers:
    train_step_figures("Base", size, reps, peak, lever=lever)


def combined_figures(sizes, reps, peak, attention_implementation, tiny=False):
  """Base and Big with every lever on and `attention_implementation` (cuDNN on a GPU), at the
  paper's 3.1k target tokens per GPU, at SIZES' rows and at twice them: a line each
  (`tiny`: at TINY's rows only)."""
  for name in ("Base", "Big"):
    size = sizes[name]
    row_counts = {size[5]} if tiny else {min(PAPER_ROWS, size[5]), size[5], 2 * size[5]}
    for rows in sorted(row_counts):
      shape = (*size[:5], rows, size[6])
      train_step_figures(name, shape, reps, peak, attention_implementation, lever="all levers")


def decode_translator(size, sentences):
  """A Translator of the Base model with random weights (float32 parameters, compute in "auto")
  under the experiment defaults' decode section (`settings.decode_settings`), as `run.py
  translate` builds it, batches of `sentences`."""
  config = model_config(size, "auto").replace(deterministic=True)
  mesh = one_device_mesh()
  dummy = jnp.ones((1, 2), jnp.int32)
  params = nn.unbox(jax.jit(Transformer(config).init)(jax.random.key(0), dummy, dummy)["params"])
  settings = decode_settings(_defaults.base_config())
  return translator.Translator(
    params=jax.device_put(params, sharding.replicated(mesh)),
    model_config=config,
    tokenizer=None,  # ids in, ids out: nothing to tokenize
    mesh=mesh,
    **dict(settings, batch_size=sentences),
  )


def decode_figures(size, reps, sentences=64, source_len=32, levers=()):
  """Beam search of the Base model as users run it, then with each of `levers` (keys of
  DECODE_LEVERS) changed: a line each, target tokens/s (the defaults' first).

  The batch is the Translator's (`padded_batch`) for `sentences` random sources of 2 to
  `source_len` tokens, each allowed its source length + decode.extra_len target tokens:
  random weights seldom emit EOS, so a sentence ends at its limit, and the batch shrinks as the
  shorter ones end. The defaults are beam_decode's arguments as `Translator._decoder` passes
  them under the defaults' decode section (`Translator.beam_decode_options`: cache_reorder
  "auto" resolved for this device and batch, the shrinking batch) with beam_decode's own
  defaults for the rest (the growing cache, transposed cross keys, blocked top-k)."""
  decoder = decode_translator(size, sentences)
  rng = np.random.default_rng(0)
  eos, vocab = decoder.model_config.eos_id, decoder.model_config.vocab_size
  sources = [
    [*rng.integers(4, vocab, size=length - 1).tolist(), eos]
    for length in rng.integers(2, source_len + 1, size=sentences)
  ]
  inputs, max_lengths, max_len = decoder.padded_batch(sources)
  mesh = decoder.mesh
  inputs = jax.device_put(inputs, sharding.batch_sharding(mesh))
  max_lengths = jax.device_put(max_lengths, sharding.batch_sharding(mesh, 1))
  defaults = dict(
    decoder.beam_decode_options(inputs.shape[0]),
    config=decoder.decoder_config,
    beam_size=decoder.beam_size,
    max_len=max_len,
    alpha=decoder.alpha,
  )

  def run(options):
    """(outputs, Timing, compile seconds) of beam_decode with `options` (each program compiled
    once a process: the "decode_levers" section times the defaults of "decode" again)."""
    start = time.perf_counter()
    key = (inputs.shape, *sorted(options.items()))
    if key not in _COMPILED_DECODES:
      _COMPILED_DECODES[key] = beam_decode.beam_decode.lower(
        decoder.params, inputs, max_lengths=max_lengths, **options
      ).compile()
    compiled = _COMPILED_DECODES[key]
    compile_s = time.perf_counter() - start
    call = lambda: compiled(decoder.params, inputs, max_lengths=max_lengths)  # noqa: E731
    return call(), timing.time_calls(call, warmup=1, reps=reps), compile_s

  with jax.set_mesh(mesh):
    reference, best, compile_s = run(defaults)
    sequences = np.asarray(reference.sequences)[: len(sources)]
    tokens = int((sequences != decoder.model_config.pad_id).sum())
    print(
      f"Base beam-{decoder.beam_size} decode, {decoder.model_config.dtype}, {len(sources)} "
      f"sentences of 2-{source_len} tokens, up to {max_len} out, {tokens} target tokens; "
      f"defaults (cache_reorder {decoder.cache_reorder} = {defaults['cache_reorder']}, "
      f"shrink_batch {defaults['shrink_batch']}, cache grown from "
      f"{beam_decode.GROW_CACHE_FROM_BYTES / 2**20:g} MiB a layer under ancestry, cross keys "
      f"transposed, blocked top-k): {tokens / best.best:,.0f} target tokens/s "
      f"({len(sources) / best.best:,.1f} sentences/s), compile {compile_s:.1f} s"
    )
    for lever in levers:
      options, model_changes = DECODE_LEVERS[lever]
      changed = dict(defaults, **options)
      changed["config"] = defaults["config"].replace(**model_changes)
      if changed == defaults:
        print(f"  {lever}: the defaults on this device")
        continue
      outputs, lever_timing, compile_s = run(changed)
      same = np.mean(np.all(np.asarray(outputs.sequences)[: len(sources)] == sequences, axis=1))
      print(
        f"  {lever}: {tokens / lever_timing.best:,.0f} target tokens/s, "
        f"{best.best / lever_timing.best:.2f}x the defaults, compile {compile_s:.1f} s, "
        f"the defaults' best hypothesis for {same:.0%} of sentences"
      )


def attention_choice(size) -> str:
  """What the compiled training attention (causal, packed-row mask) runs on."""
  config = model_config(size, "auto")
  rows, max_len = size[5], size[6]
  shape = (rows, max_len, config.num_heads, config.per_head_dim)
  q = k = v = jnp.zeros(shape, config.compute_dtype)
  valid = jnp.ones((rows, max_len), bool)
  segments = valid.astype(jnp.int32)
  mask = attention.AttentionMask(valid, valid, segments, segments, causal=True)
  text = (
    jax.jit(lambda q, k, v: attention.fused_attention(q, k, v, mask, "auto"))
    .lower(q, k, v)
    .compile()
    .as_text()
  )
  if "cudnn" in text.lower() or "fmha" in text.lower():
    return "cuDNN fused attention (a custom call in the compiled program)"
  return "XLA's own ops (dot, softmax, dot): no fused attention kernel"


def bf16_loss_check(size, attention_implementations=("auto",)) -> str:
  """bf16 vs f32 evaluation loss on the same parameters and batch, for each attention
  implementation given (bf16 only: cuDNN's fused attention takes no f32)."""
  rows, max_len = size[5], size[6]
  mesh = one_device_mesh()
  batch = full_rows_batch(rows, max_len, size[4], seed=1)
  device_batch = sharding.global_batch_from_local(batch, mesh, batch_dim=1)
  losses = {}
  params = None
  runs = [("float32", "auto")] + [("bfloat16", a) for a in attention_implementations]
  for dtype, implementation in runs:
    config = model_config(size, dtype, implementation)
    setup = training_setup(_defaults.base_config(), None, mesh, model_config=config)
    if params is None:
      params = train_step.create_sharded_state(0, setup.model, setup.tx, mesh).params
    sums = train_step.jit_eval_step(setup.model, mesh, setup.state_shardings)(params, device_batch)
    losses[dtype, implementation] = float(sums["nll"]) / float(sums["num_tokens"])
  reference = losses["float32", "auto"]
  lines = []
  for implementation in attention_implementations:
    loss = losses["bfloat16", implementation]
    relative = abs(loss / reference - 1)
    verdict = "within" if relative <= BF16_TOLERANCE else "OUTSIDE"
    lines.append(
      f"bf16 loss (attention {implementation}) {loss:.5f} vs f32 {reference:.5f}: relative "
      f"difference {relative:.2e}, {verdict} the tolerance {BF16_TOLERANCE}"
    )
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tiny", action="store_true", help="toy sizes: the CI run on CPU")
  parser.add_argument("--reps", type=int, default=None, help="timed steps (default 10, tiny 2)")
  parser.add_argument(
    "--sections",
    default="",
    help=f"comma-separated sections to run, in their order (default: all): "
    f"{', '.join(SECTIONS)}; a rerun takes only what failed",
  )
  args = parser.parse_args(argv)
  chosen = args.sections.split(",") if args.sections else list(SECTIONS)
  unknown = [name for name in chosen if name not in SECTIONS]
  if unknown:
    parser.error(f"--sections: no section {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
  sizes = TINY if args.tiny else SIZES
  reps = args.reps or (2 if args.tiny else 10)
  start = time.perf_counter()
  device = jax.devices()[0]
  peak = peak_of(device.device_kind)
  peak_text = f"{peak / 1e12:.0f} TFLOP/s dense bf16" if peak else "no published bf16 peak"
  print(f"device: {device.device_kind} ({device.platform}, {peak_text}), jax {jax.__version__}")
  print(f"sizes ({'tiny, for CI' if args.tiny else 'the paper'}): {sizes}")
  on_cpu = jax.default_backend() == "cpu"
  decode_batch = (8, 8) if args.tiny else (64, 32)  # sentences, longest source
  sections = {
    "base": lambda: train_step_figures("Base", sizes["Base"], reps, peak),
    "big": lambda: train_step_figures("Big", sizes["Big"], reps, peak),
    # Beam 4 as users run it (the defaults' decode section).
    "decode": lambda: decode_figures(sizes["Base"], reps, *decode_batch),
    # The same, then each decode lever changed alone (at --tiny TINY_DECODE_LEVER only).
    "decode_levers": lambda: decode_figures(
      sizes["Base"],
      reps,
      *decode_batch,
      levers=[TINY_DECODE_LEVER] if args.tiny else list(DECODE_LEVERS),
    ),
    # Issue 42's decoding anchor: our beam 4 against transformers' generate, same weights.
    "generate": lambda: print(
      "\n".join(models.comparison_lines(8 if args.tiny else 256, min(reps, 3), args.tiny))
    ),
    "attention": lambda: print(f"attention: {attention_choice(sizes['Base'])}"),
    "bf16": lambda: print(
      bf16_loss_check(
        CPU_BF16_CHECK if on_cpu and not args.tiny else sizes["Base"],
        ("auto",) if on_cpu else ("auto", "cudnn"),
      )
    ),
    # The cuDNN fused attention asked for by name (model.attention_implementation="cudnn"),
    # which "auto" may not pick: CI never sees it, so a lent GPU is where it is tried.
    "cudnn": lambda: (
      print("cudnn: GPU only")
      if on_cpu
      else train_step_figures("Base", sizes["Base"], reps, peak, "cudnn")
    ),
    # Packed rows under every attention implementation (lever b): whether "auto" may pick
    # cuDNN's packed kernel (fused_kernels.AUTO_PICKS_CUDNN_PACKED_ON_GPU).
    "packed": lambda: print(
      "\n".join(
        packed_attention.comparison_lines(
          model_config(sizes["Base"], "auto"), *sizes["Base"][5:7], reps=min(reps, 5)
        )
      )
    ),
    # XLA's GPU flags and model.fuse_qkv (lever e), each variant in its own process; off a GPU
    # one line says they are GPU-only.
    "xla_flags": lambda: print(
      "\n".join(
        xla_gpu_flags.ab_lines(
          tiny=args.tiny and not on_cpu, reps=reps, backend=jax.default_backend()
        )
      )
    ),
    # Levers c, d and e of the Base step, each on alone, beside the "base" line.
    "levers": lambda: lever_figures(sizes["Base"], reps, peak, args.tiny),
    # Every lever at once with cuDNN attention (on a GPU), Base and Big, three batch sizes.
    "combined": lambda: combined_figures(
      sizes, reps, peak, "auto" if on_cpu else "cudnn", args.tiny
    ),
  }
  assert tuple(sections) == SECTIONS
  failed = 0
  for section in (sections[name] for name in chosen):
    # A lent accelerator's minutes are few: one figure that fails (a backend's missing kernel,
    # say) prints its traceback and the others still come; the exit status says it failed.
    try:
      section()
    except Exception:
      traceback.print_exc()
      failed += 1
    sys.stdout.flush()
  print(
    f"total {time.perf_counter() - start:.0f} s"
    + (f", {failed} section(s) FAILED" if failed else "")
  )
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())

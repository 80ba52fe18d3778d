"""How fast is beam search? Sentences/s and generated tokens/s on newstest2014 and compile time
per length bucket; with `--regime issue`, against transformers' `generate` and the compute floor.

    python benchmarks/decode.py [--workdir W | --experiment news_ende_small] [--sentences 100]
                                [--batch_size 32] [--beam_sizes 1,4,8] [--reps 1] [--data_root D]
    python benchmarks/decode.py --regime issue [--reps 2]
    python benchmarks/decode.py --tiny [--regime issue]   # toy model, no data, seconds (CI)

--tiny decodes 8 generated sentences of a few words with a 1+1-layer d_model-32 random model
(the issue regime: 1+1 layers at toy widths, 8 sentences). --regime issue measures only the
fixed regime of issue 13 (item 8), no data needed (benchmarks/harness/models.py): a random
Marian model (2+2 layers, d_model 512, d_ff 2048, 8 heads, vocabulary 32000), 32 sentences of
32 random source tokens, beam 4, exactly 64 generated tokens (EOS set outside the vocabulary on
both sides, so nothing ends early). In this process: our beam_decode (transformers' scoring,
candidate_pool "hf"), transformers' MarianMTModel.generate on the same weights (num_beams 4,
use_cache, torch.inference_mode; torch on all the cores this process may use and on one thread,
the faster counts; skipped with a line when transformers or torch is missing), both after a
warm-up, best of --reps; sentences/s, the ratio (wall and CPU time), how many sentences got the
same best hypothesis on both sides, and the compute floor: the matmul FLOPs per sentence
(formula printed: decoder projections, FFN, attention scores/values and vocabulary projection
per generated token and beam; encoder and cross-attention keys/values once per sentence)
divided by the f32 matmul peak measured here (harness.timing.matmul_peak), with our share of it
(and the same per CPU-second, which other processes on a shared machine disturb less).

Input: the first --sentences lines of news/en-de/newstest2014.en under --data_root (default
../shared/data beside the repository; `sacrebleu -t wmt14/full -l en-de --echo src` prints it). With
--workdir, the checkpoint's model and tokenizer (loading.load_translator). Without, a random-init
model of --experiment and a SentencePiece vocabulary of its size trained on 20k sentences of its
training text (~10 s, not timed). A random-init model does not emit EOS (the tables count the
hypotheses that do), so every sentence is decoded to its maximum length, source length + 50 tokens:
a worst case for time per sentence; a trained model stops at EOS, near the source length.

Batching is Translator's: sentences sorted by length, --batch_size per batch, sources padded to
16-token buckets, max_len = min(decode.max_len, bucket + 50), each sentence capped at its own
length + 50. Times are wall clock, best of --reps (run time) on a possibly shared machine; the load
average is printed. Measured in this process:

  beam sizes      beam 1 (greedy_decode, which Translator uses for beam 1; it has no per-sentence
                  cap, so a random-init model fills max_len), 4 and 8 over the whole input:
                  sentences/s and generated tokens/s (non-pad tokens of the returned hypotheses,
                  EOS included) after compilation, the compile time the run needed (summed over
                  its shapes) and its share of compile + run.
  source length   one full batch per source bucket at beam 4: run time, ms per decoder step and
                  compile time. Compile = `jax.jit(...).lower(...).compile()`, what the first call
                  with a new shape adds to the run (tracing + XLA); later calls reuse it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.harness import corpus, models, timing  # noqa: E402
from transformer_mt.config import registry  # noqa: E402
from transformer_mt.data import sources as data_sources  # noqa: E402
from transformer_mt.data.input_pipeline import bucket_length  # noqa: E402
from transformer_mt.data.tokenizer import EOS_ID, PAD_ID  # noqa: E402
from transformer_mt.decoding import (
  beam_decode,  # noqa: E402
  loading,
)
from transformer_mt.decoding import incremental as decode
from transformer_mt.decoding import translator as translate
from transformer_mt.decoding.settings import decode_settings  # noqa: E402
from transformer_mt.runtime import sharding  # noqa: E402

TEST_SET = "news/en-de/newstest2014.en"  # under --data_root
SOURCE_BUCKETS = (16, 32, 48, 64)
# --tiny: the experiment at toy size, on generated text (its sentences and tokenizer).
TINY_MODEL = models.TINY_MODEL


def load_model(args):
  """A Translator (params, model config, tokenizer, mesh, decode settings) and a description."""
  if args.workdir:
    translator = loading.load_translator(args.workdir)
    return translator, f"checkpoint {args.workdir}"
  if args.tiny:
    overrides = [*TINY_MODEL, "data.source='local'", f"data.root={args.data_root!r}"]
    overrides += ["data.train_prefixes=['tiny']", "data.validation_prefixes=[]"]
    config = registry.load_experiment(args.experiment, overrides + ["data.test_prefixes=[]"])
  else:
    config = registry.load_experiment(args.experiment)
  if config.data.source == "local":
    config.data.root = args.data_root
  mesh = sharding.make_mesh(sharding.inference_mesh_config())
  sample = 1000 if args.tiny else models.VOCABULARY_SAMPLE
  setup, params, tokenizer = models.random_model(config, mesh, sample)
  params = jax.device_put(params, sharding.replicated(setup.mesh))
  translator = translate.Translator(
    params=params,
    model_config=setup.model_config,
    tokenizer=tokenizer,
    mesh=setup.mesh,
    **decode_settings(config),
  )
  return translator, f"random init of {args.experiment}"


def make_batch(translator, sources):
  """The Translator's padded batch on its mesh: (inputs, max_lengths, max_len) for beam_decode."""
  inputs, max_lengths, max_len = translator.padded_batch(sources)
  mesh = translator.mesh
  return (
    jax.device_put(inputs, sharding.batch_sharding(mesh)),
    jax.device_put(max_lengths, sharding.batch_sharding(mesh, 1)),
    max_len,
  )


class Decoder:
  """Compiles each (beam, shape) once, ahead of time, timing the compilation on its own."""

  def __init__(self, translator, reps):
    self.t, self.reps, self.compiled, self.compile_seconds = translator, reps, {}, {}

  def __call__(self, beam, inputs, max_lengths, max_len):
    """(outputs, run Timing, compile seconds, or 0 when this shape was compiled before)."""
    t = self.t
    key = (beam, inputs.shape, max_len)
    compile_seconds = 0.0
    with jax.set_mesh(t.mesh):
      if key not in self.compiled:
        start = time.perf_counter()
        if beam == 1:
          lowered = decode.greedy_decode.lower(
            t.params, inputs, config=t.model_config, max_len=max_len
          )
        else:
          lowered = beam_decode.beam_decode.lower(
            t.params,
            inputs,
            config=t.model_config,
            beam_size=beam,
            max_len=max_len,
            alpha=t.alpha,
            max_lengths=max_lengths,
          )
        self.compiled[key] = lowered.compile()
        compile_seconds = self.compile_seconds[key] = time.perf_counter() - start
      run, outputs = self.compiled[key], []

      def call():
        outputs[:] = [
          run(t.params, inputs) if beam == 1 else run(t.params, inputs, max_lengths=max_lengths)
        ]
        return outputs[0]

      run_timing = timing.time_calls(call, warmup=0, reps=self.reps)
    return outputs[0], run_timing, compile_seconds


def hypothesis_stats(outputs, num_real):
  """(generated tokens, hypotheses ending in EOS, decoder steps) of the first num_real rows."""
  sequences = outputs if isinstance(outputs, jax.Array) else outputs.sequences
  sequences = np.asarray(sequences)[:num_real]
  steps = sequences.shape[1] if isinstance(outputs, jax.Array) else int(outputs.num_steps)
  return int((sequences != PAD_ID).sum()), int((sequences == EOS_ID).any(axis=1).sum()), steps


def beam_sizes_table(decoder, translator, encoded, beam_sizes):
  order = sorted(encoded, key=len)
  size = translator.batch_size
  batches = [order[i : i + size] for i in range(0, len(order), size)]
  results = {}
  for beam in beam_sizes:
    run = compile_s = 0.0
    tokens = eos = 0
    for sources in batches:
      inputs, max_lengths, max_len = make_batch(translator, sources)
      outputs, timing, seconds = decoder(beam, inputs, max_lengths, max_len)
      run, compile_s = run + timing.best, compile_s + seconds
      batch_tokens, batch_eos, _ = hypothesis_stats(outputs, len(sources))
      tokens, eos = tokens + batch_tokens, eos + batch_eos
    results[beam] = {
      "sentences_per_s": len(encoded) / run,
      "tokens_per_s": tokens / run,
      "run_s": run,
      "compile_s": compile_s,
      "tokens": tokens,
      "ended_in_eos": eos,
    }
  buckets = sorted({bucket_length(max(len(s) for s in b)) for b in batches})
  print(
    f"\nBeam sizes: {len(encoded)} sentences in {len(batches)} batches of "
    f"{translator.batch_size}, source buckets {buckets}"
  )
  print(
    f"{'beam':>5} {'sent/s':>8} {'tokens/s':>9} {'run s':>7} {'compile s':>10} "
    f"{'compile share':>13} {'tokens':>7} {'EOS':>5}"
  )
  for beam, r in results.items():
    share = r["compile_s"] / (r["compile_s"] + r["run_s"])
    print(
      f"{beam:5d} {r['sentences_per_s']:8.2f} {r['tokens_per_s']:9.0f} {r['run_s']:7.2f} "
      f"{r['compile_s']:10.2f} {share:13.0%} {r['tokens']:7d} {r['ended_in_eos']:5d}"
    )
  return results


def source_length_table(decoder, translator, all_encoded, beam, buckets=SOURCE_BUCKETS):
  """One full batch of test-set sentences per source bucket."""
  results = []
  for bucket in buckets:
    sources = [s for s in all_encoded if bucket_length(len(s)) == bucket][: translator.batch_size]
    if len(sources) < translator.batch_size:
      continue
    inputs, max_lengths, max_len = make_batch(translator, sources)
    outputs, timing, _ = decoder(beam, inputs, max_lengths, max_len)
    tokens, eos, steps = hypothesis_stats(outputs, len(sources))
    results.append(
      {
        "bucket": bucket,
        "max_len": max_len,
        "steps": steps,
        "reorders": int(outputs.num_reorders),
        "run_s": timing.best,
        "ms_per_step": 1000 * timing.best / steps,
        "sentences_per_s": len(sources) / timing.best,
        "tokens_per_s": tokens / timing.best,
        "ended_in_eos": eos,
        "compile_s": decoder.compile_seconds[(beam, inputs.shape, max_len)],
      }
    )
  print(f"\nSource length: beam {beam}, one batch of {translator.batch_size} per bucket")
  print(
    f"{'bucket':>6} {'max_len':>7} {'steps':>5} {'reorders':>8} {'run s':>6} {'ms/step':>8} "
    f"{'sent/s':>7} {'tokens/s':>8} {'compile s':>9}"
  )
  for r in results:
    print(
      f"{r['bucket']:6d} {r['max_len']:7d} {r['steps']:5d} {r['reorders']:8d} "
      f"{r['run_s']:6.2f} {r['ms_per_step']:8.1f} {r['sentences_per_s']:7.2f} "
      f"{r['tokens_per_s']:8.0f} {r['compile_s']:9.2f}"
    )
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", help="a checkpoint directory; default: random init")
  parser.add_argument(
    "--experiment",
    default="news_ende_small",
    help="the registry experiment to random-init (without --workdir)",
  )
  parser.add_argument(
    "--data_root",
    default=str(data_sources.DEFAULT_LOCAL_ROOT),
    help="folder holding news/en-de/newstest2014.en (and the experiment's training files); "
    "default: ../shared/data beside the repository",
  )
  parser.add_argument("--sentences", type=int, default=100)
  parser.add_argument(
    "--batch_size",
    type=int,
    default=32,
    help="sentences per batch (the experiment's decode.batch_size if 0)",
  )
  parser.add_argument("--beam_sizes", default="1,4,8")
  parser.add_argument("--reps", type=int, default=1, help="timed runs of each decode (best kept)")
  parser.add_argument(
    "--regime",
    choices=("newstest", "issue"),
    default="newstest",
    help="newstest: the tables below on the test set; issue: only issue 13's fixed regime "
    "against transformers' generate and the compute floor (no data needed)",
  )
  parser.add_argument("--tiny", action="store_true", help="toy model, no data, seconds (CI)")
  args = parser.parse_args(argv)
  print(timing.machine_line())
  if args.regime == "issue":
    load_start = os.getloadavg()[0]
    print(
      f"{jax.device_count()} {jax.default_backend()} device(s); load average {load_start:.1f} "
      f"on {os.cpu_count()} CPUs"
    )
    result = models.issue_table(args.reps, args.tiny)
    load_end = os.getloadavg()[0]
    print(f"load average {load_start:.1f} at the start, {load_end:.1f} at the end")
    result["load_average"] = [load_start, load_end]
    print(json.dumps({"benchmark": "decode", "regime": "issue", **result}))
    return
  if args.tiny:
    with tempfile.TemporaryDirectory(prefix="decode_tiny_") as folder:
      # Short sentences (one source bucket) and a tokenizer trained on the same text.
      corpus.generate_corpus(os.path.join(folder, "tiny"), 1000, seed=0, mean_words=4)
      args.data_root, args.workdir = folder, None
      args.sentences, args.batch_size, args.beam_sizes = 8, 4, "1,4"
      newstest(args, os.path.join(folder, "tiny.en"))
    return
  args.data_root = os.path.abspath(os.path.expanduser(args.data_root))
  args.workdir = args.workdir and os.path.abspath(os.path.expanduser(args.workdir))
  newstest(args, os.path.join(args.data_root, TEST_SET))


def newstest(args, test_set: str) -> None:
  """The beam sizes and source length tables on the first --sentences lines of `test_set`."""
  if not os.path.exists(test_set):
    sys.exit(
      f"error: {test_set} does not exist; pass --data_root DIR. {data_sources.HOW_TO_GET_NEWS}"
    )
  load_start = os.getloadavg()[0]

  translator, model = load_model(args)
  if args.batch_size:
    translator.batch_size = args.batch_size
  with open(test_set, encoding="utf-8") as f:
    lines = [line.strip() for line in f]
  all_encoded = translator.tokenizer.encode(lines)
  encoded = all_encoded[: args.sentences]
  beam_sizes = [int(b) for b in args.beam_sizes.split(",")]
  cfg = translator.model_config
  print(
    f"{model}: d_model {cfg.d_model}, {cfg.num_encoder_layers}+{cfg.num_decoder_layers} "
    f"layers, vocab {cfg.vocab_size}; alpha {translator.alpha}; {jax.device_count()} "
    f"{jax.default_backend()} device(s); load average {load_start:.1f} on "
    f"{os.cpu_count()} CPUs"
  )

  decoder = Decoder(translator, args.reps)
  beams = beam_sizes_table(decoder, translator, encoded, beam_sizes)
  # --tiny: the first bucket only, whose beam-4 program the beam sizes table compiled.
  buckets = SOURCE_BUCKETS[:1] if args.tiny else SOURCE_BUCKETS
  lengths = source_length_table(decoder, translator, all_encoded, beam=4, buckets=buckets)
  load_end = os.getloadavg()[0]
  print(f"load average {load_start:.1f} at the start, {load_end:.1f} at the end")
  print(
    json.dumps(
      {
        "benchmark": "decode",
        "model": model,
        "sentences": len(encoded),
        "batch_size": translator.batch_size,
        "beam_sizes": beams,
        "source_length": lengths,
        "load_average": [load_start, load_end],
      }
    )
  )


if __name__ == "__main__":
  main()

"""Our beam search against CTranslate2 (float32 and int8) on the same weights and sentences.

    python benchmarks/ctranslate2_decode.py        # the Base shape alone, ~2.5 minutes
    python benchmarks/ctranslate2_decode.py --tiny # a 1+1-layer toy shape on generated text (CI)
    python benchmarks/ctranslate2_decode.py [--base_shape] --model tiny=WORKDIR [--model ...]
                                            [--batch_sizes 1,32,128] [--sentences 4,32,128]
                                            [--rounds 1] [--threads 2] [--data_root D]
                                            [--decode KEY=VALUE ...]

The models: the Transformer Base shape (d_model 512, d_ff 2048, 8 heads, 6 + 6 layers) at
random initialization (seed 0) with a SentencePiece vocabulary of the Multi30k recipe's size
trained on 20k Multi30k sentences, written as a workdir into a temporary folder (~20 s, not
timed): without --model, or with --base_shape. Its weights emit no EOS, so every sentence runs
to the limit on every engine: the same work on each side, and the step of a Base model.
Each --model NAME=WORKDIR is a trained (or imported) workdir. Each model is exported once with
`run.py export --to ctranslate2`, float32, into a temporary folder (not timed) and
loaded by CTranslate2 twice, with compute_type "float32" and "int8" (weights quantized at
load, activations float32). The three engines decode the same source lines at each batch size:
  ours      Translator (what `run.py translate` runs) at beam 4, length penalty len ** 1.0
            ("power", alpha 1), CTranslate2's search: candidate pool "fairseq" for a --model
            (a sentence is done once 4 hypotheses have finished, as CTranslate2's patience 1
            has it), "beam" for the random Base shape (`TRAINED_POOL`, `RANDOM_POOL`), at
            most MAX_LEN (64) target tokens, for every sentence; the other decode settings
            are the workdir's config's (the defaults: cache_reorder "auto", the shrinking
            batch), or as --decode KEY=VALUE sets them (e.g. cache_reorder=chunked);
  ct2 f32   ctranslate2.Translator.translate_batch at beam 4, length_penalty 1.0 (its default:
            the score divided by the length), PAD and BOS suppressed as ours never emits them,
            max_batch_size = the batch size (it sorts by length, as ours does), at most 64 tokens;
  ct2 int8  the same with int8 weights.
Both tokenize with the model's SentencePiece vocabulary and decode to text inside the timed call.

Sources: the first N lines of Multi30k's test2016 (lowercased, tokenized: what the Multi30k
experiments train on) under --data_root (default ../shared/data), N per batch size from
--sentences (fewer at batch 1, where every engine is slowest). The engines run in alternating
rounds (ours, f32, int8, ours, ...) in this one process, each round timing every engine once on
the same lines; the table gives each engine's best round, so a burst of load from the other
processes of a shared machine hits the engines alike. CTranslate2 runs on --threads intra-op
threads (one translator); XLA on the cores this process may use. Before the timed rounds, not
timed: ours translates the same lines once (it compiles each batch shape and source-length
bucket, and its first run of a compiled loop is slower), CTranslate2 its first few.

The defaults (2 / 32 / 128 lines at batch 1 / 32 / 128, one timed round) print the Base
shape's table in about 2.5 minutes on 2 cores (143 s on an Intel Xeon, of which batch 128 takes
83: every engine decodes its 128 lines to 64 tokens, ours twice); `--batch_sizes 1,32
--sentences 2,32` in about 1. The figures of docs/performance.md take more lines and rounds
(its commands); one round's ratios move by ~15% between runs.

Allocator: the benchmark re-executes itself once with run.py's glibc allocator settings
(transformer_mt/runtime/allocator.py: one arena that keeps what it frees, large blocks from the
heap), so ours runs as `run.py translate` runs it, and CTranslate2, in the same process, runs
with them too: each engine at its best. Under glibc's defaults CTranslate2 pays for it at large
batches (docs/performance.md, "Beam search against CTranslate2"), and ours beside
it too. `GLIBC_TUNABLES= python benchmarks/ctranslate2_decode.py` runs both under glibc's
defaults; the first line printed says which.

Printed per model and batch size: sentences/s and target tokens/s (tokens of each best
hypothesis, EOS excluded, the same count on both sides) of each engine, ours as a ratio of each
CTranslate2 row (> 1: ours faster), the BLEU of each engine's translations against the
references (the same search and weights: f32 should match ours closely, int8 differs) and how
many translations equal ours. The load average before and after, and the CPU, are printed:
the machine may be shared, which stretches wall times.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_mt.runtime import allocator  # noqa: E402

if __name__ == "__main__":  # glibc's allocator settings, as run.py runs ours (module docstring)
  allocator.reexec_with_allocator_settings()

import jax  # noqa: E402

from benchmarks.harness import corpus, models  # noqa: E402
from benchmarks.harness.timing import cpu_name  # noqa: E402
from transformer_mt.config import registry  # noqa: E402
from transformer_mt.decoding import loading  # noqa: E402
from transformer_mt.evaluation import corpus_scores  # noqa: E402
from transformer_mt.interop import ct2_export  # noqa: E402
from transformer_mt.runtime import compile_cache, sharding  # noqa: E402
from transformer_mt.workdir import checkpointing  # noqa: E402

SOURCES = "multi30k/test_2016_flickr.lc.norm.tok"
BEAM = 4
ALPHA = 1.0
# Target tokens at most, EOS included, on both sides (a sentence of a briefly trained model may
# repeat itself to the limit).
MAX_LEN = 64
ENGINES = ("ours", "ct2 f32", "ct2 int8")
# Ours runs the search CTranslate2 runs. translate_batch's beam search (patience 1) is done with
# a sentence once beam_size hypotheses have finished: our candidate pool "fairseq" (the default
# pool "beam" searches on until no live beam can beat the finished ones, which with len ** 1.0
# can take a weak model's repetitions to the limit: ~2x the tokens of CTranslate2 on a briefly
# trained Base model, docs/performance.md, "Beam search against CTranslate2"). At the length limit
# fairseq's rule ends a hypothesis with EOS where CTranslate2 cuts it, so the random Base shape,
# which emits no EOS and always runs to the limit, takes "beam", which cuts there as
# CTranslate2 does (and, with no EOS, stops nowhere else).
TRAINED_POOL = "fairseq"
RANDOM_POOL = "beam"
# The Transformer Base shape (Vaswani et al. 2017, table 3), on the Multi30k recipe's vocabulary.
BASE_SHAPE = (
  "model.d_model=512",
  "model.d_ff=2048",
  "model.num_heads=8",
  "model.num_encoder_layers=6",
  "model.num_decoder_layers=6",
)
# --tiny: the same program at a toy shape, on a generated corpus (no data, seconds).
TINY_SHAPE = models.TINY_MODEL
# CTranslate2 warms up on this many lines (it compiles nothing; its first call allocates).
CT2_WARM_UP_LINES = 1


def base_shape_workdir(workdir: str, data_root: str, tiny: bool = False) -> str:
  """A workdir of the Base shape (`tiny`: TINY_SHAPE) at random initialization (seed 0), with a
  SentencePiece vocabulary of the Multi30k recipe's size trained on 20k of its training
  sentences."""
  config = registry.load_experiment("multi30k_ende", list(TINY_SHAPE if tiny else BASE_SHAPE))
  config.data.root = data_root
  mesh = sharding.make_mesh(sharding.inference_mesh_config("data=1"), jax.devices()[:1])
  sample = 1000 if tiny else models.VOCABULARY_SAMPLE
  _, params, tokenizer = models.random_model(config, mesh, sample)
  checkpointing.save_inference(workdir, 0, params, config, tokenizer)
  return workdir


def tiny_data_root(folder: str) -> str:
  """A data root holding generated stand-ins for Multi30k's train, val and test2016 files."""
  os.makedirs(os.path.join(folder, "multi30k"))
  prefix = os.path.join(folder, "multi30k", "train.lc.norm.tok")
  corpus.generate_corpus(prefix, 1000, seed=0, mean_words=6)
  for lang in ("en", "de"):
    for split in ("val.lc.norm.tok", SOURCES.split("/")[1]):
      shutil.copy(f"{prefix}.{lang}", os.path.join(folder, "multi30k", f"{split}.{lang}"))
  return folder


def read_lines(data_root: str, language: str, count: int) -> list[str]:
  path = pathlib.Path(data_root) / f"{SOURCES}.{language}"
  return path.read_text(encoding="utf-8").splitlines()[:count]


class Engines:
  """The three engines of one model, each a callable lines -> translations."""

  def __init__(
    self, workdir: str, directory: str, threads: int, pool: str, decode: tuple[str, ...] = ()
  ):
    import ctranslate2
    import sentencepiece

    self.tokenizer = checkpointing.read_config(workdir)[1]
    mesh = sharding.make_mesh(sharding.inference_mesh_config("data=1"), jax.devices()[:1])
    self.workdir, self.mesh, self.pool, self.decode = workdir, mesh, pool, decode
    self.ours = {}
    self.ct2 = {
      name: ctranslate2.Translator(
        directory, device="cpu", compute_type=kind, intra_threads=threads, inter_threads=1
      )
      for name, kind in (("ct2 f32", "float32"), ("ct2 int8", "int8"))
    }
    spm = lambda name: sentencepiece.SentencePieceProcessor(model_file=f"{directory}/{name}")  # noqa: E731
    self.source_spm, self.target_spm = spm("source.spm"), spm("target.spm")

  def translator(self, batch_size: int):
    if batch_size not in self.ours:
      settings = [
        "decode.length_penalty='power'",
        f"decode.candidate_pool='{self.pool}'",
        f"decode.batch_size={batch_size}",
        # One length limit for both engines: CTranslate2 has no per-sentence one.
        f"decode.max_len={MAX_LEN}",
        f"decode.extra_len={MAX_LEN}",
        *(f"decode.{setting}" for setting in self.decode),
      ]
      self.ours[batch_size] = loading.load_translator(
        self.workdir, mesh=self.mesh, beam_size=BEAM, alpha=ALPHA, decode_overrides=settings
      )
    return self.ours[batch_size]

  def run(self, engine: str, lines: list[str], batch_size: int) -> list[str]:
    """Each line's best translation."""
    if engine == "ours":
      return self.translator(batch_size).translate(lines)
    pieces = [self.source_spm.encode(line, out_type=str) + ["</s>"] for line in lines]
    results = self.ct2[engine].translate_batch(
      pieces,
      max_batch_size=batch_size,
      beam_size=BEAM,
      length_penalty=ALPHA,
      max_decoding_length=MAX_LEN,
      suppress_sequences=[["<pad>"], ["<s>"]],
    )
    return [self.target_spm.decode(r.hypotheses[0]) for r in results]


def measure(engines: Engines, lines, references, batch_size: int, rounds: int) -> dict:
  """engine -> (best seconds, translations, target tokens, BLEU) after a warm-up round.

  Target tokens: the SentencePiece pieces of each translation, EOS excluded, counted alike
  for every engine (the text encoded again)."""
  outputs, best = {}, dict.fromkeys(ENGINES, float("inf"))
  engines.run("ours", lines, batch_size)  # compiles, and runs each compiled loop once
  for engine in ENGINES[1:]:
    engines.run(engine, lines[:CT2_WARM_UP_LINES], batch_size)
  for _ in range(rounds):
    for engine in ENGINES:
      start = time.perf_counter()
      outputs[engine] = engines.run(engine, lines, batch_size)
      best[engine] = min(best[engine], time.perf_counter() - start)
  result = {}
  for engine in ENGINES:
    tokens = sum(len(engines.target_spm.encode(t)) for t in outputs[engine])
    bleu = corpus_scores.corpus_bleu(outputs[engine], references, tokenized=True)[0]
    result[engine] = (best[engine], outputs[engine], tokens, bleu)
  return result


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--tiny", action="store_true", help="a toy shape on 4 generated lines at batch 4 (CI)"
  )
  parser.add_argument("--model", action="append", default=[], metavar="NAME=WORKDIR")
  parser.add_argument(
    "--base_shape", action="store_true", help="the random Base shape too (alone without --model)"
  )
  parser.add_argument("--batch_sizes", default="1,32,128")
  # One batch at 32 and at 128: the Base shape's table in ~3 minutes on 2 cores.
  parser.add_argument("--sentences", default="2,32,128", help="lines per batch size")
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--threads", type=int, default=2, help="CTranslate2 intra-op threads")
  parser.add_argument("--data_root", default=str(ROOT.parent / "shared" / "data"))
  parser.add_argument(
    "--decode", action="append", default=[], metavar="KEY=VALUE", help="our decode setting"
  )
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as scratch:
    if args.tiny:
      args.data_root = tiny_data_root(os.path.join(scratch, "data"))
      args.model, args.batch_sizes, args.sentences = [], "4", "4"
    run(args, scratch)


def run(args, scratch: str) -> None:
  """The table for the models of `args`, with temporary files under `scratch`."""
  sources = pathlib.Path(args.data_root) / f"{SOURCES}.en"
  if not sources.is_file():
    print(
      f"error: {sources} does not exist; pass --data_root DIR (the shared data folder).",
      file=sys.stderr,
    )
    sys.exit(2)
  if not args.tiny:  # (a --tiny run in a test process leaves JAX's configuration alone)
    compile_cache.enable()
  batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
  counts = [int(n) for n in args.sentences.split(",")]
  tunables = os.environ.get("GLIBC_TUNABLES")
  allocation = (
    "run.py's allocator settings"
    if tunables == allocator.GLIBC_TUNABLES
    else f"GLIBC_TUNABLES={tunables!r} (not run.py's)"
  )
  print(
    f"CPU: {cpu_name()}, {os.cpu_count()} cores visible; load average before "
    f"{os.getloadavg()[0]:.2f} (1 min); beam {BEAM}, length penalty len ** {ALPHA}; "
    f"{allocation}"
  )
  start, phases = time.perf_counter(), []
  header = (
    "| model | batch | sentences | engine | sentences/s | target tokens/s | ours / this "
    "(tokens/s, sentences/s) | BLEU | equal to ours |"
  )
  rows = [header, "|" + "---|" * 9]
  entries = [(*spec.partition("=")[::2], TRAINED_POOL) for spec in args.model]
  if args.base_shape or not entries:
    workdir = os.path.join(scratch, "base_shape_workdir")
    workdir = base_shape_workdir(workdir, args.data_root, args.tiny)
    entries.insert(0, ("base_shape (random)", workdir, RANDOM_POOL))
    phases.append(f"Base shape built {time.perf_counter() - start:.0f} s")
  for index, (name, workdir, pool) in enumerate(entries):
    directory = os.path.join(scratch, f"ct2_{index}")
    phase = time.perf_counter()
    ct2_export.export_ctranslate2(workdir, directory)
    engines = Engines(workdir, directory, args.threads, pool, tuple(args.decode))
    phases.append(f"{name} exported and loaded {time.perf_counter() - phase:.0f} s")
    for batch_size, count in zip(batch_sizes, counts):
      lines = read_lines(args.data_root, "en", count)
      references = read_lines(args.data_root, "de", count)
      phase = time.perf_counter()
      result = measure(engines, lines, references, batch_size, args.rounds)
      phases.append(f"{name} at batch {batch_size} {time.perf_counter() - phase:.0f} s")
      ours_seconds, ours_texts, ours_tokens, _ = result["ours"]
      for engine in ENGINES:
        seconds, texts, tokens, bleu = result[engine]
        ratio = (
          "–"
          if engine == "ours"
          else (
            f"{(ours_tokens / ours_seconds) / (tokens / seconds):.2f}x, "
            f"{seconds / ours_seconds:.2f}x"
          )
        )
        same = sum(a == b for a, b in zip(texts, ours_texts))
        rows.append(
          f"| {name} | {batch_size} | {len(lines)} | {engine} | {len(lines) / seconds:.1f} | "
          f"{tokens / seconds:.0f} | {ratio} | {bleu:.2f} | {same}/{len(lines)} |"
        )
  print("\n".join(rows))
  print(
    f"load average after {os.getloadavg()[0]:.2f} (1 min); "
    f"{time.perf_counter() - start:.0f} s in all ({'; '.join(phases)})"
  )


if __name__ == "__main__":
  main()

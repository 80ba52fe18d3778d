"""Does a corpus of WMT size start training quickly and in little memory? Time to the first
step, RSS per process and pipeline throughput for N pairs, read as local text files
(`--source local`) or as a prepared TFDS dataset (`--source tfds`).

    python benchmarks/corpus_scale.py --pairs N [--workers K] [--corpus DIR/PREFIX]
                                      [--source {local,tfds}] [--tfds-data-dir DIR]
                                      [--workdir-root DIR] [--keep]
    python benchmarks/corpus_scale.py --tiny [--workers K] [--source tfds]   # seconds (CI)

--tiny: 300 generated pairs, a 200-piece vocabulary, 3 batches and 2,000 random reads, the
pipeline timed at --workers only.

1. The corpus: `--corpus DIR/PREFIX` (PREFIX.en / PREFIX.de, taken as they are), or N generated
   pairs written to WORKDIR_ROOT/corpus/gen.{en,de} by benchmarks/harness/corpus.py: words
   sampled from the running text of the EN-DE news files in ../shared/data (a fixed pseudo-word
   list when that folder is missing), so word frequencies are Zipf-like as in news; source
   lengths log-normal (mean --mean_words, 25 by default, with a long tail up to 150 words, as
   WMT news sentences are) and each target length the source's times a noisy DE/EN word ratio.
   Vectorised NumPy, so 4.5M pairs take seconds to a minute; its time (`generate_s`) is not
   part of anything else.
   With `--source tfds`, the corpus is then written as the prepared TFDS dataset
   wmt14_translate/de-en (array_record) by benchmarks/tfds_corpus.py, with TFDS's own example
   serializer, shard layout and dataset_info (train: the corpus in file order; validation and
   test: its first 300 pairs, since the tfds source always opens all three splits), to
   WORKDIR_ROOT/tfds, or to --tfds-data-dir DIR when DIR does not hold it yet; a DIR that does
   is reused as it is (never deleted, as a given --corpus), so a 36M-pair dataset is written
   once. That time is `write_tfds_s` (null when reused), apart from every other figure;
   `tfds_gb` is its size on disk. The text files of a generated corpus are deleted once written
   (kept with --keep). The training command then reads data.source='tfds' with
   data.tfds_data_dir=DIR through `tfds.data_source`, which finds the dataset prepared and
   downloads nothing.
2. Preparation, where the project has it (`transformer_mt.commands.prepare` exists):
   `run.py prepare --experiment news_ende_small` with the training command's overrides, timed as
   `prepare_s` (null without it: today's in-memory path reads the text in the training process;
   always null for tfds, which `run.py prepare` leaves as it is: nothing to prepare).
   Where `data.prepared_dir` is a config key, the prepared form goes to WORKDIR_ROOT/prepared.
3. The training command, as a user runs it: `run.py train --experiment news_ende_small` on the
   corpus with a small model (d_model 64, one layer each side), no validation or test split
   (tfds: 300 pairs each, never evaluated), a tokenizer sample of --sample_size sentences (tfds:
   trained in every fresh workdir, the tokenizer cache being for prepared local corpora),
   train.num_steps=2, train.log_every=1, a fresh workdir and a fresh (cold) JAX compilation
   cache. Measured:
     first_step_s   command start until metrics.jsonl holds step 1's row: with log_every=1 that
                    row is written once step 1's metrics were fetched from the device, i.e. the
                    step has finished (polled every 0.1 s)
     setup_s        command start until its "... training pairs; ..." log line: pairs read,
                    tokenizer trained, model layout built
     compile_s      the tracing, lowering and XLA compilation seconds JAX logs with
                    JAX_LOG_COMPILES=1, summed over every jitted function up to the first step
                    (train_step_compile_s: the train step's share; a warm persistent cache would
                    skip the XLA part)
     rss_gb_*       VmRSS of the training process (main), of each Grain worker (worker_max: the
                    largest) and of all processes of the tree in one sample (total; Python's
                    resource tracker included), maxima over samples every 0.1 s from
                    /proc/PID/status until the command exits; rss_anon_gb_* the same for RssAnon,
                    the memory a process can neither share with others nor drop
4. The input pipeline alone, in this process: `input_pipeline.training_batches` over the same
   training pairs (as `data_sources.load_pairs` gives them to the training command) with the
   run's tokenizer, timed by benchmarks/input_pipeline.py's `pipeline_rate`: non-pad target
   tokens/s after the first batch, at 0, 1 and K workers (`target_tokens_per_s_wN`; at K also
   `target_tokens_per_s`, per worker and the non-pad fraction). The reference, measured in the
   same process right after: the same pipeline over the first 500k of those pairs held as a list
   of Python strings, the in-memory design (`in_memory_tokens_per_s_wN`). Compare the two, not
   figures from another run. And `random_pairs_per_s_first` / `_warm`: pairs/s read one index at
   a time at up to 200k random indices (30 s at most), twice (--drop-caches empties the page
   cache before the first pass, as root, so that pass reads from disk).

Prints a table and one JSON line. Generated corpora, TFDS datasets and workdirs are deleted at
the end unless --keep (a given --corpus or --tfds-data-dir is never touched). Figures depend on
the machine and its load (/proc/loadavg is printed before and after); nothing is asserted.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from benchmarks.harness import tfds_corpus  # noqa: E402
from benchmarks.harness.corpus import SOURCE_LANG, TARGET_LANG, generate_corpus  # noqa: E402
from benchmarks.harness.process_memory import TreeSampler  # noqa: E402

EXPERIMENT = "news_ende_small"
# Pairs held as Python strings for the in-memory reference rate (2M would be ~1 GB per copy).
REFERENCE_PAIRS = 500_000
GB = 1e9
# Seconds JAX logs per jitted function under JAX_LOG_COMPILES=1 (tracing, lowering, XLA).
COMPILE_LINE = re.compile(
  r"Finished (?:tracing|jaxpr to MLIR module conversion|XLA compilation)\b.* in ([0-9.]+) sec"
)


# --- the commands ------------------------------------------------------------------------------


def loadavg() -> str:
  return pathlib.Path("/proc/loadavg").read_text().strip()


def prepare_available() -> bool:
  """Whether this checkout has the `run.py prepare` command (its module)."""
  return importlib.util.find_spec("transformer_mt.commands.prepare") is not None


def has_prepared_dir_key() -> bool:
  from transformer_mt.config import defaults

  return "prepared_dir" in defaults.base_config().data


def overrides(args, root: str, prefix: str, workers: int, folder: str, tfds_dir: str = "") -> list:
  """The run's `key=value` overrides: the corpus (the text files DIR/PREFIX, or the TFDS data
  directory `tfds_dir` with --source tfds), no held-out splits, a small model."""
  if tfds_dir:
    # The tfds source always opens all three splits: tfds_corpus gives them a few hundred pairs.
    keys = ["data.source='tfds'", f"data.tfds_name={tfds_corpus.DATASET!r}"]
    keys.append(f"data.tfds_data_dir={tfds_dir!r}")
  else:
    keys = [
      f"data.root={root!r}",
      f"data.train_prefixes={[prefix]!r}",
      "data.validation_prefixes=[]",
      "data.test_prefixes=[]",
    ]
  keys += [
    f"data.num_workers={workers}",
    "model.d_model=64",
    "model.num_heads=2",
    "model.d_ff=128",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    f"tokenizer.vocab_size={args.vocab_size}",
    f"tokenizer.sample_size={args.sample_size}",
    "train.num_steps=2",
    "train.log_every=1",
    "train.eval_every=0",
    "train.bleu_every=0",
  ]
  if has_prepared_dir_key() and not tfds_dir:
    keys.append(f"data.prepared_dir={os.path.join(folder, 'prepared')!r}")
  return keys


def run_command(argv: list[str], log_path: str, env: dict, watch=None) -> dict:
  """Runs `argv` in the repository root, its output (timestamped by arrival) to `log_path`;
  `watch(pid, elapsed)` is called every 0.1 s while it runs. Returns {"seconds", "lines"}: lines as
  (seconds since start, text). A failed command is an error showing its output's tail."""
  start = time.perf_counter()
  process = subprocess.Popen(
    argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
  )
  lines = []

  def read():
    with open(log_path, "w", encoding="utf-8") as log:
      for raw in process.stdout:
        text = raw.decode("utf-8", "replace")
        lines.append((time.perf_counter() - start, text))
        log.write(text)

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  while process.poll() is None:
    if watch:
      watch(process.pid, time.perf_counter() - start)
    time.sleep(0.1)
  seconds = time.perf_counter() - start
  reader.join()
  if process.returncode:
    tail = "".join(text for _, text in lines[-30:])
    raise SystemExit(f"{' '.join(argv[:3])} failed with exit code {process.returncode}:\n{tail}")
  return {"seconds": seconds, "lines": lines}


def train_and_measure(keys: list[str], workdir: str, env: dict) -> dict:
  metrics = os.path.join(workdir, "metrics.jsonl")
  state = {"sampler": None, "first_step_s": None}

  def watch(pid, elapsed):
    state["sampler"] = state["sampler"] or TreeSampler(pid)
    state["sampler"].sample()
    if state["first_step_s"] is None and os.path.exists(metrics):
      with open(metrics, encoding="utf-8") as f:
        if any('"step": 1,' in line and '"loss"' in line for line in f):
          state["first_step_s"] = elapsed

  argv = [sys.executable, "run.py", "train", "--experiment", EXPERIMENT, "--workdir", workdir]
  run = run_command(argv + keys, workdir + ".log", env, watch)
  first = state["first_step_s"]
  setup = next((t for t, text in run["lines"] if " training pairs; " in text), None)
  compile_s = step_compile_s = 0.0
  for seconds, text in run["lines"]:
    match = COMPILE_LINE.search(text)
    if match and first is not None and seconds <= first:
      compile_s += float(match.group(1))
      step_compile_s += float(match.group(1)) if "train_step" in text else 0.0
  return {
    "first_step_s": None if first is None else round(first, 2),
    "setup_s": None if setup is None else round(setup, 2),
    "compile_s": round(compile_s, 2),
    "train_step_compile_s": round(step_compile_s, 2),
    "train_command_s": round(run["seconds"], 2),
    **state["sampler"].gigabytes(),
  }


def pipeline_throughput(
  keys: list[str],
  workdir: str,
  workers: int,
  batches: int,
  drop_caches: bool = False,
  tiny: bool = False,
) -> dict:
  """Non-pad target tokens/s of the training batches alone, with the run's tokenizer, at 0, 1 and
  `workers` worker processes: over the training pairs as the run reads them (from disk for a
  prepared corpus), and, as the reference measured in this same process, over the first
  REFERENCE_PAIRS of them held as Python strings (the in-memory design that preparation
  replaced). Also the random-access read rate of those training pairs, one process."""
  from benchmarks.input_pipeline import pipeline_rate
  from transformer_mt.config import registry
  from transformer_mt.data import input_pipeline
  from transformer_mt.data import sources as data_sources
  from transformer_mt.data.tokenizer import MODEL_FILENAME, Tokenizer

  config = registry.load_experiment(EXPERIMENT, keys)
  pairs = data_sources.load_pairs(config.data)["train"]
  tokenizer = Tokenizer.load(os.path.join(workdir, MODEL_FILENAME))
  max_len = config.data.max_len
  rows = input_pipeline.rows_per_batch(config.train.batch_tokens, max_len, 1, 1)
  result = random_read_rate(pairs, reads=2000 if tiny else 200_000, drop_caches=drop_caches)
  in_memory = first_pairs(pairs, REFERENCE_PAIRS)
  for count in sorted({workers} if tiny else {0, 1, workers}):
    rate, filled = pipeline_rate(pairs, tokenizer, rows, max_len, count, batches)
    reference, _ = pipeline_rate(in_memory, tokenizer, rows, max_len, count, batches)
    result[f"target_tokens_per_s_w{count}"] = round(rate)
    result[f"in_memory_tokens_per_s_w{count}"] = round(reference)
    if count == workers:
      result["target_tokens_per_s"] = round(rate)
      result["target_tokens_per_s_per_worker"] = round(rate / max(workers, 1))
      result["non_pad_fraction"] = round(filled, 4)
  return result


def first_pairs(pairs, count: int, block: int = 10_000) -> list[tuple[str, str]]:
  """The first `count` pairs as a list, read `block` at a time through `__getitems__` where
  the source has it (the TFDS source reads one record far slower than a batch of them)."""
  count = min(len(pairs), count)
  if not hasattr(pairs, "__getitems__"):
    return [pairs[i] for i in range(count)]
  found = []
  for start in range(0, count, block):
    found += pairs.__getitems__(list(range(start, min(start + block, count))))
  return found


def random_read_rate(
  pairs, reads: int = 200_000, seconds: float = 30.0, seed: int = 0, drop_caches=False
) -> dict:
  """Pairs/s read one `pairs[i]` at a time at uniformly random indices (how a globally shuffled
  Grain source reads), in this process: a first pass over up to `reads` indices (stopping after
  `seconds`, for a slow source) and a second over the same ones (warm). The first is cold only
  where the files are not in the page cache (see --drop-caches); right after generation they
  usually are."""
  import numpy as np

  indices = np.random.default_rng(seed).integers(0, len(pairs), size=reads).tolist()
  if drop_caches:
    os.sync()
    pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
  result = {}
  for label in ("first", "warm"):
    start = time.perf_counter()
    for done, index in enumerate(indices, 1):
      pairs[index]
      if done % 1000 == 0 and time.perf_counter() - start > seconds:
        indices = indices[:done]  # the warm pass rereads exactly these
        break
    result[f"random_pairs_per_s_{label}"] = round(len(indices) / (time.perf_counter() - start))
  result["random_reads"] = len(indices)
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tiny", action="store_true", help="300 pairs, a toy vocabulary (CI)")
  parser.add_argument("--pairs", type=int, default=100_000, help="pairs to generate")
  parser.add_argument("--workers", type=int, default=0, help="data.num_workers")
  parser.add_argument("--corpus", default="", help="DIR/PREFIX of an existing corpus to use")
  parser.add_argument("--source", choices=("local", "tfds"), default="local", help="data.source")
  parser.add_argument(
    "--tfds-data-dir",
    default="",
    help="--source tfds: a TFDS data dir holding the dataset (reused) or to write it into (kept)",
  )
  parser.add_argument(
    "--write-workers", type=int, default=0, help="processes writing TFDS shards (0: all cores)"
  )
  parser.add_argument(
    "--workdir-root", default="", help="a new folder for the corpus and workdirs is made here"
  )
  parser.add_argument("--keep", action="store_true", help="keep that folder (default: delete)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--mean_words", type=float, default=25.0, help="mean source words/sentence")
  parser.add_argument("--vocab_size", type=int, default=8000, help="tokenizer.vocab_size")
  parser.add_argument("--sample_size", type=int, default=20_000, help="tokenizer.sample_size")
  parser.add_argument("--batches", type=int, default=200, help="batches the pipeline is timed on")
  parser.add_argument(
    "--drop-caches",
    action="store_true",
    help="empty the page cache (/proc/sys/vm/drop_caches, needs root) before the random reads",
  )
  args = parser.parse_args(argv)
  if args.tiny:
    args.pairs, args.vocab_size, args.sample_size, args.batches = 300, 200, 300, 3
  if args.workdir_root:
    os.makedirs(args.workdir_root, exist_ok=True)
  # Everything this run writes is under `folder`, so deleting it never touches anything else.
  folder = tempfile.mkdtemp(prefix="corpus_scale_", dir=args.workdir_root or None)
  try:
    result = measure(args, folder)
  finally:
    if args.keep:
      print(f"kept {folder}")
      if args.source == "tfds" and not args.tfds_data_dir:
        print(f"TFDS data dir (reuse with --tfds-data-dir): {os.path.join(folder, 'tfds')}")
    else:
      shutil.rmtree(folder, ignore_errors=True)
  width = max(len(key) for key in result)
  for key, value in result.items():
    print(f"{key:<{width}}  {value}")
  print(json.dumps(result))


def measure(args, folder: str) -> dict:
  """Generates (or counts) the corpus, writes it as a TFDS dataset for --source tfds, prepares it
  where the project can, trains, times the pipeline; returns the figures in the order printed."""
  result = {"pairs": args.pairs, "workers": args.workers, "source": args.source}
  result["load_before"] = loadavg()
  tfds_dir = os.path.abspath(args.tfds_data_dir) if args.tfds_data_dir else ""
  if args.source == "tfds" and tfds_dir and tfds_corpus.dataset_dir(tfds_dir).is_dir():
    prefix = ""  # An existing dataset: no text corpus needed.
    result["pairs"] = tfds_corpus.train_pairs(tfds_dir)
    result["generate_s"] = None
  elif args.corpus:
    prefix = os.path.abspath(args.corpus)
    with open(f"{prefix}.{SOURCE_LANG}", "rb") as f:
      result["pairs"] = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))
    result["generate_s"] = None
  else:
    os.makedirs(os.path.join(folder, "corpus"))
    prefix = os.path.join(folder, "corpus", "gen")
    start = time.perf_counter()
    stats = generate_corpus(prefix, args.pairs, args.seed, args.mean_words)
    result["generate_s"] = round(time.perf_counter() - start, 2)
    result["corpus_gb"] = round(stats["bytes"] / GB, 3)
    result["mean_source_words"] = round(stats["source_words"] / args.pairs, 1)
    result["mean_target_words"] = round(stats["target_words"] / args.pairs, 1)
  if args.source == "tfds":
    result.update(tfds_dataset(args, prefix, tfds_dir or os.path.join(folder, "tfds")))
    tfds_dir = result["tfds_dir"]
  root, name = os.path.split(prefix)
  keys = overrides(args, root, name, args.workers, folder, tfds_dir)
  env = dict(
    os.environ,
    JAX_LOG_COMPILES="1",
    JAX_COMPILATION_CACHE_DIR=os.path.join(folder, "jax_cache"),
    PYTHONUNBUFFERED="1",
  )
  result["prepare_s"] = None
  # `run.py prepare` has nothing to do for a TFDS source (it is read as it is).
  if prepare_available() and args.source == "local":
    argv = [sys.executable, "run.py", "prepare", "--experiment", EXPERIMENT]
    log = os.path.join(folder, "prepare.log")
    result["prepare_s"] = round(run_command(argv + keys, log, env)["seconds"], 2)
  workdir = os.path.join(folder, f"train_w{args.workers}")
  result.update(train_and_measure(keys, workdir, env))
  result.update(
    pipeline_throughput(keys, workdir, args.workers, args.batches, args.drop_caches, args.tiny)
  )
  result["load_after"] = loadavg()
  return result


def tfds_dataset(args, prefix: str, data_dir: str) -> dict:
  """The prepared TFDS dataset in `data_dir`: reused when there, else written from the text
  corpus at `prefix` (a generated one is deleted then, unless --keep: only the dataset is read).
  Returns {"write_tfds_s" (None when reused), "tfds_gb" (on disk), "tfds_shards", "tfds_dir"}."""
  path = tfds_corpus.dataset_dir(data_dir)
  written = None
  if not path.is_dir():
    start = time.perf_counter()
    tfds_corpus.write_tfds_dataset(prefix, data_dir, workers=args.write_workers)
    written = round(time.perf_counter() - start, 2)
    if not args.corpus and not args.keep:
      for lang in (SOURCE_LANG, TARGET_LANG):
        os.remove(f"{prefix}.{lang}")
  shards = glob.glob(str(path / "*-train.array_record-*"))
  return {
    "write_tfds_s": written,
    "tfds_gb": round(sum(os.path.getsize(p) for p in path.iterdir()) / GB, 3),
    "tfds_shards": len(shards),
    "tfds_dir": data_dir,
  }


if __name__ == "__main__":
  main()

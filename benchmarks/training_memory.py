"""Where does a training process's memory go? `run.py train --experiment news_ende_small` for 3
steps, its anonymous memory (RssAnon: what the process can neither share nor drop) sampled every
0.05 s, in variants that each change one thing.

    python benchmarks/training_memory.py [--steps 3] [--test_lines 64]

The run trains on the shared news pairs (../shared/data/news/en-de, as the experiment does)
with its model (d_model 256, 3+3 layers, vocabulary 8000) and batch (32 packed rows of 128:
4,096 target slots per step), no validation split, and a test split of the first
--test_lines lines of newstest2014, decoded once at the end (beam 4, decode batch 64: one
full batch). Reported per variant: the anonymous RSS once setup is done (the "Mesh ..." log
line: Python, JAX, the data, the tokenizer, the parameters), its maximum over the run, and
at the end (the "Done: step" line, before the interpreter exits); and the wall time.

  as configured            the experiment as a user runs it
  no final evaluation      evaluate.test_after_training=False
  micro-batches of 1,024   train.grad_accum_steps=4: the same 4,096 slots per update, in four
                           micro-batches (XLA's step buffers scale with the micro-batch)
  glibc's allocator        GLIBC_TUNABLES= : glibc's defaults instead of the one arena that
                           never trims (transformer_mt/runtime/allocator.py)

XLA's own accounting of the step (benchmarks/memory.py --experiments news_ende_small --rows 32)
says what the step needs: 1.40 GiB of temporaries and 0.08 GiB of state. Compare the variants
with each other, in one run; the figures depend little on load, the wall times do.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _process_memory import GB, TreeSampler  # noqa: E402
from corpus_scale import loadavg, run_command  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
NEWS = ROOT.parent / "shared" / "data" / "news" / "en-de"
VARIANTS = {
  "as configured": ([], {}),
  "no final evaluation": (["evaluate.test_after_training=False"], {}),
  "micro-batches of 1,024": (["train.grad_accum_steps=4"], {}),
  "glibc's allocator": ([], {"GLIBC_TUNABLES": ""}),
}


def measure(keys: list[str], extra_env: dict, workdir: str, log: str) -> dict:
  samples: list[tuple[float, int]] = []  # (seconds, RssAnon of the process tree)
  sampler: dict = {}

  def watch(pid, elapsed):
    tree = sampler.setdefault("tree", TreeSampler(pid))
    if tree.sample():
      samples.append((elapsed, tree.latest[1]))

  argv = [sys.executable, "run.py", "train", "--experiment", "news_ende_small"]
  argv += ["--workdir", workdir, *keys]
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR="", **extra_env)
  ran = run_command(argv, log, env, watch)

  def at(marker: str) -> float | None:
    """The last sample before the first output line holding `marker`."""
    when = next((t for t, text in ran["lines"] if marker in text), None)
    before = [gb for t, gb in samples if when is not None and t <= when]
    return round(before[-1] / GB, 2) if before else None

  return {
    "anon_gb_after_setup": at("INFO Mesh "),
    "anon_gb_peak": round(max(gb for _, gb in samples) / GB, 2),
    "anon_gb_at_end": at("Done: step"),
    "seconds": round(ran["seconds"], 1),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--test_lines", type=int, default=64)
  args = parser.parse_args()
  folder = tempfile.mkdtemp(prefix="training_memory-")
  try:
    data = pathlib.Path(folder, "data", "news", "en-de")
    data.mkdir(parents=True)
    for path in NEWS.iterdir():
      (data / path.name).symlink_to(path)
    for lang in ("en", "de"):
      lines = (NEWS / f"newstest2014.{lang}").read_text(encoding="utf-8").splitlines()
      (data / f"test_head.{lang}").write_text("\n".join(lines[: args.test_lines]) + "\n")
    common = [
      f"data.root={str(data.parents[1])!r}",
      "data.validation_prefixes=[]",
      "data.test_prefixes=['news/en-de/test_head']",
      f"data.prepared_dir={os.path.join(folder, 'prepared')!r}",
      f"train.num_steps={args.steps}",
      "train.log_every=1",
    ]
    record = {"benchmark": "training_memory", "load_before": loadavg(), "variants": {}}
    print(f"{'variant':26}{'after setup':>13}{'peak':>8}{'at end':>9}{'wall s':>8}  (anonymous GB)")
    for i, (name, (keys, env)) in enumerate(VARIANTS.items()):
      workdir = os.path.join(folder, f"run{i}")
      result = measure(common + keys, env, workdir, os.path.join(folder, f"run{i}.log"))
      record["variants"][name] = result
      print(
        f"{name:26}{result['anon_gb_after_setup']:>13}{result['anon_gb_peak']:>8}"
        f"{result['anon_gb_at_end']:>9}{result['seconds']:>8}",
        flush=True,
      )
    record["load_after"] = loadavg()
    print(json.dumps(record))
  finally:
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
  main()

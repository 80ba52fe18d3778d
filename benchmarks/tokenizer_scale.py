"""Does an experiment's tokenizer train at WMT size on a small machine? `run.py prepare` timed
and its memory sampled, on a generated corpus of N pairs, with the experiment's own tokenizer.*
settings (transformer_base_wmt14_ende: a 37,000-piece BPE on a 2,000,000-sentence sample).

    python benchmarks/tokenizer_scale.py --pairs 4500000 [--experiment NAME] [--heaps-types]
                                         [--root DIR] [--keep] [key=value ...]

1. The corpus: N pairs written to ROOT/corpus/gen.{en,de} by benchmarks/_generated_corpus.py
   (its time, `generate_s`, apart). Its words come from the running text of the EN-DE news
   files, so it has their 75k English and 108k German types however large it is; real text
   meets new words all the time (Heaps' law, fitted on those files: ~3.0M English and ~5.7M
   German types at 4.5M pairs). A tokenizer's trainer works per distinct word, so
   `--heaps-types` writes that many: a share of the words (2.6% English, 5.0% German at 4.5M
   pairs) are compounds of two pool words, nearly every one new. Measure with it.
2. `run.py prepare --experiment NAME` over that corpus (data.source='local',
   data.prepared_dir=ROOT/prepared, and any key=value given), in a fresh cache folder: the
   line indexes, then the tokenizer. Measured: `prepare_s` (the command's wall time),
   `index_s` and `tokenizer_s` (what the command prints for each), `cpu_s` (user + system
   seconds of the process tree), and RSS maxima of the tree sampled every 0.1 s
   (benchmarks/_process_memory.py): `rss_gb_total`, `rss_anon_gb_total`.

Prints one JSON line with the machine's load before and after. ROOT is deleted unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _generated_corpus import SOURCE_LANG, TARGET_LANG, generate_corpus  # noqa: E402
from _process_memory import TreeSampler  # noqa: E402
from corpus_scale import loadavg, run_command  # noqa: E402

INDEX_LINE = re.compile(r"prepared now, \d+ already were \(([0-9.]+) s\)")
TOKENIZER_LINE = re.compile(r"trained now \(([0-9.]+) s\)")


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--pairs", type=int, default=100_000)
  parser.add_argument("--experiment", default="transformer_base_wmt14_ende")
  parser.add_argument("--heaps-types", action="store_true", help="give the corpus real types")
  parser.add_argument("--root", default="", help="working folder (default: a temporary one)")
  parser.add_argument("--keep", action="store_true", help="keep the working folder")
  parser.add_argument("overrides", nargs="*", metavar="key=value")
  args = parser.parse_args(argv)
  root = args.root or tempfile.mkdtemp(prefix="tokenizer_scale-")
  try:
    result = measure(args, root)
  finally:
    if not args.keep:
      shutil.rmtree(root, ignore_errors=True)
  print(json.dumps(result))
  return result


def measure(args, root: str) -> dict:
  corpus = os.path.join(root, "corpus")
  os.makedirs(corpus, exist_ok=True)
  result = {"pairs": args.pairs, "experiment": args.experiment, "load_before": loadavg()}
  start = time.perf_counter()
  stats = generate_corpus(os.path.join(corpus, "gen"), args.pairs, heaps_types=args.heaps_types)
  result["generate_s"] = round(time.perf_counter() - start, 1)
  result.update(corpus_gb=round(stats["bytes"] / 1e9, 2), heaps_types=args.heaps_types)
  result.update({k: v for k, v in stats.items() if k.startswith("novel_rate")})
  keys = [
    "data.source='local'",
    f"data.root={corpus!r}",
    "data.train_prefixes=['gen']",
    f"data.source_lang={SOURCE_LANG!r}",
    f"data.target_lang={TARGET_LANG!r}",
    f"data.prepared_dir={os.path.join(root, 'prepared')!r}",
    *args.overrides,
  ]
  argv = [sys.executable, "run.py", "prepare", "--experiment", args.experiment, *keys]
  sampler: dict = {}

  def watch(pid, _elapsed):
    sampler.setdefault("tree", TreeSampler(pid)).sample()

  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  ran = run_command(argv, os.path.join(root, "prepare.log"), dict(os.environ), watch)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  output = "".join(text for _, text in ran["lines"])
  index, tokenizer = INDEX_LINE.search(output), TOKENIZER_LINE.search(output)
  memory = sampler["tree"].gigabytes() if "tree" in sampler else {}
  result.update(
    prepare_s=round(ran["seconds"], 1),
    index_s=float(index.group(1)) if index else None,
    tokenizer_s=float(tokenizer.group(1)) if tokenizer else None,
    cpu_s=round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
    rss_gb_total=memory.get("rss_gb_total"),
    rss_anon_gb_total=memory.get("rss_anon_gb_total"),
    load_after=loadavg(),
    overrides=args.overrides,
  )
  return result


if __name__ == "__main__":
  main()

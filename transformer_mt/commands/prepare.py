"""`run.py prepare`: prepare an experiment's local training corpus before a cluster job.

Training prepares a local train split (data.train_prefixes) by itself on first use: one line
index per text file in data.prepared_dir (transformer_mt/data/prepared_corpus.py). A WMT-size
corpus takes minutes to scan, which a job would spend holding its accelerators; this command
does it ahead, with the same config and overrides, so the job finds it done.
"""

from __future__ import annotations


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "prepare",
    help="index an experiment's local training corpus once, ahead of training",
  )
  p.add_argument("--experiment", required=True, help="experiment name (see `list`)")
  p.add_argument(
    "overrides",
    nargs="*",
    metavar="key=value",
    help="config overrides, e.g. data.root=DIR data.prepared_dir=DIR",
  )
  p.set_defaults(func=run)


def run(args) -> None:
  import time

  from transformer_mt.config import registry
  from transformer_mt.data import prepared_corpus
  from transformer_mt.data import sources as data_sources

  config = registry.load_experiment(args.experiment, args.overrides)
  data = config.data
  if data.source != "local" or not data.train_prefixes:
    why = (
      f"data.source={data.source!r} is read as it is"
      if data.source != "local"
      else "data.split_prefixes is read into memory by each run (one corpus cut three ways)"
      if data.split_prefixes
      else "it has no data.train_prefixes"
    )
    print(
      f"Nothing to prepare for {args.experiment}: {why}; only a local train split "
      "(data.source='local' with data.train_prefixes) is prepared."
    )
    return
  start = time.perf_counter()
  corpus, prepared_now = data_sources.prepare_local_train(data)
  seconds = time.perf_counter() - start
  files = [index for pair in corpus.indexes for index in pair]
  print(
    f"{args.experiment}: {len(corpus):,} training pairs in {len(files)} files; "
    f"{len(prepared_now)} prepared now, {len(files) - len(prepared_now)} already were "
    f"({seconds:.1f} s)."
  )
  print(f"Cache folder: {prepared_corpus.cache_folder(data.prepared_dir)}")
  now = set(prepared_now)
  for index in files:
    state = "prepared now" if index.path in now else "already prepared"
    print(f"  {index.path}  {index.lines:,} lines  {state}")

"""`run.py prepare`: prepare an experiment's local training corpus before a cluster job.

Training prepares a local train split (data.train_prefixes) by itself on first use: one line
index per text file in data.prepared_dir (transformer_mt/data/prepared_corpus.py). A WMT-size
corpus takes minutes to scan, which a job would spend holding its accelerators; this command
does it ahead, with the same config and overrides, so the job finds it done. It also trains
the experiment's SentencePiece vocabulary on that corpus (tokenizer.* settings) into the same
cache folder, where a fresh workdir copies it from (data/tokenizer_cache.py); an experiment
that starts from an import (init.from) keeps the imported tokenizer and trains none.
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
  from transformer_mt.data import prepared_corpus, text_files
  from transformer_mt.data import sources as data_sources
  from transformer_mt.data import tokenizer as tokenizers
  from transformer_mt.runtime import errors
  from transformer_mt.training import finetune

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
  if finetune.source(config):
    print(f"Tokenizer: none trained; init.from={finetune.source(config)!r} brings its own.")
    return
  start = time.perf_counter()
  try:
    tokenizer, path, found = tokenizers.cached_tokenizer(corpus, config.tokenizer)
  except text_files.DataError:
    raise
  except errors.BadValue as e:
    # The corpus stays prepared (its index is kept); the job would stop on this, so the
    # command fails here, ahead of it, with a non-zero exit that a job script can check.
    raise errors.BadValue(
      f"The corpus is prepared, but no tokenizer could be trained with these tokenizer.* "
      f"settings (fix them and rerun; the corpus is not prepared again): {e}"
    ) from e
  seconds = time.perf_counter() - start
  state = "already trained" if found else f"trained now ({seconds:.1f} s)"
  if path is None:
    state += "; the cache folder could not keep it, so each fresh workdir trains it again"
  print(f"Tokenizer: {path or '-'}  vocab {tokenizer.vocab_size:,}  {state}")

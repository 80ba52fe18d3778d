"""`run.py prepare`: prepare an experiment's local training corpus before a cluster job.

Training prepares a local train split (data.train_prefixes) by itself on first use: one line
index per text file in data.prepared_dir (transformer_mt/data/prepared_corpus.py). A WMT-size
corpus takes minutes to scan, which a job would spend holding its accelerators; this command
does it ahead, with the same config and overrides, so the job finds it done. It also trains
the experiment's SentencePiece vocabulary on that corpus (tokenizer.* settings) into the same
cache folder, where a fresh workdir copies it from (data/tokenizer_cache.py); an experiment
that starts from an import (init.from) keeps the imported tokenizer and trains none.

Nothing removes an index by itself: on a cluster another host's job may read any index in the
cache folder. `--remove_unused_days DAYS` removes, after preparing, the indexes no process has
read or prepared for DAYS days (readers mark theirs hourly; line_index_cache.remove_unused).
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
  p.add_argument(
    "--remove_unused_days",
    type=float,
    metavar="DAYS",
    help="then remove the line indexes in data.prepared_dir that no process has read or "
    "prepared for DAYS days (at least 1); indexes are never removed otherwise",
  )
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.config import registry
  from transformer_mt.data import line_index_cache
  from transformer_mt.runtime import errors

  days = args.remove_unused_days
  if days is not None and not days >= line_index_cache.MIN_UNUSED_DAYS:
    raise errors.BadValue(
      f"--remove_unused_days {days:g}: must be at least {line_index_cache.MIN_UNUSED_DAYS:g}; "
      "a process reading an index marks it only once an hour."
    )
  config = registry.load_experiment(args.experiment, args.overrides)
  data = config.data
  _prepare(args, config, data)
  if days is not None:
    folder = line_index_cache.cache_folder(data.prepared_dir)
    removed = line_index_cache.remove_unused(folder, days)
    noun = "index" if len(removed) == 1 else "indexes"
    print(f"Removed {len(removed)} line {noun} unread for {days:g} days from {folder}.")
    for path in removed:
      print(f"  {path}")


def _prepare(args, config, data) -> None:
  """Prepares the experiment's local train split and trains its tokenizer, if it has one."""
  import time

  from transformer_mt.data import line_index_cache, text_files
  from transformer_mt.data import sources as data_sources
  from transformer_mt.data import tokenizer as tokenizers
  from transformer_mt.runtime import errors
  from transformer_mt.training import finetune

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
  print(f"Cache folder: {line_index_cache.cache_folder(data.prepared_dir)}")
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

"""Where sentence pairs come from, behind one interface.

`load_pairs(config.data)` returns {"train": pairs, "validation": pairs, "test": pairs}
(a split may be missing), each a random-access sequence of (source, target) strings
in the experiment's translation direction:

  synthetic   the offline generated language pair (transformer_mt.data.synthetic)
  tfds        a TFDS WMT builder read through `tfds.data_source` (transformer_mt.data.tfds_source)
  local       line-aligned text files, e.g. ../shared/data (transformer_mt.data.text_files):
              each split from its own files (data.train_prefixes, validation_prefixes,
              test_prefixes), or all three cut from one corpus (data.split_prefixes, see
              `split_by_source`), optionally with more training-only files
              (data.extra_train_prefixes); no training pair of a cut corpus shares a
              sentence, on either side, with a held-out pair

A local train split of its own files (data.train_prefixes) is a `PreparedCorpus`
(transformer_mt.data.prepared_corpus): read by index from the text files through a line index
prepared once into data.prepared_dir, never held as strings, whatever its size. The
validation and test splits are lists in memory, and so is all of data.split_prefixes: cutting
one corpus by grouping equal source sentences reads every sentence, which is meant for
corpora of held-out size (Tatoeba's 17k pairs), not WMT's millions.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pathlib
from collections.abc import Sequence

import ml_collections

from transformer_mt.runtime import errors

SOURCES = ("synthetic", "tfds", "local")
SPLITS = ("train", "validation", "test")

# `data.root` defaults to the shared data folder beside the repository (../shared/data).
DEFAULT_LOCAL_ROOT = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


# Where the WMT news test sets can be fetched: the `data.how_to_get` of the experiments that
# read news/ or tatoeba/ files.
HOW_TO_GET_NEWS = (
  "The WMT news test sets come with sacrebleu, e.g. the full newstest2014 EN-DE (3003 lines): "
  "`sacrebleu -t wmt14/full -l en-de --echo src > DIR/news/en-de/newstest2014.en` and "
  "`--echo ref > DIR/news/en-de/newstest2014.de` (wmt08..wmt20 likewise); all of news/ and "
  "tatoeba/ are in the public Helsinki-NLP/OPUS-MT-testsets repository (testsets/en-de, "
  "testsets/en-fr). See docs/data.md."
)


def local_root(data_config: ml_collections.ConfigDict) -> str:
  """The folder local prefixes are read from: `data.root`, or ../shared/data beside the
  repository when it is empty. A folder that does not exist is a one-line error saying
  which `data.root` to pass and how to get the files (`data.how_to_get`), never a path the
  user never had."""
  given = data_config.root
  root = os.path.abspath(os.path.expanduser(given)) if given else str(DEFAULT_LOCAL_ROOT)
  if not os.path.isdir(root):
    wanted = ", ".join(
      list(data_config.split_prefixes or [])
      + list(data_config.train_prefixes or [])[:2]
      + list(data_config.test_prefixes or [])
    )
    where = f"data.root={root}" if given else f"The default data folder {root}"
    raise errors.MissingFile(
      f"{where} does not exist. This experiment reads line-aligned text files "
      f"PREFIX.{data_config.source_lang} / PREFIX.{data_config.target_lang} under data.root "
      f"({wanted}, ...): put them in a folder DIR and pass data.root=DIR."
      + _how_to_get(data_config)
    )
  return root


def load_pairs(
  data_config: ml_collections.ConfigDict, require_train: bool = True
) -> dict[str, Sequence[tuple[str, str]]]:
  """The splits of `data_config.source`, read (or opened). Nothing is written but the line
  index of a local train split's files, once, into data.prepared_dir (see prepared_corpus).

  Args:
    require_train: local text without train_prefixes is an error (False for evaluation,
      e.g. of an imported model that is never trained).
  """
  source = data_config.source
  if source == "synthetic":
    from transformer_mt.data import synthetic

    return synthetic.generate_splits(
      data_config.num_train,
      data_config.num_eval,
      data_config.seed,
      data_config.num_validation,
    )
  if source == "tfds":
    from transformer_mt.data import tfds_source

    return {
      split: tfds_source.load_tfds_pairs(
        data_config.tfds_name,
        data_config.source_lang,
        data_config.target_lang,
        split,
        data_dir=data_config.tfds_data_dir or None,
        manual_dir=data_config.tfds_manual_dir or None,
      )
      for split in SPLITS
    }
  if source == "local":
    from transformer_mt.data import text_files

    root = local_root(data_config)
    split_prefixes = list(data_config.split_prefixes or [])
    given = [f"{split}_prefixes" for split in SPLITS if data_config[f"{split}_prefixes"]]
    if split_prefixes and given:
      raise errors.BadValue(
        f"data.split_prefixes cuts train, validation and test from one corpus, so "
        f"{', '.join('data.' + key for key in given)} cannot be given with it: pass "
        f"{' '.join(f'data.{key}=[]' for key in given)} or leave data.split_prefixes empty."
      )
    splits = {}
    for split in ("split",) + SPLITS:
      prefixes = list(data_config[f"{split}_prefixes"] or [])
      if split == "train" and prefixes:
        splits[split], prepared_now = prepare_local_train(data_config)
        if prepared_now:
          logging.info("Prepared %s (line offsets in data.prepared_dir)", ", ".join(prepared_now))
      elif prefixes:
        splits[split] = _read_local(text_files, prefixes, data_config, root)
    if "split" in splits:
      splits = split_by_source(
        splits.pop("split"),
        data_config.test_size,
        data_config.validation_size,
        data_config.split_seed,
      )
    extra_prefixes = list(data_config.extra_train_prefixes or [])
    if extra_prefixes and not split_prefixes:
      raise errors.BadValue(
        "data.extra_train_prefixes adds training pairs to a corpus cut by "
        "data.split_prefixes; with data.train_prefixes, list the files there instead."
      )
    if split_prefixes:
      splits["train"] = _train_without_held_out(
        text_files, splits, extra_prefixes, data_config, root
      )
    if require_train and "train" not in splits:
      raise errors.BadValue(
        "data.source='local' needs data.train_prefixes (file prefixes such as "
        "'news/en-de/newstest2012', read as PREFIX.<source_lang> / PREFIX.<target_lang>) "
        "or data.split_prefixes (one corpus to cut into test, validation and train)."
      )
    return splits
  raise errors.BadValue(f"data.source={source!r} is not one of {list(SOURCES)}.")


def prepare_local_train(data_config: ml_collections.ConfigDict):
  """(PreparedCorpus, files prepared now) of the local train split (data.train_prefixes):
  each file prepared into data.prepared_dir unless it was before.

  In a multi-process job process 0 prepares while the others wait at a barrier, then the
  others find its indexes (a shared cache folder) or, where each host has a folder of its
  own, prepare theirs under its lock; on a filesystem that refuses flock
  (prepared_corpus.py) that leaves one scan per host, not one per process. A failure of
  process 0 is raised after the barrier, so the others do not hang on it."""
  import jax

  from transformer_mt.data import prepared_corpus, text_files
  from transformer_mt.runtime import distributed

  root = local_root(data_config)
  with _where_files_are(text_files, root, data_config):
    files = text_files.corpus_files(
      list(data_config.train_prefixes), data_config.source_lang, data_config.target_lang, root
    )
    if jax.process_count() == 1:
      return prepared_corpus.prepare(files, data_config.prepared_dir)
    failure, prepared = None, None
    if distributed.is_primary():
      try:
        prepared = prepared_corpus.prepare(files, data_config.prepared_dir)
      except Exception as e:  # raised after the barrier
        failure = e
    distributed.barrier("local_corpus_prepared")
    if failure is not None:
      raise failure
    return prepared or prepared_corpus.prepare(files, data_config.prepared_dir)


def _train_without_held_out(text_files, splits, extra_prefixes, data_config, root):
  """The training pairs cut from data.split_prefixes, then those of data.extra_train_prefixes,
  less every pair that shares a sentence (either side) with a test or validation pair: a
  held-out English sentence may be the translation of another German one in training, and
  extra files may contain held-out sentences. The held-out splits stay as they are."""
  held_out = sentences_of(splits["test"] + splits["validation"])
  train, dropped = without_held_out(splits["train"], held_out)
  extra, extra_dropped = [], 0
  if extra_prefixes:
    source_lang, target_lang = extra_train_langs(data_config)
    pairs = _read_local(text_files, extra_prefixes, data_config, root, source_lang, target_lang)
    extra, extra_dropped = without_held_out(pairs, held_out)
  logging.info(
    "Training pairs: %d from data.split_prefixes and %d from data.extra_train_prefixes; "
    "dropped %d and %d that share a sentence with a held-out pair.",
    len(train),
    len(extra),
    dropped,
    extra_dropped,
  )
  return train + extra


def extra_train_langs(data_config: ml_collections.ConfigDict) -> tuple[str, str]:
  """The (source, target) file suffixes of data.extra_train_prefixes ("de,en")."""
  given = data_config.extra_train_langs
  if not given:
    return data_config.source_lang, data_config.target_lang
  langs = [lang.strip() for lang in given.split(",")]
  if len(langs) != 2 or not all(langs):
    raise errors.BadValue(
      f"data.extra_train_langs={given!r} must be two file suffixes, source first, e.g. 'de,en'."
    )
  return langs[0], langs[1]


def sentences_of(pairs: Sequence[tuple[str, str]]) -> set[str]:
  """Every sentence of `pairs`, either side, whitespace-stripped."""
  return {sentence.strip() for pair in pairs for sentence in pair}


def without_held_out(
  pairs: Sequence[tuple[str, str]], held_out: set[str]
) -> tuple[list[tuple[str, str]], int]:
  """(the pairs with no sentence in `held_out` (`sentences_of` the held-out pairs), how many
  were dropped). Either side is compared with every held-out sentence: a held-out source as
  an extra target counts."""
  kept = [
    (source, target)
    for source, target in pairs
    if source.strip() not in held_out and target.strip() not in held_out
  ]
  return kept, len(pairs) - len(kept)


def _read_local(
  text_files, prefixes, data_config, root, source_lang=None, target_lang=None
) -> list[tuple[str, str]]:
  """`text_files.read_corpus` under `root` (in the config's languages unless given)."""
  with _where_files_are(text_files, root, data_config):
    return text_files.read_corpus(
      prefixes,
      source_lang or data_config.source_lang,
      target_lang or data_config.target_lang,
      root=root,
    )


@contextlib.contextmanager
def _where_files_are(text_files, root: str, data_config: ml_collections.ConfigDict):
  """A missing file's message says where the files were looked for and how to get them."""
  try:
    yield
  except text_files.DataError as e:
    if not str(e).startswith(("No such file", "Corpus pattern")):
      raise
    raise text_files.DataError(
      f"{e} Files are read from data.root={root}; pass another data.root if they are "
      "elsewhere." + _how_to_get(data_config)
    ) from None


def _how_to_get(data_config: ml_collections.ConfigDict) -> str:
  """The experiment's own word on where its files come from, as the error's last sentences."""
  return f" {data_config.how_to_get}" if data_config.how_to_get else ""


def split_by_source(
  pairs: Sequence[tuple[str, str]], test_size: int, validation_size: int, seed: int
) -> dict[str, list[tuple[str, str]]]:
  """One corpus cut into {"test", "validation", "train"} pairs by `split_indices`."""
  indices = split_indices([source for source, _ in pairs], test_size, validation_size, seed)
  return {name: [pairs[i] for i in chosen] for name, chosen in indices.items()}


def split_indices(
  sources: Sequence[str], test_size: int, validation_size: int, seed: int
) -> dict[str, list[int]]:
  """Line indices of {"test", "validation", "train"}: exactly `test_size` and
  `validation_size` lines held out, the rest for training, the same on every machine.

  Lines are grouped by their exact source text, so that a sentence with several
  translations (Tatoeba has 635 German sentences with two to nine English ones, 1461 of
  its 17,565 DE-EN pairs) is never both held out and trained on: a random split of the
  pairs would test on memorized sources. The groups are ordered by
  SHA-256(f"{seed}\t{source}"), a shuffle that depends on nothing but the text and the
  seed (no library's random stream, platform or line order). Walking that order, each
  group goes whole to the first of test, validation that still has room for all of it,
  else to train. A split lists its lines in that shuffled order (file order within a
  group), so the first N validation pairs (train.bleu_sentences) are a random sample
  rather than the file's often sorted first lines. Empty lines are kept (the pipeline
  drops them). The same target may still be the translation of a training source;
  `load_pairs` then drops that training pair (`_train_without_held_out`).

  Raises:
    ValueError: a negative size, or sizes that leave no training lines or cannot be met
      with whole groups.
  """
  if test_size < 0 or validation_size < 0:
    raise errors.BadValue(
      f"data.test_size={test_size} and data.validation_size={validation_size} must be >= 0."
    )
  groups: dict[str, list[int]] = {}
  for index, source in enumerate(sources):
    groups.setdefault(source, []).append(index)
  ordered = sorted(groups, key=lambda text: _split_key(text, seed))
  wanted = {"test": test_size, "validation": validation_size}
  chosen: dict[str, list[int]] = {"test": [], "validation": [], "train": []}
  for source in ordered:
    group = groups[source]
    split = next(
      (name for name in wanted if len(chosen[name]) + len(group) <= wanted[name]), "train"
    )
    chosen[split].extend(group)
  short = [f"data.{name}_size={size}" for name, size in wanted.items() if len(chosen[name]) < size]
  if short or not chosen["train"]:
    raise errors.BadValue(
      f"Cannot hold out data.test_size={test_size} and data.validation_size="
      f"{validation_size} of a {len(sources)}-pair corpus ({len(groups)} distinct "
      "sources) and keep pairs for training"
      + (f" ({', '.join(short)} not reached with whole groups)" if short else "")
      + ": pass smaller sizes."
    )
  return chosen


def _split_key(source: str, seed: int) -> bytes:
  """The sort key that shuffles `split_by_source`'s groups."""
  return hashlib.sha256(f"{seed}\t{source}".encode()).digest()

"""Where sentence pairs come from, behind one interface.

`load_pairs(config.data)` returns {"train": pairs, "validation": pairs, "test": pairs}
(a split may be missing), each a random-access sequence of (source, target) strings
in the experiment's translation direction:

  synthetic   the offline generated language pair (transformer_mt.synthetic)
  tfds        a TFDS WMT builder read through `tfds.data_source` (transformer_mt.tfds_source)
  local       line-aligned text files, e.g. ../shared/data (transformer_mt.text_files)
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import ml_collections

SOURCES = ("synthetic", "tfds", "local")
SPLITS = ("train", "validation", "test")

# `data.root` defaults to the shared data folder beside the repository (../shared/data).
DEFAULT_LOCAL_ROOT = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


# Where the WMT news test sets can be fetched; shown when data.root holds no such files.
HOW_TO_GET_NEWS = (
  "The WMT news test sets come with sacrebleu, e.g. the full newstest2014 EN-DE (3003 lines): "
  "`sacrebleu -t wmt14/full -l en-de --echo src > DIR/news/en-de/newstest2014.en` and "
  "`--echo ref > DIR/news/en-de/newstest2014.de` (wmt08..wmt20 likewise); all of news/ and "
  "tatoeba/ are in the public Helsinki-NLP/OPUS-MT-testsets repository (testsets/en-de, "
  "testsets/en-fr). See the README's Data section."
)


def local_root(data_config: ml_collections.ConfigDict) -> str:
  """The folder local prefixes are read from: `data.root`, or ../shared/data beside the
  repository when it is empty. A folder that does not exist is a one-line error saying
  which `data.root` to pass and how to get the files, never a path the user never had."""
  given = data_config.get("root") or ""
  root = os.path.abspath(os.path.expanduser(given)) if given else str(DEFAULT_LOCAL_ROOT)
  if not os.path.isdir(root):
    wanted = ", ".join(
      list(data_config.get("train_prefixes") or [])[:2]
      + list(data_config.get("test_prefixes") or [])
    )
    where = f"data.root={root}" if given else f"The default data folder {root}"
    raise FileNotFoundError(
      f"{where} does not exist. This experiment reads line-aligned text files "
      f"PREFIX.{data_config.source_lang} / PREFIX.{data_config.target_lang} under data.root "
      f"({wanted}, ...): put them in a folder DIR and pass data.root=DIR. {HOW_TO_GET_NEWS}"
    )
  return root


def load_pairs(
  data_config: ml_collections.ConfigDict, require_train: bool = True
) -> dict[str, Sequence[tuple[str, str]]]:
  """The splits of `data_config.source`, read (or opened) without writing anything.

  Args:
    require_train: local text without train_prefixes is an error (False for evaluation,
      e.g. of an imported model that is never trained).
  """
  source = data_config.source
  if source == "synthetic":
    from transformer_mt import synthetic

    return synthetic.generate_splits(
      data_config.num_train,
      data_config.num_eval,
      data_config.seed,
      data_config.get("num_validation", 0),
    )
  if source == "tfds":
    from transformer_mt import tfds_source

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
    from transformer_mt import text_files

    splits = {}
    root = local_root(data_config)
    for split in SPLITS:
      prefixes = list(data_config.get(f"{split}_prefixes") or [])
      if prefixes:
        try:
          splits[split] = text_files.read_corpus(
            prefixes, data_config.source_lang, data_config.target_lang, root=root
          )
        except text_files.DataError as e:
          if not str(e).startswith(("No such file", "Corpus pattern")):
            raise
          raise text_files.DataError(
            f"{e} Files are read from data.root={root}; pass another data.root if they are "
            f"elsewhere. {HOW_TO_GET_NEWS}"
          ) from None
    if require_train and "train" not in splits:
      raise ValueError(
        "data.source='local' needs data.train_prefixes (file prefixes such as "
        "'news/en-de/newstest2012', read as PREFIX.<source_lang> / PREFIX.<target_lang>)."
      )
    return splits
  raise ValueError(f"data.source={source!r} is not one of {list(SOURCES)}.")

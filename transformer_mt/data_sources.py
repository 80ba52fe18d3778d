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


def local_root(data_config: ml_collections.ConfigDict) -> str:
  return os.path.expanduser(data_config.get("root") or str(DEFAULT_LOCAL_ROOT))


def load_pairs(data_config: ml_collections.ConfigDict) -> dict[str, Sequence[tuple[str, str]]]:
  """The splits of `data_config.source`, read (or opened) without writing anything."""
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
    for split in SPLITS:
      prefixes = list(data_config.get(f"{split}_prefixes") or [])
      if prefixes:
        splits[split] = text_files.read_corpus(
          prefixes, data_config.source_lang, data_config.target_lang, root=local_root(data_config)
        )
    if "train" not in splits:
      raise ValueError(
        "data.source='local' needs data.train_prefixes (file prefixes such as "
        "'news/en-de/newstest2012', read as PREFIX.<source_lang> / PREFIX.<target_lang>)."
      )
    return splits
  raise ValueError(f"data.source={source!r} is not one of {list(SOURCES)}.")

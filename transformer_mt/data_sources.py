"""Where sentence pairs come from. Every source returns {split: [(source, target), ...]}."""

from __future__ import annotations

import ml_collections

from transformer_mt import synthetic

SOURCES = ("synthetic",)


def load_pairs(data_config: ml_collections.ConfigDict) -> dict[str, list[tuple[str, str]]]:
  """Training and held-out pairs for `data_config.source`."""
  if data_config.source == "synthetic":
    train, held_out = synthetic.generate_splits(data_config.num_train, data_config.num_eval,
                                                data_config.seed)
    return {"train": train, "eval": held_out}
  raise ValueError(f"data.source={data_config.source!r} is not available in this version; "
                   f"available sources: {list(SOURCES)}. (TFDS WMT and local text files are "
                   "the next input path to land; see the README's status section.)")

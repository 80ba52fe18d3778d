"""The decode settings of a run: its config's `decode` section as Translator keyword arguments.

Here rather than beside the model setup because the options it checks are beam_search's: the
model stage imports nothing from decoding.
"""

from __future__ import annotations

import ml_collections

from transformer_mt.decoding import beam_rows, beam_search
from transformer_mt.runtime import errors


def decode_settings(
  config: ml_collections.ConfigDict, beam_size: int | None = None, alpha: float | None = None
) -> dict:
  """Translator keyword arguments from an experiment's `decode` section (with overrides).

  A config saved before `length_penalty`, `candidate_pool`, `cache_reorder`,
  `stop_check_every` or `shrink_batch` existed reads back with their defaults ("gnmt", "beam",
  "auto", 1, True; `checkpointing.read_config` completes it): the same translations (scores
  to the last float32 bits: "auto" may keep the cache in place, beam_search's docstring).

  Raises:
    ValueError: one of them names no option of beam_search.
  """
  decode_config = config.decode
  settings = {
    "batch_size": decode_config.batch_size,
    "max_target_len": decode_config.max_len,
    "extra_len": decode_config.extra_len,
    "beam_size": beam_size or decode_config.beam_size,
    "alpha": decode_config.alpha if alpha is None else alpha,
    "length_penalty": decode_config.length_penalty,
    "candidate_pool": decode_config.candidate_pool,
    "cache_reorder": decode_config.cache_reorder,
    "stop_check_every": decode_config.stop_check_every,
    "shrink_batch": decode_config.shrink_batch,
  }
  for key, allowed in (
    ("length_penalty", beam_search.LENGTH_PENALTIES),
    ("candidate_pool", beam_search.CANDIDATE_POOLS),
    ("cache_reorder", beam_rows.CACHE_REORDERS),
  ):
    if settings[key] not in allowed:
      raise errors.BadValue(
        f"decode.{key}={settings[key]!r} in the experiment config: expected one of "
        f"{', '.join(allowed)}; fix the config (or the override that set it)."
      )
  try:
    beam_search.check_stop_check_every(settings["stop_check_every"])
  except errors.BadValue as e:
    raise errors.BadValue(f"decode.{e} Fix the config (or the override that set it).") from None
  return settings

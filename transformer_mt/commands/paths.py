"""Every path a user gives on the command line, made absolute once, before any command runs.

Flags that name files or directories, and the path-valued config keys of `key=value`
overrides, are taken relative to the current directory with `~` expanded: Orbax refuses
relative paths, and a sweep's trial processes or a SLURM job may run from another directory.
`hf:DIR` sources are made absolute too; a hub name (`hf:OWNER/NAME`) is left as it is.
"""

from __future__ import annotations

import argparse
import os

from transformer_mt.runtime import errors

# Flags that name files or directories, and config keys whose values are paths.
PATH_FLAGS = (
  "workdir",
  "workdirs",
  "input",
  "output",
  "source",
  "reference",
  "target",
  "hypotheses",
  "chart",
)
PATH_KEYS = (
  "data.root",
  "data.prepared_dir",
  "data.tfds_data_dir",
  "data.tfds_manual_dir",
  "init.from",
)


def absolute_path(path: str | None) -> str | None:
  """`path` relative to the current directory, `~` expanded; None, "" and "-" (stdin or
  stdout) and URLs (gs://...) are returned as they are."""
  if path in (None, "", "-"):
    return path
  from transformer_mt.workdir.checkpointing import absolute

  return absolute(path)


def absolute_override(override: str) -> str:
  """`data.root=rel/dir` -> `data.root='/abs/rel/dir'`; other overrides are returned as given."""
  from transformer_mt.config import registry

  key, sep, text = override.partition("=")
  if not sep or key not in PATH_KEYS:
    return override
  value = registry.parse_value(text, "")
  if not isinstance(value, str):
    raise errors.BadValue(f"Override {key}={text}: expected a path, got {type(value).__name__}.")
  # init.from=hf:NAME_OR_DIR (a registry row of a published model): only a local DIR moves.
  resolved = absolute_source(value) if value.startswith("hf:") else absolute_path(value)
  return f"{key}={resolved!r}"


def resolve_paths(args: argparse.Namespace) -> None:
  """Makes every path in `args` absolute, once, so nothing deeper sees a relative path."""
  for name in PATH_FLAGS:
    value = getattr(args, name, None)
    if isinstance(value, list):
      setattr(args, name, [absolute_path(v) for v in value])
    elif isinstance(value, str):
      setattr(args, name, absolute_path(value))
  if getattr(args, "overrides", None):
    args.overrides = [absolute_override(o) for o in args.overrides]
  if getattr(args, "from_", None):
    args.from_ = absolute_source(args.from_)
  experiment = getattr(args, "experiment", None)
  if isinstance(experiment, str):
    from transformer_mt.config import registry

    if registry.is_experiment_path(experiment):
      args.experiment = absolute_path(experiment)


def absolute_source(source: str) -> str:
  """`hf:rel/dir` -> `hf:/abs/rel/dir` when that local directory exists; a hub name such as
  `hf:Helsinki-NLP/opus-mt-en-de` (no such directory) is returned as it is."""
  prefix, sep, name = source.partition(":")
  if not sep or not name or not os.path.isdir(os.path.expanduser(name)):
    return source
  return f"{prefix}:{absolute_path(name)}"

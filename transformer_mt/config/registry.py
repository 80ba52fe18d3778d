"""The experiment registry: an experiment is a Python file defining `get_config()`, named by
its stem when it lives in the repository's `experiments/` folder (`--experiment demo`) or given
as a path to a file anywhere (`--experiment path/to/my_exp.py`), so users keep their own
experiments outside this repository. Files are loaded by path, never through an installed
top-level `experiments` package, which would clash with any other project's. Overrides are
`key=value` with values parsed as Python literals only."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import pathlib
import sys
from collections.abc import Sequence

import ml_collections

from transformer_mt.runtime import errors

# The named experiments of a checkout (an editable install: `pip install -e .`).
EXPERIMENTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "experiments"


def experiment_names() -> list[str]:
  """The stems of `experiments/*.py`; files starting with "_" are not experiments."""
  return sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.py") if not p.stem.startswith("_"))


def is_experiment_path(name: str) -> bool:
  """`--experiment` names a file (a path) rather than an experiment of `experiments/`."""
  return name.endswith(".py") or "/" in name


def _suggest(name: str, valid: Sequence[str]) -> str:
  """Valid names with the close matches first."""
  close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
  return ", ".join(close + [v for v in valid if v not in close])


def experiment_module(name: str):
  """The module of experiment `name` (a name of `experiments/` or a path to a .py file),
  loaded once per file: later calls return the same module object.

  Raises:
    FileNotFoundError: a path to no file.
    ValueError: an unknown name (the close ones suggested), or a file without get_config().
  """
  if is_experiment_path(name):
    path = pathlib.Path(name).expanduser()
    if not path.is_file():
      raise errors.MissingFile(
        f"Experiment file {name} does not exist; give a Python file that defines get_config(), "
        f"or one of the named experiments: {', '.join(experiment_names())}"
      )
  else:
    names = experiment_names()
    if name not in names:
      raise errors.BadValue(
        f"Unknown experiment {name!r}. Valid experiments: {_suggest(name, names)}"
      )
    path = EXPERIMENTS_DIR / f"{name}.py"
  return _load_file(path.resolve())


_LOADED: dict[pathlib.Path, object] = {}


def _load_file(path: pathlib.Path):
  """Imports the file at `path` as a module registered in sys.modules (so dataclasses and
  `get_sweep()` inside it work), under a name that cannot clash with an installed package."""
  if path in _LOADED:
    return _LOADED[path]
  module_name = f"transformer_mt_experiment_{path.stem}_{len(_LOADED)}"
  spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[module_name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[module_name]
    raise
  if not callable(getattr(module, "get_config", None)):
    del sys.modules[module_name]
    raise errors.BadValue(
      f"Experiment file {path} defines no get_config(); an experiment file must define "
      "get_config() returning an ml_collections.ConfigDict (see experiments/demo.py)"
    )
  _LOADED[path] = module
  return module


def load_experiment(name: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config of experiment `name` with `overrides` applied, and `experiment` set to `name`.

  Args:
    name: a name of `experiments/` or a path to a .py file (`experiment_module`).
    overrides: "section.key=value" strings (`apply_overrides`); paths in them are taken as
      given (the CLI makes them absolute first: commands/paths.py).

  Raises:
    FileNotFoundError, ValueError: as `experiment_module` and `apply_overrides` raise them.
  """
  config = experiment_module(name).get_config()
  apply_overrides(config, overrides)
  config.experiment = name
  return config


def _flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      keys += _flat_keys(value, f"{prefix}{key}.")
    else:
      keys.append(f"{prefix}{key}")
  return keys


def parse_value(text: str, current):
  """A Python literal (number, bool, None, string, list...). Anything else is taken as a
  plain string only where the field is a string; it is never evaluated."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    if isinstance(current, str) and "(" not in text:
      return text
    raise errors.BadValue(
      f"Cannot parse {text!r}: override values must be Python literals "
      "(numbers, True/False/None, 'quoted strings', lists)."
    ) from None


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """Sets each "section.key=value" of `overrides` in `config`, in order (a later one wins).

  A key must already be in the config: overrides change settings, never add them. Values
  are parsed by `parse_value`; an int given for a float field becomes a float.

  Raises:
    ValueError: not key=value, an unknown key (the close ones suggested), a value that is no
      Python literal, or one of another type than the field's.
  """
  valid = _flat_keys(config)
  for override in overrides:
    key, sep, text = override.partition("=")
    if not sep or not key:
      raise errors.BadValue(
        f"Override {override!r} is not of the form key=value (e.g. train.num_steps=100)."
      )
    if key not in valid:
      raise errors.BadValue(f"Unknown config key {key!r}. Valid keys: {_suggest(key, valid)}")
    *parents, leaf = key.split(".")
    section = config
    for parent in parents:
      section = section[parent]
    current = section[leaf]
    value = parse_value(text, current)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    try:
      section[leaf] = value
    except TypeError as e:
      raise errors.BadValue(
        f"Override {key}={text}: expected a value of type "
        f"{type(current).__name__}, got {type(value).__name__}."
      ) from e

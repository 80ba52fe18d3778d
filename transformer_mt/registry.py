"""The experiment registry: `experiments/NAME.py` defines `get_config()`; the CLI
selects one by name and applies `key=value` overrides parsed as Python literals only."""

from __future__ import annotations

import ast
import difflib
import importlib
import pkgutil
from collections.abc import Sequence

import ml_collections

import experiments
from transformer_mt import errors


def experiment_names() -> list[str]:
  return sorted(
    m.name for m in pkgutil.iter_modules(experiments.__path__) if not m.name.startswith("_")
  )


def _suggest(name: str, valid: Sequence[str]) -> str:
  """Valid names with the close matches first."""
  close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
  return ", ".join(close + [v for v in valid if v not in close])


def experiment_module(name: str):
  names = experiment_names()
  if name not in names:
    raise errors.BadValue(
      f"Unknown experiment {name!r}. Valid experiments: {_suggest(name, names)}"
    )
  return importlib.import_module(f"experiments.{name}")


def load_experiment(name: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
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

"""One default per key: `config/defaults.py` declares every key, `defaults.complete` fills in
what a config lacks (an older checkpoint's, an import's), `checkpointing.read_config` applies
it, and no module reads a config key with a default of its own (`config.x.get(key, other)`)."""

import ast
import pathlib

import jax.numpy as jnp
import ml_collections

from transformer_mt.config import defaults
from transformer_mt.data.tokenizer import train_tokenizer
from transformer_mt.workdir import checkpointing

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "transformer_mt"

# Receivers that are experiment configs (ConfigDicts), as the restructuring (issue 24) counted
# them: `config`, `config.<section>` (also as an attribute, e.g. `imported.config.data`), and
# the section names modules give them.
SECTION_NAMES = {"data_config", "decode_config", "train_config", "init"}
# Modules whose `config` is a Hugging Face JSON dict (tokenizer_config.json), not ours.
HF_JSON = {"data/fsmt_tokenizer.py"}
# Reads being converted on other branches (None: all of a module's); empty this once they
# are merged.
IN_CONVERSION = {}


def _flatten(config: ml_collections.ConfigDict, prefix: str = "") -> dict:
  flat = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def test_complete_fills_missing_keys_and_keeps_present_ones():
  base = _flatten(defaults.base_config())
  partial = ml_collections.ConfigDict(
    {
      "description": "partial",
      "decode": {"beam_size": 1, "alpha": 1.0},
      "data": {"source": "none", "test_size": 7},
      "extra": {"kept": True},
    }
  )
  completed = defaults.complete(partial)
  assert completed is partial
  flat = _flatten(completed)
  present = {
    "description": "partial",
    "decode.beam_size": 1,
    "decode.alpha": 1.0,
    "data.source": "none",
    "data.test_size": 7,
    "extra.kept": True,
  }
  assert set(flat) == set(base) | set(present)
  for key, value in flat.items():
    assert value == present.get(key, base.get(key)), key
  # A full config is left exactly as it is.
  full = defaults.base_config()
  full.train.num_steps = 3
  assert defaults.complete(full).to_dict() == dict(
    defaults.base_config().to_dict(), train=dict(defaults.base_config().train, num_steps=3)
  )


def test_completed_imports_are_still_recognised():
  """The defaults add neither `init.source` nor `model.vocab_size`: a completed experiment
  config is not taken for an import, and an import stays one."""
  experiment = defaults.complete(ml_collections.ConfigDict({"init": {"from": ""}}))
  assert "source" not in experiment.init and "vocab_size" not in experiment.model
  assert "target_vocab_size" not in experiment.model
  imported = defaults.complete(
    ml_collections.ConfigDict(
      {"init": {"source": "hf", "name": "tiny"}, "model": {"vocab_size": 40}, "data": {}}
    )
  )
  assert "source" in imported.init and imported.model.vocab_size == 40
  assert imported.init["from"] == "" and imported.data.split_prefixes == []


def test_an_older_checkpoints_config_reads_back_completed(tmp_path):
  """A checkpoint saved before decode.length_penalty / candidate_pool / extra_len (and
  train.optimizer, mesh.allow_replicated_fallback) were declared reads back with their
  defaults, and with its own values for the keys it has."""
  config = defaults.base_config()
  config.decode.beam_size = 2
  for section, key in (
    ("decode", "length_penalty"),
    ("decode", "candidate_pool"),
    ("decode", "extra_len"),
    ("train", "optimizer"),
    ("mesh", "allow_replicated_fallback"),
  ):
    del config[section][key]
  del config["evaluate"]
  tokenizer = train_tokenizer([("a b c d", "e f g h")] * 50, vocab_size=14)
  checkpointing.save_inference(str(tmp_path), 3, {"w": jnp.zeros(2)}, config, tokenizer)

  read, _, step = checkpointing.read_config(str(tmp_path))
  assert step == 3 and read.decode.beam_size == 2
  assert (read.decode.length_penalty, read.decode.candidate_pool) == ("gnmt", "beam")
  assert read.decode.extra_len == 50 and read.train.optimizer == "adam"
  assert read.mesh.allow_replicated_fallback is False and read.evaluate.average_last == 0
  assert read.to_dict() == dict(
    defaults.base_config().to_dict(), decode=dict(defaults.base_config().decode, beam_size=2)
  )


def _config_receiver(node: ast.expr) -> bool:
  """`config`, `x.config`, `config.<section>`, `x.config.<section>`, or a section name."""
  if isinstance(node, ast.Name):
    return node.id == "config" or node.id in SECTION_NAMES
  if isinstance(node, ast.Attribute):
    inner = node.value
    if node.attr == "config" or (isinstance(inner, ast.Name) and inner.id == "config"):
      return True
    return isinstance(inner, ast.Attribute) and inner.attr == "config"
  return False


def _default_reads(source: str) -> list[tuple[int, str]]:
  """(line, call) of each `.get(` on a config receiver in `source`."""
  return sorted(
    (node.lineno, ast.unparse(node))
    for node in ast.walk(ast.parse(source))
    if isinstance(node, ast.Call)
    and isinstance(node.func, ast.Attribute)
    and node.func.attr == "get"
    and _config_receiver(node.func.value)
  )


def test_no_config_key_is_read_with_a_default_of_its_own():
  modules = {str(p.relative_to(PACKAGE)): p for p in sorted(PACKAGE.rglob("*.py"))}
  assert set(modules) >= HF_JSON | set(IN_CONVERSION)  # no stale entry
  reads = [
    f"transformer_mt/{name}:{line}: {call}"
    for name, path in modules.items()
    if name not in HF_JSON and IN_CONVERSION.get(name, ()) is not None
    for line, call in _default_reads(path.read_text(encoding="utf-8"))
    if call not in IN_CONVERSION.get(name, ())
  ]
  assert reads == [], "read these as attributes (defaults live in config/defaults.py):\n" + (
    "\n".join(reads)
  )


def test_the_scan_finds_each_receiver_shape():
  """The scan above is not vacuous: it finds every receiver shape it is meant to, and leaves
  other dicts alone."""
  source = (
    "config.get('a')\nconfig.train.get('b', 0)\nimported.config.data.get('c')\n"
    "data_config.get('d')\ninit.get('from', '')\nhf_config.get('e')\npairs.get('test')\n"
  )
  assert [line for line, _ in _default_reads(source)] == [1, 2, 3, 4, 5]

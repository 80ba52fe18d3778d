"""What the test files share: the repository root, the overrides of a tiny demo run, `run.py`
argv, tiny Transformer configs and their parameters, and the few readers and parameter checks
that two test files use (moved here as they were, so that test files import this module, not
one another).

Each test file still builds what it checks with its own values (its overrides, sizes and
seeds): the builders take them as arguments and return exactly what the file wrote before.
"""

from __future__ import annotations

import os
import pathlib
import sys
import textwrap
import uuid
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import metrics_log as metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def child_xla_flags(devices: int | None = None) -> str:
  """XLA_FLAGS for a process a test starts: this process's flags (conftest's code generation
  level, or what the user set) with `devices` simulated CPU devices, or XLA's default of one
  when None. A child compiled otherwise could differ from its parent in the last bit."""
  flags = [
    flag
    for flag in os.environ.get("XLA_FLAGS", "").split()
    if not flag.startswith("--xla_force_host_platform_device_count")
  ]
  if devices is not None:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  return " ".join(flags)


# Every key a tiny demo run's overrides may set, in the order the lists name them, with the
# value of the common tiny run (a 1+1-layer d_model 32 model on 2000 synthetic pairs, a
# 300-piece tokenizer, greedy decoding), or None where that run leaves the experiment's value.
_TINY_RUN = {
  "model.d_model": "32",
  "model.num_heads": "2",
  "model.d_ff": "64",
  "model.num_encoder_layers": "1",
  "model.num_decoder_layers": "1",
  "model.dropout_rate": None,
  "data.num_train": "2000",
  "data.num_eval": "8",
  "data.num_validation": None,
  "tokenizer.vocab_size": "300",
  "tokenizer.sample_size": "2000",
  "train.batch_tokens": "256",
  "train.log_every": "5",
  "train.optimizer": None,
  "train.lr_scale": None,
  "train.warmup_steps": None,
  "train.grad_clip_norm": None,
  "train.checkpoint_every": None,
  "train.keep_checkpoints": None,
  "train.num_steps": None,
  "train.eval_every": None,
  "train.bleu_every": None,
  "decode.max_len": "24",
  "decode.batch_size": None,
  "decode.beam_size": "1",
  "mesh.data": None,
}


def tiny_overrides(*settings: str, drop: Iterable[str] = ()) -> list[str]:
  """The `key=value` overrides of a tiny demo run: the common ones, with `settings` (each
  `key=value`) set or replaced and the keys in `drop` left out, in _TINY_RUN's order (the
  order every test file wrote its list in). A key _TINY_RUN does not know is a KeyError: a
  file that needs another one adds it after the list."""
  values = dict(_TINY_RUN)
  for setting in settings:
    key, value = setting.split("=", 1)
    if key not in values:
      raise KeyError(f"{key} is not a tiny-run key (tests/helpers.py _TINY_RUN)")
    values[key] = value
  for key in drop:
    if key not in values:
      raise KeyError(f"{key} is not a tiny-run key (tests/helpers.py _TINY_RUN)")
    values[key] = None
  return [f"{key}={value}" for key, value in values.items() if value is not None]


def end_to_end_overrides() -> list[str]:
  """The tiny run of test_end_to_end.py (dropout, 20 evaluation pairs, a checkpoint every 10
  steps, the experiment's beam), which test_ensemble.py and test_scoring.py build on."""
  return tiny_overrides(
    "model.dropout_rate=0.1",
    "data.num_eval=20",
    "train.checkpoint_every=10",
    "decode.batch_size=8",
    "mesh.data=-1",
    drop=["decode.beam_size"],
  )


def run_py(*args: str) -> list[str]:
  """argv of `python run.py ARGS...` with this interpreter (run from ROOT)."""
  return [sys.executable, "run.py", *args]


def tiny_model_config(**overrides) -> TransformerConfig:
  """A tiny deterministic Transformer: vocabulary 40, d_model 32, 4 heads, d_ff 64, 2+2 layers
  (the Transformer's own defaults for the rest), with `overrides` replacing or adding fields."""
  values = dict(
    vocab_size=40,
    d_model=32,
    num_heads=4,
    d_ff=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
    deterministic=True,
  )
  values.update(overrides)
  return TransformerConfig(**values)


def init_params(config: TransformerConfig, seed: int = 0, unbox: bool = True):
  """`Transformer(config).init`'s params from a (1, 2) dummy source and target and
  `jax.random.key(seed)`: unboxed (each partitioning box replaced by its value), or as init
  returns them, in their boxes (`unbox=False`)."""
  dummy = jnp.ones((1, 2), jnp.int32)
  params = Transformer(config).init(jax.random.key(seed), dummy, dummy)["params"]
  if not unbox:
    return params
  return jax.tree.map(
    lambda x: x.value if hasattr(x, "value") else x, params, is_leaf=lambda x: hasattr(x, "value")
  )


# Sentence pairs a tiny SentencePiece model is trained on (test_tokenizer.py,
# test_language_flags.py).
PAIRS = [
  ("The cat sat on the mat.", "Die Katze saß auf der Matte."),
  ("A dog barks at night.", "Ein Hund bellt in der Nacht."),
  ("Über den Wolken!", "Above the clouds!"),
] * 30


# Workdirs (test_fault_tolerance.py, test_damaged_checkpoint.py).


def final_params(workdir, step):
  from transformer_mt.model import setup as run_setup
  from transformer_mt.runtime import sharding

  config, tokenizer, _ = checkpointing.read_config(workdir, step)
  setup = run_setup.model_setup(config, tokenizer, sharding.make_mesh(config.mesh))
  return jax.device_get(checkpointing.restore_params(workdir, step, setup.abstract_params))


def assert_same_params(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def losses_by_step(workdir):
  return {r["step"]: r["loss"] for r in metrics.read_metrics(workdir) if "loss" in r}


# Equivalent training runs (test_training.py, test_multihost.py). tests/test_training.py says
# how these were measured.
PARAMS_ATOL = 1e-6
MIN_MOVEMENT_OVER_ATOL = 100


def max_abs_difference(tree_a, tree_b) -> float:
  return max(
    float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(tree_a), jax.tree.leaves(tree_b))
  )


def assert_same_params_after_real_movement(params, reference_params, reference_initial) -> None:
  """`params` equal `reference_params` to PARAMS_ATOL, and the reference moved away from
  `reference_initial` by at least MIN_MOVEMENT_OVER_ATOL times that (else an update of the
  wrong size could still pass)."""
  movement = max_abs_difference(reference_params, reference_initial)
  assert movement >= MIN_MOVEMENT_OVER_ATOL * PARAMS_ATOL, (movement, PARAMS_ATOL)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=PARAMS_ATOL),
    params,
    reference_params,
  )


def write_local_pairs(folder, pairs, name: str = "train") -> None:
  """`pairs` as the line-aligned files FOLDER/NAME.en and FOLDER/NAME.xx (the folder made)."""
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f"{name}.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
  (folder / f"{name}.xx").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def local_train_overrides(root, prepared_dir) -> list[str]:
  """Overrides that make an experiment train on ROOT/train.{en,xx} (write_local_pairs),
  prepared into PREPARED_DIR."""
  return [
    "data.source='local'",
    f"data.root='{root}'",
    "data.source_lang='en'",
    "data.target_lang='xx'",
    "data.train_prefixes=['train']",
    f"data.prepared_dir='{prepared_dir}'",
  ]


def experiment_file(tmp_path, sweep_source: str):
  """An experiment file: the demo's config with `sweep_source` (a Sweep(...) expression) as
  its sweep."""
  path = tmp_path / f"exp_{uuid.uuid4().hex[:8]}.py"
  path.write_text(
    textwrap.dedent(f"""\
      from transformer_mt.config import registry
      from transformer_mt.config.search_space import Sweep

      def get_config():
        return registry.experiment_module("demo").get_config()

      def get_sweep():
        return {sweep_source}
      """)
  )
  return str(path)

"""Trained workdirs built once per pytest session and copied into each test that uses one.

A tiny training run costs 20-60 s, mostly compilation; several test files need the same one.
`session_workdir(tmp_path_factory, name, build)` builds it once for the whole session, under
pytest-xdist too (its documented recipe for session data: the workers share
`tmp_path_factory.getbasetemp().parent`, and a file lock lets the first worker build while the
others wait), and `copy_of(workdir, destination)` gives a test its own copy, so that no test
sees what another one wrote.

The runs themselves, with the overrides the test files share:
  - `ten_steps`: TINY below, 10 steps, checkpoints at 5 and 10 (test_damaged_checkpoint.py,
    test_fault_tolerance.py);
  - `export_demo`, `export_halves`: the two models of the export tests (ExportModels below:
    test_export.py, test_export_use.py).
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Callable

from filelock import FileLock
from helpers import tiny_overrides

# The tiny run with dropout that test_fault_tolerance.py and test_damaged_checkpoint.py train:
# no validation BLEU and no held-out BLEU after the last step (they compare parameters and
# losses; the decoding after training is tested in test_end_to_end.py).
TINY = tiny_overrides("model.dropout_rate=0.1", "train.bleu_every=0") + [
  "evaluate.test_after_training=False"
]


def session_workdir(
  tmp_path_factory, name: str, build: Callable[[pathlib.Path], None]
) -> pathlib.Path:
  """The workdir `name`, which `build(workdir)` fills the first time any worker of this session
  asks for it. Tests must not write into it: copy it first (`copy_of`)."""
  if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: its own base directory
    root = tmp_path_factory.getbasetemp()
  else:  # every worker's base directory is a child of the session's
    root = tmp_path_factory.getbasetemp().parent
  workdir = root / "trained_runs" / name
  done = workdir.with_name(name + ".done")
  workdir.parent.mkdir(parents=True, exist_ok=True)
  with FileLock(str(workdir) + ".lock"):
    if not done.exists():
      if workdir.exists():  # a build that failed part-way
        shutil.rmtree(workdir)
      build(workdir)
      done.touch()
  return workdir


def copy_of(workdir: pathlib.Path, destination: pathlib.Path) -> pathlib.Path:
  """A copy of `workdir` at `destination` (which must not exist), returned."""
  shutil.copytree(workdir, destination)
  return destination


def _train(overrides: list[str]) -> Callable[[pathlib.Path], None]:
  def build(workdir: pathlib.Path) -> None:
    from transformer_mt.config import registry
    from transformer_mt.training import train

    train.train(registry.load_experiment("demo", overrides), str(workdir), progress=False)

  return build


def ten_steps(tmp_path_factory) -> pathlib.Path:
  """A finished 10-step run of TINY with checkpoints at 5 and 10 (8 devices, in-process)."""
  overrides = TINY + ["train.num_steps=10", "train.checkpoint_every=5"]
  return session_workdir(tmp_path_factory, "ten_steps", _train(overrides))


# The export tests' models (test_export.py, test_export_use.py).
# A d_model-64, 1+1-layer model on 32 synthetic pairs: packed updates of 512 target slots (150
# are ~80 epochs) at a moderate learning rate (peak 8.8e-3), no validation decode. The decoded
# sentences are half training pairs (SEEN: memorized, each source its own output; a pair longer
# than data.max_len is not trained on) and half held out (the model unsure: there beam search
# and greedy decoding part ways). Measured (AMD EPYC): training accuracy 1.0 from step ~70
# ("demo") and ~115 ("halves"), so each trains STEPS[name] updates, ~30 past that (the rsqrt
# schedule does not depend on the step count: demo's 100 steps are the first 100 of a longer
# run); the seen rows' greedy outputs all differ (8 of 8, both models), beam 4 differs from
# greedy on 11 and 5 of the 16 rows; attention logits stay below ~130.
# A model trained far longer at a high rate on more pairs (300 steps, peak 3.5e-2, 400 pairs)
# learned little (training accuracy 0.3: its greedy outputs depended on the CPU's float
# arithmetic, 5 distinct of 8 on an AMD EPYC) and grew self-attention logits to ~1.3e4, where a
# near-tie makes every float32 implementation's log-probs ~2e-5 off (transformers' own float32
# as much as CTranslate2): too ill-conditioned for test_export.py's LOG_PROB_TOLERANCE to mean
# anything.
STEPS = {"demo": 100, "halves": 150}
TRAINING = tiny_overrides(
  "model.d_model=64",
  "model.num_heads=4",
  "model.d_ff=128",
  "data.num_train=32",
  "data.num_eval=32",
  "train.batch_tokens=512",
  "train.warmup_steps=50",
  "train.lr_scale=0.5",
  "train.bleu_every=0",
  "decode.beam_size=4",
) + ["model.layer_norm_epsilon=1e-5", "evaluate.test_after_training=False"]
SEEN = 8  # of the first 16 pairs, the training ones
MODELS = {
  "demo": [],
  "halves": [
    "model.position_encoding='sinusoidal_halves'",
    "model.activation='swish'",
    "model.scale_embeddings=False",
    "model.logits_bias=True",
  ],
}


class ExportModels(dict):
  """name (of MODELS) -> (workdir, its Marian export, our model config, our params, 64 pairs:
  SEEN training pairs, as many held out, then 24 of each). Each model is trained when first
  asked for (a test of one model, or a mutant's, trains only that one), once per session
  (`session_workdir`: tests must not write into the workdir); the export and the rest are
  this fixture's own."""

  def __init__(self, tmp_path_factory):
    super().__init__()
    self.tmp_path_factory = tmp_path_factory

  def __missing__(self, name: str):
    from transformer_mt import cli
    from transformer_mt.data import sources as data_sources
    from transformer_mt.interop import hf_export
    from transformer_mt.model import setup as run_setup
    from transformer_mt.workdir import checkpointing

    steps = [f"train.num_steps={STEPS[name]}", f"train.checkpoint_every={STEPS[name]}"]
    build = _train(TRAINING + MODELS[name] + steps)
    workdir = str(session_workdir(self.tmp_path_factory, f"export_{name}", build))
    output = os.path.join(str(self.tmp_path_factory.mktemp(f"{name}_hf")), "export")
    assert cli.main(["export", "--workdir", workdir, "--to", "hf", output]) == 0
    saved, tokenizer, step = checkpointing.read_config(workdir)
    model_config = run_setup.model_config_for(saved, tokenizer).replace(deterministic=True)
    params = hf_export.read_params(workdir, step, saved, tokenizer)
    splits = data_sources.load_pairs(saved.data)
    seen, unseen = list(splits["train"][:32]), list(splits["test"][:32])
    pairs = seen[:SEEN] + unseen[:SEEN] + seen[SEEN:] + unseen[SEEN:]
    self[name] = (workdir, output, model_config, params, pairs)
    return self[name]

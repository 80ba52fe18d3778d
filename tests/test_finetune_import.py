"""`run.py train ... init.from=DIR`: fine-tuning the tiny Marian model of test_hf_import.py.

The import is fine-tuned for 20 steps on ~200 short newstest2013 pairs (local files): the
loss falls, step 0 holds the import's parameters with a fresh optimizer, stopping at step 10
and resuming is bit-identical to an uninterrupted run, and the workdir translates on its own.

Select with `-m interop`; skipped as test_hf_import.py is.
"""

from __future__ import annotations

import hf_fakes
import jax
import numpy as np
import pytest

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.data.tokenizer import VocabTokenizer
from transformer_mt.decoding import loading
from transformer_mt.training import train
from transformer_mt.workdir import checkpointing

hf_fakes.require_interop()  # skipped without the interop extra, as test_hf_import.py is
import hf_kinds  # noqa: E402
from helpers import losses_by_step  # noqa: E402
from hf_kinds import cli_overrides  # noqa: E402

pytestmark = pytest.mark.interop

marian_dir = hf_fakes.marian_dir  # the fixture: a tiny random Marian model and tokenizer
# The fixture: train.{en,de}, ~200 short pairs of newstest2013.
data_root = hf_kinds.data_root
_overrides = hf_kinds.finetune_overrides
STEPS = 20


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("import") / "opus"
  assert cli.main(["import", "--from", f"hf:{marian_dir}", "--workdir", str(workdir)]) == 0
  return workdir


def _train(workdir, overrides, capsys) -> None:
  argv = ["train", "--experiment", "demo", "--workdir", str(workdir)]
  rc = cli.main(argv + overrides)
  assert rc == 0, capsys.readouterr().err


def _error_line(capsys) -> str:
  lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
  assert len(lines) == 1, lines
  return lines[0]


def test_step_zero_is_the_import_with_a_fresh_optimizer(imported, data_root, tmp_path):
  config = registry.load_experiment("demo", cli_overrides(_overrides(imported, data_root, 0)))
  result = train.train(config, str(tmp_path / "zero"), progress=False)
  state = jax.device_get(result["state"])
  expected = loading.load_translator(str(imported)).params
  jax.tree.map(np.testing.assert_array_equal, state.params, jax.device_get(expected))
  assert int(state.step) == 0
  for moment in jax.tree.leaves(state.opt_state):
    assert not np.any(np.asarray(moment)), "Adam's state starts at zero"
  assert isinstance(result["translator"].tokenizer, VocabTokenizer)


def test_finetune_learns_resumes_exactly_and_translates(imported, data_root, tmp_path, capsys):
  full, split = tmp_path / "full", tmp_path / "split"
  _train(full, _overrides(imported, data_root, STEPS), capsys)
  _train(split, _overrides(imported, data_root, 10), capsys)
  assert checkpointing.all_steps(str(split)) == [10]
  _train(split, _overrides(imported, data_root, STEPS), capsys)

  losses = losses_by_step(full)
  assert sorted(losses) == list(range(1, STEPS + 1))
  assert np.mean([losses[s] for s in range(16, 21)]) < 0.8 * np.mean(
    [losses[s] for s in range(1, 6)]
  ), losses
  assert losses_by_step(split) == losses  # bit-identical: the same floats
  full_params = loading.load_translator(str(full)).params
  split_params = loading.load_translator(str(split)).params
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(full_params), split_params)

  # Self-contained: the imported tokenizer and model section, and where they came from.
  config, tokenizer, step = checkpointing.read_config(str(full))
  assert step == STEPS and isinstance(tokenizer, VocabTokenizer)
  imported_config, _, _ = checkpointing.read_config(str(imported))
  assert config.model.vocab_size == imported_config.model.vocab_size
  assert config.model.pad_id == tokenizer.pad_id != 0
  assert config.model.dropout_rate == 0.1
  assert config.init["from"] == str(imported)
  assert not (full / "tokenizer.model").exists()

  source = tmp_path / "input.txt"
  source.write_text("The house is small.\nGood morning.\n", encoding="utf-8")
  output = tmp_path / "output.txt"
  argv = ["translate", "--workdir", str(full), "--input", str(source), "--output", str(output)]
  assert cli.main(argv) == 0, capsys.readouterr().err
  assert len(output.read_text(encoding="utf-8").splitlines()) == 2

  # A changed init.from on resume, a missing directory, and a training run's workdir.
  capsys.readouterr()
  _, *rest = _overrides(imported, data_root, STEPS + 5)
  argv = ["train", "--experiment", "demo", "--workdir", str(full)]
  assert cli.main(argv + [f"init.from={tmp_path / 'other'}"] + rest) == 2
  assert "holds checkpoints of a run with init.from" in _error_line(capsys)
  fresh = ["train", "--experiment", "demo", "--workdir", str(tmp_path / "fresh")]
  assert cli.main(fresh + [f"init.from={tmp_path / 'missing'}"] + rest) == 2
  assert "no such directory" in _error_line(capsys)
  assert cli.main(fresh + [f"init.from={full}"] + rest) == 2
  assert "not a workdir written by `run.py import`" in _error_line(capsys)
  assert not (tmp_path / "fresh").exists()

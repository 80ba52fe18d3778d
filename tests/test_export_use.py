"""What a user of `run.py export` reads as it is: the model card's scores.

The model is test_export.py's "demo" (tests/trained_runs.py ExportModels: trained once per
session).

Select with `-m interop`; skipped without transformers or torch.
"""

from __future__ import annotations

import json
import pathlib

import hf_fakes
import pytest
import trained_runs
from trained_runs import STEPS

torch, transformers = hf_fakes.require_interop()

from transformer_mt import cli  # noqa: E402

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  return trained_runs.ExportModels(tmp_path_factory)


def _cli(*argv: str) -> None:
  assert cli.main(list(argv)) == 0


def test_model_card_holds_the_recorded_bleu(exported, tmp_path):
  workdir, _, _, _, _ = exported["demo"]
  # The session's workdir is shared: evaluate writes into a copy.
  workdir = str(trained_runs.copy_of(pathlib.Path(workdir), tmp_path / "run"))
  _cli("evaluate", "--workdir", workdir, "--beam", "1")
  second = str(tmp_path / "with_bleu")
  _cli("export", "--workdir", workdir, "--to", "hf", second)
  evals = pathlib.Path(workdir) / "eval"
  report = json.loads(next(evals.glob("*.json")).read_text())
  card = (pathlib.Path(second) / "README.md").read_text(encoding="utf-8")
  front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
  for line in ("language:\n- de\n- en", "tags:\n- translation", "license: unknown", "- bleu"):
    assert line in front
  assert f"value: {report['sacrebleu']:.2f}" in front
  assert f"{report['sacrebleu']:.2f}" in body and "`demo`" in body
  assert f"steps | {STEPS['demo']}" in body

"""Every benchmark script still imports: they are not run in CI (minutes each, and their figures
depend on the machine), so a rename in the package or in a sibling benchmark would otherwise
surface only when somebody measures (benchmarks/scaling.py imported a function that
train_step.py no longer had)."""

import importlib

import pytest
from helpers import ROOT

SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))
# Scripts that compare with transformers: they need the interop extra.
INTEROP = {"hf_generate_flags"}


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports_and_has_a_main(name, monkeypatch):
  if name in INTEROP:
    pytest.importorskip("transformers", minversion="5.18", reason="needs the interop extra")
  monkeypatch.syspath_prepend(str(ROOT))
  module = importlib.import_module(f"benchmarks.{name}")
  # The private helpers (_timing, _decode_regime) serve the scripts; every script has a main.
  assert name.startswith("_") or callable(getattr(module, "main", None)), name

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


def test_the_accelerator_check_runs_at_tiny_sizes_on_cpu(monkeypatch):
  """benchmarks/accelerator.py is kept ready for the minutes a GPU is lent: its --tiny run
  prints every figure it promises (docs/performance.md says where the real ones go). All but
  the "levers" section, which runs the combined section's step once per lever (four more
  compilations, a minute of CI): the combined section turns every lever on at once."""
  import subprocess
  import sys

  monkeypatch.syspath_prepend(str(ROOT))
  from benchmarks import accelerator

  sections = [name for name in accelerator.SECTIONS if name != "levers"]
  result = subprocess.run(
    [sys.executable, "benchmarks/accelerator.py", "--tiny", "--sections", ",".join(sections)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  # A section that raises prints its traceback, the others still run, and the exit is 1.
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert lines[0].startswith("device: ")
  for name in ("Base", "Big"):
    (line,) = [line for line in lines if line.startswith(f"{name} train step, ")]
    assert "tokens/s" in line and "MFU" in line and "XLA's peak for the step" in line
  assert any(line.startswith("Base beam-4 decode") and "sentences/s" in line for line in lines)
  assert any(line.startswith("attention: ") for line in lines)
  levers = [line for line in lines if line.startswith("Base train step (")]
  # The combined section: SIZES' rows and twice them (tiny: 8 = 12 capped).
  assert [line.split("(")[1].split(")")[0] for line in levers] == ["all levers"] * 2
  # ...with every single lever's changes on.
  for model_changes, train_changes in (accelerator.LEVERS[lever] for lever in accelerator.LEVERS):
    assert model_changes.items() <= accelerator.LEVERS["all levers"][0].items()
    assert train_changes.items() <= accelerator.LEVERS["all levers"][1].items()
  assert len([line for line in lines if line.startswith("Big train step (all levers)")]) == 2
  (ours, theirs) = [line for line in lines if "generate" in line and "sentences/s" in line]
  assert ours.startswith("beam-4 vs generate") and "ours / generate" in theirs
  # The same weights on both sides, float32 on a CPU: the same best hypotheses.
  assert "same best hypothesis for 100% of sentences" in theirs, theirs
  (check,) = [line for line in lines if line.startswith("bf16 loss ")]
  assert "within the tolerance" in check, check


def test_an_unknown_accelerator_section_is_one_usage_error_before_anything_runs():
  import subprocess
  import sys

  result = subprocess.run(
    [sys.executable, "benchmarks/accelerator.py", "--tiny", "--sections", "base,nope"],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert result.returncode == 2 and result.stdout == "", result
  assert result.stderr.splitlines()[-1].startswith(
    "accelerator.py: error: --sections: no section nope"
  )


@pytest.mark.slow
def test_the_input_bound_check_runs_at_tiny_size(monkeypatch):
  """benchmarks/_input_bound.py, as accelerator.py would call it: the tiny row trains from its
  generated corpus through the real pipeline and reports both step rates and the waiting share
  ("auto" workers: none on this CPU)."""
  monkeypatch.syspath_prepend(str(ROOT))
  from benchmarks import _input_bound

  lines = []
  (figures,) = _input_bound.input_bound_figures(
    tiny=True, workers=("auto", 0), print_line=lines.append
  )
  assert figures["workers"] == 0 and figures["target_slots_per_step"] == 512
  assert figures["fed_step_ms"] > 0 and figures["fixed_step_ms"] > 0
  assert 0.0 <= figures["waiting_share"] <= 1.0
  assert lines == [_input_bound.format_line(figures)] and "fed/fixed" in lines[0]

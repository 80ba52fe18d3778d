"""benchmarks/torch_reference.py, issue 42's PyTorch reference: it must be our model (the same
parameters, counted against our own `Transformer`'s shapes), and its --tiny run must print the
line the device call reads."""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("size", ["Base", "Big"])
def test_the_reference_has_our_parameter_count(monkeypatch, size):
  monkeypatch.syspath_prepend(str(ROOT))
  from benchmarks import accelerator, torch_reference
  from benchmarks.train_step import parameter_shapes

  shape = accelerator.SIZES[size]
  ours = sum(
    int(np.prod(leaf.shape))
    for leaf in jax.tree.leaves(parameter_shapes(accelerator.model_config(shape, "float32")))
  )
  with torch.device("meta"):  # shapes only: no memory for Big's 213M parameters
    reference = torch_reference.TransformerReference(*shape[:5], shape[6])
  assert torch_reference.parameter_count(reference) == ours
  assert ours > (60e6 if size == "Base" else 200e6)


def test_the_tiny_run_prints_a_step_line_per_size():
  result = subprocess.run(
    [sys.executable, "benchmarks/torch_reference.py", "--tiny", "--no-compile", "--reps", "1"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [line for line in result.stdout.splitlines() if line.startswith("PyTorch ")]
  assert [line.split(" train step")[0] for line in lines[1:]] == ["PyTorch Base", "PyTorch Big"]
  for line in lines[1:]:
    assert "tokens/s" in line and "MFU" in line and "eager" in line

"""benchmarks/torch_reference.py, the PyTorch reference of the accelerator check: it must be our
model (the same parameters, counted against our own `Transformer`'s shapes). Its --tiny run is
tests/test_benchmarks.py's."""

import pathlib

import jax
import numpy as np
import pytest

from transformer_mt.model.transformer import parameter_shapes

torch = pytest.importorskip("torch", reason="needs the interop extra: pip install -e '.[interop]'")

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("size", ["Base", "Big"])
def test_the_reference_has_our_parameter_count(monkeypatch, size):
  monkeypatch.syspath_prepend(str(ROOT))
  from benchmarks import accelerator, torch_reference

  shape = accelerator.SIZES[size]
  ours = sum(
    int(np.prod(leaf.shape))
    for leaf in jax.tree.leaves(parameter_shapes(accelerator.model_config(shape, "float32")))
  )
  with torch.device("meta"):  # shapes only: no memory for Big's 213M parameters
    reference = torch_reference.TransformerReference(*shape[:5], shape[6])
  assert torch_reference.parameter_count(reference) == ours
  assert ours > (60e6 if size == "Base" else 200e6)

"""benchmarks/torch_reference.py, the PyTorch reference of the accelerator check: it must be our
model (the same parameters, counted against our own `Transformer`'s shapes, and the same loss on
our weights). Its --tiny run is tests/test_benchmarks.py's."""

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


def test_the_reference_computes_our_loss_on_our_weights(monkeypatch):
  """The same model, not only the same count: on our initial weights (every one of them placed,
  `torch_state`) the reference's float32 loss is ours; on its own weights it is not, so the
  comparison sees where each weight went."""
  monkeypatch.syspath_prepend(str(ROOT))
  from benchmarks import torch_reference as reference

  size = reference.TINY["Base"]
  params = reference.our_initial_params(size)
  model = reference.reference_with_our_params(size, params)
  ours, theirs = reference.same_weights_losses(size, params, model, rows=2)
  assert abs(theirs / ours - 1) <= reference.SAME_LOSS_TOLERANCE, (ours, theirs)
  torch.manual_seed(0)
  own = reference.TransformerReference(*size[:5], size[6])
  _, other = reference.same_weights_losses(size, params, own, rows=2)
  assert abs(other / ours - 1) > 100 * reference.SAME_LOSS_TOLERANCE
  with pytest.raises(ValueError, match="without a place"):
    reference.torch_state({**params, "extra": {"kernel": np.zeros(2)}}, layers=size[3])

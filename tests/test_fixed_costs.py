"""Fixed costs of every training process that buy nothing: the metric writer does not import
torch (tensorboardX would), and a checkpoint of replicated arrays compiles no per-device slices
(Orbax's replica-parallel saving, off except on TPUs). Together they were ~6 s of a ~13 s tiny
demo run (2 Intel Xeon cores, compilation cache warm)."""

import importlib.util
import logging
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_mt.workdir import checkpointing

WRITE_METRICS_THEN_IMPORT_TORCH = """
import json, sys
from transformer_mt.workdir import metrics_log
writer = metrics_log.MetricWriter(sys.argv[1])
writer.write(1, {"loss": 2.5})
writer.close()
loaded = "torch" in sys.modules
import torch  # still importable afterwards
print(json.dumps({"torch_loaded_by_writer": loaded, "torch": torch.__name__}))
"""


@pytest.mark.skipif(
  importlib.util.find_spec("torch") is None,
  reason="needs torch: pip install -e '.[interop]'",
)
def test_the_metric_writer_leaves_torch_unloaded_and_importable(tmp_path):
  out = subprocess.run(
    [sys.executable, "-c", WRITE_METRICS_THEN_IMPORT_TORCH, str(tmp_path)],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  assert out.strip() == '{"torch_loaded_by_writer": false, "torch": "torch"}'
  assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.5}\n'
  assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_replicated_arrays_are_saved_without_a_slice_per_device(tmp_path, caplog):
  """Shapes no other test uses (their slices cannot have been compiled before in this process),
  with a first axis of 8 rows per replica: Orbax slices only axes the replicas divide."""
  devices = jax.devices("cpu")
  assert len(devices) == 8
  mesh = jax.sharding.Mesh(np.array(devices), ("data",))
  replicated = NamedSharding(mesh, P())
  values = {
    "a": np.arange(64 * 3, dtype=np.float32).reshape(64, 3),
    "b": np.linspace(-1, 1, 64 * 7, dtype=np.float32).reshape(64, 7),
  }
  params = {k: jax.device_put(v, replicated) for k, v in values.items()}
  manager = checkpointing.make_manager(str(tmp_path), keep=None)
  # Orbax takes the slices in its own thread, where a `jax.log_compiles()` context (thread
  # local) would not reach: the global flag does.
  jax.config.update("jax_log_compiles", True)
  try:
    with caplog.at_level(logging.WARNING):
      manager.save(7, force=True, args=ocp.args.Composite(params=ocp.args.StandardSave(params)))
      manager.wait_until_finished()
  finally:
    jax.config.update("jax_log_compiles", False)
  compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
  assert not [m for m in compiled if "slice" in m], compiled
  restored = manager.restore(7, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
  manager.close()
  for key, value in values.items():
    np.testing.assert_array_equal(np.asarray(restored["params"][key]), value)

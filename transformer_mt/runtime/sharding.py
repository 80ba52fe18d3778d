"""The device mesh (data, fsdp, tensor) and the map from logical axis names to it.

The model tags every parameter with logical names ("embed", "mlp", ...); the rules
below say which mesh axis shards each name. Data parallelism shards the batch over
"data" and "fsdp"; FSDP additionally shards parameters and optimizer state along
"embed" over "fsdp"; tensor parallelism shards heads / FFN width / vocabulary over
"tensor". The same code then runs on 1 CPU, 8 simulated devices or a pod.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_mt.runtime import errors

MESH_AXES = ("data", "fsdp", "tensor")
# The mesh axes a batch's rows are split over (the "batch" rule below).
BATCH_AXES = ("data", "fsdp")

# Logical axis -> mesh axes. Flax uses the first rule whose mesh axes are still free,
# so an activation's "embed" falls back to unsharded once "batch" has taken "fsdp".
LOGICAL_AXIS_RULES = (
  ("batch", BATCH_AXES),
  ("vocab", "tensor"),
  ("mlp", "tensor"),
  ("heads", "tensor"),
  ("embed", "fsdp"),
  ("embed", None),
  ("kv", None),
  ("length", None),
)


def mesh_shape(mesh_config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
  """Resolves the one -1 entry of (data, fsdp, tensor) so the product is `num_devices`."""
  sizes = [int(mesh_config[axis]) for axis in MESH_AXES]
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise errors.BadValue(
      f"mesh {dict(zip(MESH_AXES, sizes))}: each size must be positive, "
      "and at most one may be -1 (fill with the remaining devices)"
    )
  fixed = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % fixed:
      raise errors.BadValue(
        f"mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices are not "
        f"divisible by the fixed axes' product {fixed}"
      )
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise errors.BadValue(
      f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices "
      f"but {num_devices} are available; set mesh.data=-1 to use them all"
    )
  return tuple(sizes)


def inference_mesh_config(spec: str | None = None) -> ml_collections.ConfigDict:
  """The mesh translation runs on, from a `--mesh` value such as "data=1,fsdp=2,tensor=1".

  Axes left out keep the default: every device on "data" (parameters replicated), since
  decoding needs no FSDP memory savings on the devices of a training run. The training
  mesh in a checkpoint's config is ignored: it may need more devices than inference has.
  """
  sizes, given = {"data": -1, "fsdp": 1, "tensor": 1}, set()
  for part in (spec or "").split(","):
    if not part.strip():
      continue
    axis, sep, size = (text.strip() for text in part.partition("="))
    if not sep or axis not in sizes or not size.lstrip("-").isdigit():
      raise errors.BadValue(
        f"--mesh {spec!r}: expected comma-separated AXIS=SIZE with AXIS one of "
        f"{', '.join(MESH_AXES)} and SIZE an integer (-1: the remaining devices), "
        "e.g. --mesh data=1,fsdp=1,tensor=1"
      )
    sizes[axis] = int(size)
    given.add(axis)
  if "data" not in given and -1 in (sizes["fsdp"], sizes["tensor"]):
    sizes["data"] = 1  # another axis takes the remaining devices
  return ml_collections.ConfigDict(sizes)


def make_mesh(
  mesh_config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """A mesh over `devices` (default: every device of every process)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  return jax.make_mesh(
    shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices
  )


def _undivided(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh):
  """(index, size, mesh axis names, their total size) of each dimension of `shape` that the
  mesh axes `spec` gives it do not divide."""
  padded = tuple(spec) + (None,) * (len(shape) - len(spec))
  for i, (dim, axes) in enumerate(zip(shape, padded)):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[name] for name in names)
    if size > 1 and dim % size:
      yield i, dim, names, size


def undivided_dimensions(
  abstract_tree: Any, mesh: Mesh, rules: Sequence[tuple[str, Any]] = LOGICAL_AXIS_RULES
) -> list[str]:
  """Each parameter dimension its mesh axes do not divide, in words ("path: shape (...),
  dimension i (size d) over mesh axis 'tensor' of size 4"), for a tree of boxed abstract
  arrays as `logical_shardings` takes. `logical_shardings` would replicate those dimensions."""
  specs = nn.logical_to_mesh(nn.get_partition_spec(abstract_tree), rules)
  shapes = nn.unbox(abstract_tree)
  problems = []
  is_spec = lambda x: isinstance(x, PartitionSpec) or x is None  # noqa: E731
  for (path, spec), leaf in zip(
    jax.tree_util.tree_leaves_with_path(specs, is_leaf=is_spec), jax.tree.leaves(shapes)
  ):
    spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
    for i, dim, names, size in _undivided(spec, leaf.shape, mesh):
      axes = " x ".join(f"{name!r}" for name in names)
      problems.append(
        f"{jax.tree_util.keystr(path, simple=True, separator='/')}: shape {tuple(leaf.shape)}, "
        f"dimension {i} (size {dim}) over mesh axis {axes} of size {size}"
      )
  return problems


def _fit_spec_to_shape(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  """Drops the sharding of dimensions the mesh axes do not divide (e.g. an odd vocab).

  Training refuses such a layout unless mesh.allow_replicated_fallback is set (see
  run_setup.check_parameter_layout); inference, on whatever devices it runs, accepts it."""
  fitted = list(tuple(spec) + (None,) * (len(shape) - len(spec)))
  for i, dim, names, size in _undivided(spec, shape, mesh):
    logging.warning(
      "Replicating a dimension of size %d: mesh axes %s (size %d) do not divide it.",
      dim,
      names,
      size,
    )
    fitted[i] = None
  return PartitionSpec(*fitted)


def logical_shardings(
  abstract_tree: Any, mesh: Mesh, rules: Sequence[tuple[str, Any]] = LOGICAL_AXIS_RULES
) -> Any:
  """NamedShardings for a tree of (boxed) abstract arrays from `jax.eval_shape`.

  Leaves boxed with logical names are sharded by `rules`; other leaves (step
  counters, RNG keys, optimizer scalars) are replicated.
  """
  logical_specs = nn.get_partition_spec(abstract_tree)
  mesh_specs = nn.logical_to_mesh(logical_specs, rules)
  shapes = nn.unbox(abstract_tree)

  def to_sharding(spec, leaf):
    spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
    return NamedSharding(mesh, _fit_spec_to_shape(spec, leaf.shape, mesh))

  return jax.tree.map(
    to_sharding, mesh_specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None
  )


def batch_sharding(mesh: Mesh, ndim: int = 2, batch_dim: int = 0) -> NamedSharding:
  """Shards dimension `batch_dim` of an input array over (data, fsdp)."""
  spec = [None] * ndim
  spec[batch_dim] = BATCH_AXES
  return NamedSharding(mesh, PartitionSpec(*spec))


def batch_shards() -> int:
  """The devices a batch's rows are split over (the product of the BATCH_AXES sizes) in the
  mesh the caller is traced under (`jax.set_mesh`, as the jitted steps are); 1 outside one.
  Shapes seen while tracing are global: a device holds the rows over this many."""
  sizes = jax.sharding.get_abstract_mesh().shape
  return math.prod(sizes.get(axis, 1) for axis in BATCH_AXES)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def global_batch_from_local(
  local_batch: dict[str, np.ndarray], mesh: Mesh, batch_dim: int = 0
) -> dict[str, jax.Array]:
  """Assembles each process's slice of the batch into global sharded arrays.

  With one process this is a sharded device_put; with several, each process
  passes only the rows it read and the result spans all of them.
  """

  def put(array):
    sharding = batch_sharding(mesh, array.ndim, batch_dim)
    if jax.process_count() == 1:
      return jax.device_put(array, sharding)
    return jax.make_array_from_process_local_data(sharding, array)

  return {name: put(np.asarray(array)) for name, array in local_batch.items()}


class DevicePrefetch:
  """Batches from a checkpointable host iterator, the next `size` already placed on the mesh.

  `jax.device_put` is asynchronous, so placing batch k+1 while step k runs hides the
  host-to-device copy. The host iterator runs ahead of the loop by `size` batches, so the
  state this object reports (and a checkpoint saves) is the one the host iterator had
  before the first batch not yet returned: a run resumed from it gets that batch next, and
  no prefetched-but-unused batch is lost or repeated. Restoring a state drops the
  prefetched batches. Orbax's Grain handler saves and restores it like the host iterator
  (its `get_state` bytes).
  """

  def __init__(self, batches, mesh: Mesh, batch_dim: int = 0, size: int = 2):
    if size < 0:
      raise ValueError(f"prefetch size {size} must be 0 or more.")
    self._batches, self._mesh, self._batch_dim, self._size = batches, mesh, batch_dim, size
    self._ahead = collections.deque()  # (host state before the batch, placed batch)

  def __iter__(self) -> DevicePrefetch:
    return self

  def __next__(self) -> dict[str, jax.Array]:
    while len(self._ahead) <= self._size:
      state = self._batches.get_state()
      placed = global_batch_from_local(next(self._batches), self._mesh, self._batch_dim)
      self._ahead.append((state, placed))
    return self._ahead.popleft()[1]

  def peek(self) -> dict[str, jax.Array]:
    """The batch the next `next` returns, without taking it (its shapes and shardings are
    the train step's, which can then compile ahead: runtime/ahead_of_time.py)."""
    if not self._ahead:
      state = self._batches.get_state()
      self._ahead.append(
        (state, global_batch_from_local(next(self._batches), self._mesh, self._batch_dim))
      )
    return self._ahead[0][1]

  def get_state(self) -> bytes:
    return self._ahead[0][0] if self._ahead else self._batches.get_state()

  def set_state(self, state: bytes) -> None:
    self._ahead.clear()
    self._batches.set_state(state)

  def start_prefetch(self) -> None:
    self._batches.start_prefetch()

  def close(self) -> None:
    self._ahead.clear()
    self._batches.close()


def global_batch_from_host(batch: Any, mesh: Mesh, batch_dim: int = 0) -> Any:
  """Arrays identical on every process (e.g. evaluation batches), sharded over (data, fsdp).

  Unlike `global_batch_from_local`, every process holds all rows and each device takes
  its slice. `batch` is an array or a tree of arrays.
  """

  def put(array):
    array = np.asarray(array)
    sharding = batch_sharding(mesh, array.ndim, batch_dim)
    if jax.process_count() == 1:
      return jax.device_put(array, sharding)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

  return jax.tree.map(put, batch)


def to_host(array: jax.Array) -> np.ndarray:
  """The whole value of a (possibly multi-process sharded) array as numpy, on every process."""
  if jax.process_count() == 1 or array.is_fully_replicated:
    return np.asarray(jax.device_get(array))
  return np.asarray(multihost_utils.process_allgather(array, tiled=True))

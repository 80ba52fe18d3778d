"""Multi-process runs: one JAX process per host (or per GPU), joined by `jax.distributed`.

The same `run.py train` command runs as one process or as many. With several, every
process holds the whole mesh (all devices of all processes), reads its own shard of the
training data and passes only its rows to `sharding.global_batch_from_local`; Orbax
checkpoints are written collectively (each process writes its shards, process 0 the
metadata), and only process 0 writes metrics, logs and reports.

How the processes find each other (`initialize`):
  * explicit: `--coordinator_address HOST:PORT --num_processes N --process_id I` on every
    process (any machine; e.g. two CPU processes on 127.0.0.1);
  * SLURM (`srun` with several tasks) and Open MPI (`mpirun -np N`): detected from their
    environment, nothing to pass;
  * Cloud TPU VMs: detected by their TPU chips on the PCI bus; JAX reads the slice's workers
    from the TPU metadata (a single-host slice becomes a one-process run);
  * other clusters JAX knows (e.g. Kubernetes): pass `--multihost`, and JAX detects the rest;
  * `--no_multihost` turns detection off: one process, whatever the environment says.
The workdir must be on a filesystem every process sees (GCS, NFS, Lustre...).
"""

from __future__ import annotations

import glob
import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer_mt.runtime import errors

# Where Linux lists PCI devices, each with `vendor` and `device` files ("0x1ae0\n").
PCI_DEVICES = "/sys/bus/pci/devices"
GOOGLE_PCI_VENDOR_ID = "0x1ae0"
# The PCI device ids of TPU chips (v3, v4, v5p, v5e, v6e, TPU7x...), as JAX knows them; this copy
# of jax/_src/hardware_utils.py's table serves only if that private module moves. Google's other
# PCI devices (gVNIC network cards, local NVMe disks) are on GPU and CPU VMs too.
_TPU_PCI_DEVICE_IDS_FALLBACK = frozenset(
  {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"}
)


def _tpu_pci_device_ids() -> frozenset[str]:
  try:
    from jax._src import hardware_utils

    return frozenset(hardware_utils._TPU_PCI_DEVICE_IDS)
  except (ImportError, AttributeError):
    return _TPU_PCI_DEVICE_IDS_FALLBACK


def _read_id(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read().strip().lower()
  except OSError:
    return None


def tpu_chip_count(pci_devices: str | None = None) -> int:
  """TPU chips on this machine's PCI bus: Google's vendor id and a TPU device id.

  This is how JAX itself decides it runs on a Cloud TPU VM (cloud_tpu_init.py), read from
  sysfs without starting a backend. Device files alone do not tell: /dev/accel* are also Intel
  NPUs, Habana Gaudi and AMD XDNA, and /dev/vfio/N any device passed through to a VM.
  """
  root = PCI_DEVICES if pci_devices is None else pci_devices
  tpu_ids = _tpu_pci_device_ids()
  count = 0
  for device in sorted(glob.glob(os.path.join(root, "*"))):
    if _read_id(os.path.join(device, "vendor")) != GOOGLE_PCI_VENDOR_ID:
      continue
    if _read_id(os.path.join(device, "device")) in tpu_ids:
      count += 1
  return count


def on_tpu_host() -> bool:
  """True on a Cloud TPU VM (a TPU chip on the PCI bus; see tpu_chip_count)."""
  return tpu_chip_count() > 0


def launched_as_several_processes() -> bool:
  """True when SLURM or Open MPI started this command as one of several tasks."""
  counts = (
    os.environ.get("SLURM_NTASKS") if "SLURM_JOB_ID" in os.environ else None,
    os.environ.get("OMPI_COMM_WORLD_SIZE"),
  )
  return any(count is not None and count.isdigit() and int(count) > 1 for count in counts)


_EXPLICIT_FLAGS = ("--coordinator_address", "--num_processes", "--process_id")


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  multihost: bool = False,
  no_multihost: bool = False,
) -> bool:
  """Joins this process to a multi-process run when it is one; returns whether it did.

  Must run before any JAX computation. Explicit arguments win; otherwise SLURM / Open MPI
  are detected from their environment and TPU VMs by their TPU chips; `multihost=True` lets
  JAX auto-detect any other cluster it supports, and `no_multihost=True` turns all detection
  off (one process, e.g. a single-task job inside a multi-task SLURM allocation). A plain
  single command elsewhere does nothing.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if no_multihost:
    given = [flag for flag, value in zip(_EXPLICIT_FLAGS, explicit) if value is not None]
    given += ["--multihost"] if multihost else []
    if given:
      raise errors.BadValue(
        f"--no_multihost runs one process; it cannot be combined with {', '.join(given)}."
      )
    return False
  if any(value is not None for value in explicit):
    if any(value is None for value in explicit):
      raise errors.BadValue(
        "A multi-process launch needs all of --coordinator_address HOST:PORT, "
        "--num_processes N and --process_id I (0..N-1) on every process; got "
        f"coordinator_address={coordinator_address}, num_processes={num_processes}, "
        f"process_id={process_id}."
      )
    if not 0 <= process_id < num_processes:
      raise errors.BadValue(
        f"--process_id {process_id} must be in 0..{num_processes - 1} "
        f"(--num_processes {num_processes})."
      )
    if ":" not in coordinator_address:
      raise errors.BadValue(
        f"--coordinator_address {coordinator_address!r} must be HOST:PORT, "
        "e.g. 10.0.0.1:8476 (the address of process 0)."
      )
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
  elif multihost or launched_as_several_processes() or on_tpu_host():
    jax.distributed.initialize()
  else:
    return False
  logging.info(
    "Process %d of %d: %d local devices, %d in all.",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
  if jax.process_index() != 0:
    # Only process 0 reports; the others still print warnings and errors.
    logging.getLogger().setLevel(logging.WARNING)
  return True


def is_primary() -> bool:
  """Process 0: the one that writes logs, metrics, tokenizers and reports."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (a no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def preemption_sync_available() -> bool:
  """True once `jax.distributed.initialize` ran with JAX's preemption service on (the
  default, see `multihost_utils.reached_preemption_sync_point`): it then created the
  preemption sync manager, which catches SIGTERM itself. Also with one process (e.g. a
  single-host TPU slice), where the sync point is that process's own next step."""
  from jax._src import distributed as jax_distributed  # the manager has no public accessor

  state = jax_distributed.global_state
  return getattr(state, "client", None) is not None and (
    getattr(state, "preemption_sync_manager", None) is not None
  )


def reached_preemption_sync_point(step: int) -> bool:
  """True on every process at the same step once any of them got SIGTERM: the step the
  processes agreed on in the background (the furthest any had reached, plus one). Cheap (a
  local check, no host sync); must be called at every step, by every process."""
  return multihost_utils.reached_preemption_sync_point(step)


def from_primary(value: int) -> int:
  """Process 0's `value` on every process (e.g. the sweep trial it claimed for them all)."""
  if jax.process_count() == 1:
    return value
  return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def any_process(flag: bool) -> bool:
  """True on every process if `flag` is true on any (e.g. one host got SIGTERM)."""
  if jax.process_count() == 1:
    return flag
  return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))

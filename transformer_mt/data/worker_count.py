"""How many input worker processes `data.num_workers="auto"` means on the host a run starts on.

Without workers the training process tokenizes, filters and packs its own batches: ~220-340k
target tokens/s on one core (docs/performance.md, benchmarks/input_pipeline.py), while one GPU
consumes 475-556k a step at today's rates (the H200 run) and more once the step is faster. A
run on an accelerator fed that way waits for its input; the worker processes
(input_pipeline.py, `mp_prefetch`) each pack ~300k/s on a core of their own.

"auto" is therefore:
  - on CPU: 0. The step's XLA threads use every core, and a worker would take one from them
    (the batches are then the same as before "auto" existed);
  - on GPU and TPU: min(usable cores - 1, max(8, 4 x local accelerators)). Usable cores are
    the ones this process may run on (`os.sched_getaffinity`, which honours taskset, cgroup
    cpusets and SLURM's binding) divided by the processes of the job on this host (one per
    GPU under torchrun, mpirun or srun; `local_processes`), minus one for the training
    process itself. Four workers per device keep ~1.2M target tokens/s per device coming,
    about twice what a device consumed in the H200 run; never fewer than 8 (one device's
    share of a 16-core host), never more than the cores.

A run records the count "auto" gave it (training/auto_settings.py): with 2 or more workers the
batch order depends on the count, so a resume on another host keeps the recorded one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from transformer_mt.runtime import errors

AUTO = "auto"
ACCELERATOR_PLATFORMS = ("gpu", "tpu")
WORKERS_PER_DEVICE = 4
MIN_ACCELERATOR_WORKERS = 8
# Launchers' count of a job's processes on this host (the first one set is used).
LOCAL_PROCESS_VARIABLES = (
  "LOCAL_WORLD_SIZE",  # torchrun
  "OMPI_COMM_WORLD_LOCAL_SIZE",  # Open MPI's mpirun
  "SLURM_NTASKS_PER_NODE",  # srun --ntasks-per-node
)


def check(value) -> None:
  """Raises BadValue unless `value` is "auto" or a worker count (an int >= 0)."""
  if value == AUTO:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise errors.BadValue(
      f"data.num_workers={value!r}: expected 0 (no workers), a number of worker processes, "
      "or 'auto' (chosen from the host's cores on GPU/TPU, 0 on CPU)."
    )


def local_processes(environ: Mapping[str, str] = os.environ) -> int:
  """The job's processes on this host, from the launcher's environment (1 when none says)."""
  for name in LOCAL_PROCESS_VARIABLES:
    text = environ.get(name, "").strip()
    # SLURM may write "8(x2)": 8 tasks on each of 2 nodes.
    digits = text.split("(")[0]
    if digits.isdigit() and int(digits) > 0:
      return int(digits)
  return 1


def usable_cores(environ: Mapping[str, str] = os.environ) -> int:
  """This process's share of the cores it may run on: affinity / local processes, >= 1."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cores = os.cpu_count() or 1
  return max(1, cores // local_processes(environ))


def auto_workers(platform: str, cores: int, local_devices: int) -> int:
  """The worker count of "auto" for a process on `platform` ("cpu", "gpu", "tpu") with
  `cores` usable cores driving `local_devices` devices (module docstring)."""
  if platform not in ACCELERATOR_PLATFORMS:
    return 0
  wanted = max(MIN_ACCELERATOR_WORKERS, WORKERS_PER_DEVICE * local_devices)
  return max(0, min(cores - 1, wanted))


def resolve(value, platform: str | None = None, cores: int | None = None) -> int:
  """`data.num_workers` as a count: itself, or for "auto" the count for this process (JAX's
  default backend and local devices, `usable_cores`)."""
  check(value)
  if value != AUTO:
    return value
  import jax

  platform = platform or jax.default_backend()
  cores = usable_cores() if cores is None else cores
  return auto_workers(platform, cores, jax.local_device_count())

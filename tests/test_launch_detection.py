"""Which environments start a multi-process run (distributed.initialize), with the machine faked:
a sysfs PCI tree in tmp_path, /dev device files through glob, SLURM / Open MPI variables.

Nothing here starts JAX's distributed runtime: jax.distributed.initialize is replaced by a
recorder, so each case asks only "would this command have joined a cluster?"."""

import glob
import os

import jax
import pytest

from transformer_mt import cli
from transformer_mt.runtime import distributed, errors

INTEL = "0x8086"
GOOGLE = distributed.GOOGLE_PCI_VENDOR_ID
TPU_V4 = "0x005e"  # jax/_src/hardware_utils.py: TpuVersion.v4
GVNIC = "0x0042"  # Google's virtual network card, on GPU and CPU VMs of Google Cloud too


def fake_pci(root, *devices):
  """A sysfs PCI tree: one directory per (vendor, device) id pair, as in /sys/bus/pci/devices."""
  root.mkdir(exist_ok=True)
  for i, (vendor, device) in enumerate(devices):
    slot = root / f"0000:00:{i:02x}.0"
    slot.mkdir()
    (slot / "vendor").write_text(vendor + "\n")
    (slot / "device").write_text(device + "\n")
  return root


@pytest.fixture
def machine(monkeypatch, tmp_path):
  """A plain machine: no cluster variables, an empty PCI bus, /dev/accel0 and /dev/vfio/0
  present (an Intel NPU and a passed-through device), and a recording jax.distributed."""
  for name in list(os.environ):
    if name.startswith(("SLURM_", "OMPI_", "TPU_")):
      monkeypatch.delenv(name)
  monkeypatch.setattr(distributed, "PCI_DEVICES", str(fake_pci(tmp_path / "pci")))
  real_glob = glob.glob
  dev_files = ["/dev/accel0", "/dev/vfio/0"]

  def fake_glob(pattern, *args, **kwargs):
    if pattern.startswith("/dev/"):
      return [f for f in dev_files if glob.fnmatch.fnmatch(f, pattern)]
    return real_glob(pattern, *args, **kwargs)

  monkeypatch.setattr(glob, "glob", fake_glob)
  joined = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: joined.append(a))
  return tmp_path, joined


def test_accelerator_device_files_alone_are_not_a_tpu_vm(machine):
  tmp_path, joined = machine
  fake_pci(tmp_path / "pci", (INTEL, "0x7d1d"), (GOOGLE, GVNIC))  # Intel NPU, Google NIC
  assert glob.glob("/dev/accel*") == ["/dev/accel0"]  # what the old detection took for a TPU
  assert distributed.tpu_chip_count() == 0
  assert not distributed.on_tpu_host()
  assert distributed.initialize() is False
  assert joined == []


def test_a_tpu_chip_on_the_pci_bus_is_a_tpu_vm(machine):
  tmp_path, joined = machine
  fake_pci(tmp_path / "pci", (GOOGLE, GVNIC), (GOOGLE, TPU_V4), (GOOGLE, TPU_V4.upper()))
  assert distributed.tpu_chip_count() == 2
  assert distributed.on_tpu_host()
  assert distributed.initialize() is True
  assert joined == [()]  # JAX's own detection reads the slice's workers from the metadata


def test_our_tpu_id_table_matches_jax(machine):
  from jax._src import hardware_utils

  assert distributed._tpu_pci_device_ids() == set(hardware_utils._TPU_PCI_DEVICE_IDS)
  assert set(hardware_utils._TPU_PCI_DEVICE_IDS) >= distributed._TPU_PCI_DEVICE_IDS_FALLBACK
  assert GOOGLE == hardware_utils._GOOGLE_PCI_VENDOR_ID


def test_no_multihost_turns_detection_off(machine, monkeypatch):
  tmp_path, joined = machine
  monkeypatch.setenv("SLURM_JOB_ID", "42")
  monkeypatch.setenv("SLURM_NTASKS", "4")
  fake_pci(tmp_path / "pci", (GOOGLE, TPU_V4))
  assert distributed.initialize(no_multihost=True) is False
  assert joined == []
  assert distributed.initialize() is True  # without the flag, SLURM and the TPU are detected
  assert joined == [()]


def test_no_multihost_with_cluster_flags_is_an_error(machine):
  _, joined = machine
  with pytest.raises(ValueError, match="--no_multihost .* --multihost"):
    distributed.initialize(multihost=True, no_multihost=True)
  with pytest.raises(ValueError, match="--coordinator_address, --num_processes, --process_id"):
    distributed.initialize("127.0.0.1:1234", 2, 0, no_multihost=True)
  assert joined == []


def test_no_multihost_reaches_initialize_from_the_command_line(machine, monkeypatch, capsys):
  tmp_path, joined = machine
  monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
  seen = []

  def record_and_stop(*args):
    seen.append(args[-2:])  # (multihost, no_multihost)
    raise errors.BadValue("stop here")

  monkeypatch.setattr(distributed, "initialize", record_and_stop)
  for flags, wanted in (([], (False, False)), (["--no_multihost"], (False, True))):
    status = cli.main(["train", "--workdir", str(tmp_path / "w"), *flags])
    assert status == 2 and seen.pop() == wanted
  assert "error: stop here" in capsys.readouterr().err
  assert not (tmp_path / "w").exists()

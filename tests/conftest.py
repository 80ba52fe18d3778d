"""Test setup: 8 simulated CPU devices (unless XLA_FLAGS already asks for a count), LLVM -O0
code generation and XLA:CPU's older fusion emitters (both compile faster), the CPU platform
(unless JAX_PLATFORMS is set), one compilation cache for the run (never the user's), run.py's
garbage-collector thresholds, the repository root on sys.path (so the tests also run from a
checkout that is not installed), no skipped test under CI, compiled programs freed between test
files before a worker nears Linux's memory-map limit, and a crashed worker that ends the run."""

import gc
import os
import pathlib
import shutil
import sys
import tempfile

import pytest

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()

# The suite's time is mostly XLA compiling tiny programs, and on CPU most of a compile is LLVM
# optimizing the generated code. At LLVM's -O0 the same HLO passes run (XLA's fusion and
# layout decisions are unchanged) and a compile takes about half as long; the code runs slower,
# which tiny shapes do not feel. Results may differ from -O2 in the last bit of a float32 (no
# test's tolerance is that tight: docs/testing.md). The run.py processes tests start inherit
# it (helpers.child_xla_flags); an XLA_FLAGS that sets the level already wins.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# XLA:CPU's fusion emitters (MLIR, its default) take ~2.5x as long to compile a tiny beam search
# as its older LLVM IR emitters, and ~1.5x for a tiny train step (0.51 -> 0.20 s, 2.2 -> 1.5 s
# on an AMD EPYC, 2026-12-02); a train step's parameters then differ from the default's by
# 4e-9 at most. An XLA_FLAGS that sets xla_cpu_use_fusion_emitters already wins.
if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"

# Tests run on CPU devices even on a GPU host (JAX_PLATFORMS='' or 'cuda' to override): their
# tolerances are CPU float32's, the run.py processes they start and compare with must share a
# platform, and a 1-vs-8-device test needs the 8 simulated CPU devices (so does train() with
# mesh.fsdp=8, which takes jax.devices()).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent compilation cache for the whole run, never the user's (compile_cache.py): a
# temporary directory made by the first process (pytest itself, or the xdist controller) and
# inherited by the xdist workers and every run.py process the tests start, so a program that
# several processes compile (a tiny demo run's train step, its decoder) compiles once. A
# JAX_COMPILATION_CACHE_DIR already set wins ("" turns the cache off).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="transformer_mt_test_jax_")
  _OWN_COMPILATION_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]
else:
  _OWN_COMPILATION_CACHE = None

# Nor the user's prepared-corpus cache (data/line_index_cache.py: $XDG_CACHE_HOME/transformer_mt/
# prepared when data.prepared_dir is ""): one temporary cache for the session and its children.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="transformer_mt_test_cache_")

_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

import jax  # noqa: E402  (after XLA_FLAGS: the CPU device count is read when JAX starts)
import shared_data  # noqa: E402

from transformer_mt.runtime import allocator  # noqa: E402

# The garbage collector's thresholds of run.py (runtime/allocator.py): at Python's defaults the
# tracing of the tests' programs spent ~7% of a worker's time in collections (6.3 s of 88 s
# over test_decode.py and test_averaging.py, AMD EPYC; 1.5 s with these).
allocator.collect_less_often()

NUM_CPU_DEVICES = 8


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads --max-worker-restart
def pytest_configure(config):
  config.addinivalue_line(
    "markers",
    "shared_data(*paths): needs these files under ../shared/data (tests/shared_data.py); "
    "skipped when absent, failed under CI",
  )
  # A worker that crashes (XLA:CPU segfaulted in compiles once a worker held ~65,000 memory
  # maps: _free_compiled_programs) stops the run: with --dist loadfile, pytest-xdist 3.8
  # restarts it and then waits forever for a file it never hands out. A crash is then a failed
  # test and an exit, not a hung CI job.
  # --max-worker-restart on the command line wins.
  if getattr(config.option, "maxworkerrestart", "") is None:
    config.option.maxworkerrestart = "0"


def pytest_unconfigure(config):
  if _OWN_COMPILATION_CACHE:  # only the process that made it: workers end before it does
    shutil.rmtree(_OWN_COMPILATION_CACHE, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before the fixtures, which may read the files
def pytest_runtest_setup(item):
  for mark in item.iter_markers("shared_data"):
    shared_data.require(*mark.args)


@pytest.fixture(scope="session")
def cpu_devices() -> list:
  """The 8 simulated CPU devices multi-device tests run on. CPU ones, not jax.devices(): on a
  GPU host those are the GPUs (often one), and the 1-vs-8 tests would not run."""
  devices = jax.devices("cpu")
  if len(devices) < NUM_CPU_DEVICES:
    pytest.skip(
      f"needs {NUM_CPU_DEVICES} CPU devices, JAX has {len(devices)}: leave the host device "
      f"count out of XLA_FLAGS (conftest sets it) or set it to {NUM_CPU_DEVICES}"
    )
  return devices[:NUM_CPU_DEVICES]


@pytest.fixture(scope="session")
def postgres_url() -> str:
  """The SQLAlchemy URL of a PostgreSQL database, for Optuna's RDB storage (sweep studies shared
  between hosts), from TRANSFORMER_MT_TEST_POSTGRES: .ci/run starts a throwaway server and sets
  it. One database serves the whole run and is never emptied, so each test names its studies
  uniquely (its name and a uuid4): runs, tests and xdist workers then never see each other's."""
  url = os.environ.get("TRANSFORMER_MT_TEST_POSTGRES", "")
  if not url:
    pytest.skip(
      "needs a PostgreSQL server: set TRANSFORMER_MT_TEST_POSTGRES=postgresql+psycopg2://"
      "user:password@host:port/database (.ci/run starts one)"
    )
  return url


def _memory_maps() -> tuple[int, int] | None:
  """(memory maps this process holds, Linux's limit on them: vm.max_map_count), or None where
  /proc does not give both (off Linux)."""
  try:
    with open("/proc/self/maps", "rb") as maps:
      held = sum(1 for _ in maps)
    with open("/proc/sys/vm/max_map_count") as limit:
      return held, int(limit.read())
  except (OSError, ValueError):
    return None


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
  """Drops JAX's compiled programs after a test file (and its own fixtures) once the process
  holds a quarter of Linux's memory-map limit. XLA:CPU maps each program's machine code (about
  3 maps per kernel, ~170 per tiny train step), and the jit caches (and a file's
  functools.cache'd jitted functions) keep every program alive: a worker that ran a few slow
  files reached the limit (65,530 by default) and segfaulted in its next compile, as CI did on
  2026-12-02 (test_beam_search alone leaves 21,400 maps; 736 once cleared). Below the quarter
  the programs stay, so later files that run them again do not recompile (clearing after every
  file made the quick loop 140 s -> 186 s). Off Linux they are dropped after every file."""
  yield
  maps = _memory_maps()
  if maps is None or maps[0] > maps[1] // 4:
    jax.clear_caches()
    gc.collect()


def _in_ci() -> bool:
  """CI services set CI (GitHub Actions, GitLab: "true"); "", "0" and "false" mean unset."""
  return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def _fail_instead_of_skip(report) -> None:
  """Under CI a skip is a failure: a test that needs data, a device count or an extra that
  CI lacks would otherwise pass CI having tested nothing."""
  reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
  report.outcome = "failed"
  report.longrepr = f"skipped under CI (CI={os.environ['CI']!r}), which runs every test: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
  report = yield
  if report.skipped and _in_ci() and not hasattr(report, "wasxfail"):
    _fail_instead_of_skip(report)
  return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
  report = yield  # a module-level pytest.importorskip skips at collection
  if report.skipped and _in_ci():
    _fail_instead_of_skip(report)
  return report


# The files that take longest (worker-seconds of one CI-like run on 2 cores, --durations:
# each from ~30 s to ~4 minutes; together ~90% of the suite): every test in them is marked
# slow, so `-m "not slow"` is the quick loop of the remaining files, and they are collected
# first, longest first. pytest-xdist's --dist loadfile hands out whole files in collection
# order, so a long file started last would keep one worker busy while the other has nothing
# left to take; started first, the short files fill in around them.
SLOW_FILES = (
  "test_readme.py",
  "test_export.py",
  "test_beam_decode.py",
  "test_multihost.py",
  "test_beam_search.py",
  "test_benchmarks.py",
  "test_fault_tolerance.py",
  "test_chunked_loss.py",
  "test_training.py",
  "test_hf_languages.py",
  "test_dropout_rng.py",
  "test_hf_beam.py",
  "test_model.py",
  "test_ensemble.py",
  "test_end_to_end.py",
  "test_sweep.py",
  "test_hf_import_kinds.py",
  "test_fused_kernels.py",
  "test_mutant_guards.py",
  "test_damaged_checkpoint.py",
  "test_export_use.py",
  "test_decode.py",
  "test_workdir_lock.py",
  "test_input_pipeline.py",
  "test_bf16.py",
  "test_sampling.py",
  "test_averaging.py",
  "test_checkpoint_layout.py",
  "test_nonfinite_steps.py",
  "test_hf_models.py",
  "test_fused_qkv.py",
  "test_scoring.py",
  "test_finetune_import.py",
  "test_attention_masks.py",
)


def pytest_collection_modifyitems(config, items):
  def rank(item) -> int:
    name = item.path.name
    return SLOW_FILES.index(name) if name in SLOW_FILES else len(SLOW_FILES)

  for item in items:
    if item.path.name in SLOW_FILES:
      item.add_marker(pytest.mark.slow)
  items.sort(key=rank)  # stable: each file's tests keep their order

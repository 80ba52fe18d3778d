"""data.num_workers="auto" (data/worker_count.py) with fake platforms, cores and launchers, and
how a run resolves its "auto" settings against the checkpoints it resumes
(training/auto_settings.py, with a recorded config given in place of a workdir's)."""

import ml_collections
import pytest

from transformer_mt.config import defaults, registry
from transformer_mt.data import worker_count
from transformer_mt.runtime import errors
from transformer_mt.training import auto_settings


@pytest.mark.parametrize(
  "platform, cores, devices, expected",
  [
    ("cpu", 64, 1, 0),  # the step's XLA threads take every core
    ("gpu", 16, 1, 8),  # the H200 host: 8, one core left for the training process
    ("gpu", 4, 1, 3),  # fewer cores than 8 + 1: all but one
    ("gpu", 1, 1, 0),  # no core to spare
    ("tpu", 240, 4, 16),  # 4 per device beyond 8
    ("gpu", 128, 8, 32),
    ("gpu", 20, 8, 19),
  ],
)
def test_auto_workers_by_platform_cores_and_devices(platform, cores, devices, expected):
  assert worker_count.auto_workers(platform, cores, devices) == expected


def test_usable_cores_are_the_affinity_shared_by_the_local_processes(monkeypatch):
  """os.sched_getaffinity's cores, divided by the launcher's processes on this host."""
  monkeypatch.setattr(worker_count.os, "sched_getaffinity", lambda pid: set(range(16)))
  assert worker_count.usable_cores({}) == 16
  assert worker_count.usable_cores({"LOCAL_WORLD_SIZE": "4"}) == 4
  assert worker_count.usable_cores({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}) == 2
  assert worker_count.usable_cores({"SLURM_NTASKS_PER_NODE": "2(x3)"}) == 8
  assert worker_count.usable_cores({"SLURM_NTASKS_PER_NODE": "32"}) == 1  # never 0
  assert worker_count.usable_cores({"LOCAL_WORLD_SIZE": ""}) == 16
  # The resolved count on a fake GPU process with 4 processes on a 16-core host: 4 - 1.
  assert worker_count.resolve("auto", platform="gpu", cores=4) == 3
  assert worker_count.resolve("auto", platform="cpu", cores=16) == 0
  assert worker_count.resolve(5, platform="gpu") == 5


@pytest.mark.parametrize("bad", [-1, "many", 2.0, True, None])
def test_a_bad_worker_count_is_one_error(bad):
  with pytest.raises(errors.BadValue, match=r"data.num_workers=.*'auto'"):
    worker_count.check(bad)


def test_every_experiment_takes_auto_and_counts():
  """defaults.py's field holds "auto" and takes an int override, and the reverse (an
  ml_collections field is typed by its first value otherwise); so do experiments."""
  config = defaults.base_config()
  assert config.data.num_workers == "auto"
  registry.apply_overrides(config, ["data.num_workers=3"])
  assert config.data.num_workers == 3
  registry.apply_overrides(config, ["data.num_workers='auto'"])
  assert config.data.num_workers == "auto"
  row = registry.load_experiment("transformer_base_wmt14_ende", ["data.num_workers=2"])
  assert row.data.num_workers == 2


def recorded(prng_impl="rbg", num_workers=3):
  config = defaults.base_config()
  config.train.prng_impl = prng_impl
  config.data.num_workers = num_workers
  return config


def resolve(monkeypatch, config, saved):
  monkeypatch.setattr(auto_settings, "recorded_config", lambda workdir: saved)
  return auto_settings.resolved(config, "WORKDIR")


def settings(config):
  return config.train.prng_impl, config.data.num_workers


def test_a_fresh_run_resolves_auto_for_this_host(monkeypatch):
  """No checkpoint: "auto" is this CPU's (threefry, no workers); the caller's config keeps
  its "auto"; explicit values stay."""
  config = recorded("auto", "auto")
  assert settings(resolve(monkeypatch, config, None)) == ("threefry2x32", 0)
  assert settings(config) == ("auto", "auto")
  assert settings(resolve(monkeypatch, recorded("unsafe_rbg", 2), None)) == ("unsafe_rbg", 2)


def test_a_resume_with_auto_takes_the_recorded_settings(monkeypatch):
  saved = recorded("rbg", 3)
  assert settings(resolve(monkeypatch, recorded("auto", "auto"), saved)) == ("rbg", 3)
  assert settings(resolve(monkeypatch, recorded("rbg", "auto"), saved)) == ("rbg", 3)


@pytest.mark.parametrize("other", ["threefry2x32", "unsafe_rbg"])
def test_a_resume_with_another_prng_is_refused(monkeypatch, other):
  with pytest.raises(
    errors.BadValue, match=r"trained with train.prng_impl=rbg.*prng_impl=" + other
  ):
    resolve(monkeypatch, recorded(other, "auto"), recorded("rbg", 3))


def test_an_old_checkpoint_reads_back_as_threefry(monkeypatch):
  """A config saved before train.prng_impl existed, completed as read_config does: threefry,
  so resuming it with the default goes on, and with rbg is refused."""
  old = ml_collections.ConfigDict({"train": {"seed": 0}, "data": {"num_workers": 0}})
  old = defaults.complete(old)
  assert settings(resolve(monkeypatch, recorded("threefry2x32", "auto"), old)) == (
    "threefry2x32",
    0,
  )
  with pytest.raises(errors.BadValue, match="train.prng_impl=threefry2x32"):
    resolve(monkeypatch, recorded("rbg", "auto"), old)


def test_a_config_copied_with_resolved_references_still_resolves(monkeypatch):
  """finetune.merged_config copies with copy_and_resolve_references, which types the field
  by its "auto" string: the resolved count still goes in."""
  config = recorded("auto", "auto").copy_and_resolve_references()
  assert settings(resolve(monkeypatch, config, None)) == ("threefry2x32", 0)

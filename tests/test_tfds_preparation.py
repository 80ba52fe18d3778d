"""TFDS preparation in a multi-process job: process 0 prepares (downloads and writes) while
the others wait at a barrier, then every process reads; a failure of process 0 still releases
the others. Processes are simulated (jax.process_index patched); nothing touches the network.
"""

import jax
import pytest
import tensorflow_datasets as tfds

from transformer_mt.data import tfds_source
from transformer_mt.data.tfds_source import DataUnavailableError
from transformer_mt.runtime import distributed


@pytest.fixture
def two_processes(monkeypatch):
  """Process `index` of 2, with the barrier and tfds.data_source recording what happens when.
  `fail` (a list) makes process 0's preparation raise."""
  events = []

  def data_source(name, **kwargs):
    if kwargs["download"] and state["fail"]:
      events.append(("prepare failed", name))
      raise ConnectionError("statmt.org: connection refused")
    events.append(("data_source", name, kwargs["download"]))
    return [{"en": "a", "de": "b"}]

  state = {"index": 0, "fail": False}
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: state["index"])
  monkeypatch.setattr(distributed, "barrier", lambda name: events.append(("barrier", name)))
  monkeypatch.setattr(tfds, "data_source", data_source)
  return state, events


def test_only_process_0_prepares_then_all_read_after_the_barrier(two_processes):
  state, events = two_processes
  name, barrier = "wmt14_translate/de-en", ("barrier", "tfds_prepared:wmt14_translate/de-en:train")
  for index in (0, 1):
    state["index"] = index
    pairs = tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "train")
    assert list(pairs) == [("a", "b")]
  process_0, process_1 = events[:3], events[3:]
  # Process 0 prepares (download=True) before the barrier, then reads what it prepared.
  assert process_0 == [("data_source", name, True), barrier, ("data_source", name, False)]
  # Process 1 never asks for a download, and reads only after the barrier.
  assert process_1 == [barrier, ("data_source", name, False)]


def test_process_0_failing_to_prepare_still_releases_the_others(two_processes):
  state, events = two_processes
  state["fail"] = True
  with pytest.raises(DataUnavailableError, match="connection refused"):
    tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "test")
  assert [e[0] for e in events] == ["prepare failed", "barrier"]


def test_one_process_or_no_download_has_no_barrier(two_processes, monkeypatch):
  _, events = two_processes
  tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "test", download=False)
  monkeypatch.setattr(jax, "process_count", lambda: 1)
  tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "test")
  assert events == [
    ("data_source", "wmt14_translate/de-en", False),
    ("data_source", "wmt14_translate/de-en", True),
  ]

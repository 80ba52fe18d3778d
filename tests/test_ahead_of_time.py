"""Compiling ahead (runtime/ahead_of_time.py, training/run_programs.py): after a run's first
step, nothing compiles on the loop's path; every program it runs was listed and compiled
beside the steps.

Compilations are seen through JAX's own monitoring events (a lowering to MLIR is recorded for
every program that is not in the in-memory caches, persistent cache hit or not), by the
thread they happen on."""

from __future__ import annotations

import threading

import jax
import pytest
from helpers import tiny_overrides

from transformer_mt.config import registry
from transformer_mt.runtime import ahead_of_time
from transformer_mt.training import actions, train
from transformer_mt.workdir import metrics_log as metrics

LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"


class _AfterFirstStep(actions.Action):
  """Sets `flag` once the loop's first step and its actions are done."""

  def __init__(self, flag: threading.Event):
    self.flag = flag

  def after(self, step):
    self.flag.set()


@pytest.fixture
def loop_compilations(monkeypatch):
  """The programs lowered on the main thread after the run's first step (names of the jitted
  functions, from the events' arguments where JAX gives them)."""
  after_first = threading.Event()
  seen = []

  def listener(event, duration, **kwargs):
    if (
      event == LOWERING
      and after_first.is_set()
      and threading.current_thread() is threading.main_thread()
    ):
      seen.append(kwargs.get("fun_name", "?"))

  real = train.default_actions
  monkeypatch.setattr(
    train, "default_actions", lambda *a, **k: [*real(*a, **k), _AfterFirstStep(after_first)]
  )
  jax.clear_caches()  # programs another test compiled in this process would hide a miss
  jax.monitoring.register_event_duration_secs_listener(listener)
  yield seen
  jax.monitoring.unregister_event_duration_listener(listener)


def test_no_program_compiles_on_the_loop_path_after_the_first_step(tmp_path, loop_compilations):
  """A short run with two validations (loss and beam-search BLEU) and a final test decode:
  each program is listed before the first step and compiles once, ahead, off the main
  thread; the run's metrics record them."""
  config = registry.load_experiment(
    "demo",
    tiny_overrides(
      "data.num_validation=12",
      "train.num_steps=6",
      "train.eval_every=3",
      "train.bleu_every=3",
      "train.checkpoint_every=3",
      "decode.batch_size=8",
      "decode.beam_size=2",
    ),
  )
  result = train.train(config, str(tmp_path), progress=False)
  assert result["bleu"] is not None
  assert loop_compilations == []
  row = next(r for r in metrics.read_metrics(str(tmp_path)) if "compile/programs" in r)
  # Each program was listed before the first step: none waited for in the loop's path only.
  assert row["compile/late_programs"] == 0
  # The train step, an eval step and a beam search at least.
  assert row["compile/programs"] >= 3
  assert row["compile/seconds"] > 0
  assert row["compile/waited_after_first_step_s"] >= 0


def test_a_program_compiles_once_and_its_failure_reaches_the_caller():
  """`wait` returns once the program is compiled (a call then compiles nothing), a program
  never listed is False, and a failed compilation raises where it is waited for."""
  double = jax.jit(lambda x: 2 * x)
  broken = jax.jit(lambda x: x @ x)  # a vector @ itself traces; a 3-d one does not
  spec = jax.ShapeDtypeStruct((3,), jax.numpy.float32)
  bad = jax.ShapeDtypeStruct((2, 3, 4), jax.numpy.float32)
  with ahead_of_time.Programs(workers=2) as programs:
    programs.add("double", lambda: double.lower(spec), first=True)
    programs.add("double", lambda: pytest.fail("listed twice"))
    programs.add("broken", lambda: broken.lower(bad))
    programs.start()
    assert programs.wait("double")
    assert not programs.wait("never listed")
    with pytest.raises(TypeError):
      programs.wait("broken")
  assert list(programs.summary()["programs"]) == ["double"]

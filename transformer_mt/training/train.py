"""The training loop: data -> tokenizer -> sharded state -> steps -> checkpoints -> BLEU.

Running `train` into a workdir that already holds checkpoints resumes from the
latest one: parameters, optimizer state, step, dropout RNG and the data iterator
all continue exactly where they stopped, and so do the logged counters (pairs read and
dropped, saved with the iterator; non-finite steps skipped, the step minus the optimizer's
count). Rows of metrics.jsonl logged after that checkpoint are dropped first (see
metrics.py), so each step is logged once.

With `init.from=DIR` the run starts from an imported model's parameters, tokenizer and
model section instead (see `finetune`).

What a run needs is built by setup.setup_run; what happens around each step (metrics and the
NaN/Inf policy, validation, checkpoints, preemption, profiling) is an action (actions.py).
This module is the loop that runs them, and the final held-out evaluation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
from tqdm import tqdm

from transformer_mt.decoding.settings import decode_settings
from transformer_mt.decoding.translator import Translator
from transformer_mt.runtime import ahead_of_time
from transformer_mt.training import actions, optimizer, preemption, run_programs, validation
from transformer_mt.training.setup import RunSetup, setup_run
from transformer_mt.workdir import averaging, checkpointing
from transformer_mt.workdir import lock as workdir_lock
from transformer_mt.workdir import metrics_log as metrics


def train(
  config: ml_collections.ConfigDict,
  workdir: str,
  progress: bool = True,
  force_unlock: bool = False,
  prune_on: str | None = None,
  reporter=None,
) -> dict[str, Any]:
  """Trains (or resumes) the experiment `config` in `workdir`, then evaluates on held-out pairs.

  The run holds the workdir's writer lock (workdir/lock.py; process 0 holds it for a
  multi-process job): a second run into the same workdir stops with one line naming this one
  before writing anything.

  Args:
    config: a whole experiment (registry.load_experiment, overrides applied).
    workdir: where checkpoints, metrics.jsonl and TensorBoard events go; one that holds
      checkpoints of this run is resumed from the latest.
    progress: a tqdm bar over the steps (process 0).
    force_unlock: take over a lock from another host, which this host cannot check (a lock
      whose holder died on this host is taken over anyway).
    prune_on: a sweep trial's metric (e.g. "validation/bleu"): each value of it is handed to
      `reporter.report(step, value)` (training/sweep_study.py; process 0's, None on the
      others), and the run ends at the step whose report returns True (actions.Pruning).

  Returns:
    {"step": the last step, "state": the train state, "final_model": the directory holding
    the final model (the workdir, or WORKDIR/averaged_lastN_toSTEP with evaluate.average_last
    = N > 1, beside "averaged_steps"), "translator": a Translator of it, "bleu",
    "bleu_signature": held-out sacreBLEU and its signature, None when the data source has no
    test split or the run was preempted (SIGTERM/SIGINT: the final evaluation is skipped),
    "preempted", "stopped_early_at": the step train.patience ended the run at (None: it did
    not), "pruned_at": the step a sweep's pruner ended the run at (None: it did not; no
    held-out evaluation then), "nonfinite_steps_skipped": steps dropped under
    train.nonfinite="skip"}.

  Raises:
    errors.UserError: one line, e.g. a bad config, data or workdir (before anything is
      written), a busy workdir (WorkdirBusy), or a NaN/Inf step under train.nonfinite="stop"
      (NonFiniteError; the checkpoints hold no update of that step).
  """
  with workdir_lock.held_for_job(workdir, force_unlock):
    return _train(config, workdir, progress, prune_on, reporter)


def _train(
  config: ml_collections.ConfigDict, workdir: str, progress: bool, prune_on, reporter
) -> dict[str, Any]:
  """`train` inside the writer lock."""
  run = setup_run(config, workdir)
  with ahead_of_time.Programs() as programs:
    run_programs.list_programs(run, programs)
    with preemption.StopOnSignal(run.start) as stop_signal:
      loop_actions = default_actions(run, stop_signal, progress, programs)
      if prune_on:  # after the validations that compute its metric, before the checkpoint
        loop_actions.insert(-1, actions.Pruning(reporter, prune_on))
      state = run_loop(run, loop_actions, programs)
    # Outside the signal handlers, as the loop's teardown always was; on a normal end only: an
    # exception (a non-finite step under "stop") leaves without closing anything.
    for action in loop_actions:
      action.close()
    if run.best_manager:
      run.best_manager.wait_until_finished()
    preempted = _the(loop_actions, actions.Preemption).stopped
    pruned_at = _the(loop_actions, actions.Pruning).pruned_at if prune_on else None
    result = final_evaluation(
      run,
      state,
      preempted,
      _the(loop_actions, actions.LogMetrics).skipped,
      pruned_at is not None,
      programs,
    )
    _report_compilation(run, programs, result["step"])
  run.writer.close()
  result["stopped_early_at"] = _the(loop_actions, actions.EarlyStopping).stopped_at
  result["pruned_at"] = pruned_at
  return result


def _report_compilation(run: RunSetup, programs: ahead_of_time.Programs, step: int) -> None:
  """The run's one line on its programs, and the same figures in metrics.jsonl."""
  summary = programs.summary()
  if not summary["programs"]:
    return
  if jax.process_index() == 0:
    logging.info("%s", programs.describe())
  run.writer.write(
    step,
    {
      "compile/programs": len(summary["programs"]),
      "compile/seconds": summary["compile_s"],
      "compile/waited_after_first_step_s": summary["waited_after_first_step_s"],
      "compile/late_programs": len(summary["late"]),
    },
  )


def run_loop(
  run: RunSetup,
  loop_actions: Sequence[actions.Action],
  programs: ahead_of_time.Programs | None = None,
):
  """Runs steps run.start + 1 .. train.num_steps (or until an action stops the run) and
  returns the last train state. Each action sees every step, in list order. With `programs`
  (compiling ahead, run_programs.py) the first step waits for the train step's program there,
  and the waits for programs after it are counted."""
  state, num_steps = run.state, run.config.train.num_steps
  for number in range(run.start + 1, num_steps + 1):
    if programs is not None and number == run.start + 2:
      programs.loop_started()
    if any(action.ended_run for action in loop_actions):
      break  # stopped early before a resume: nothing left to run
    waited = time.perf_counter()
    batch = next(run.batches)  # already on the mesh (DevicePrefetch)
    waited = time.perf_counter() - waited
    if programs is not None and number == run.start + 1:
      programs.wait(run_programs.TRAIN_STEP)
    for action in loop_actions:
      action.before(number)
    state, step_metrics = run.step_fn(state, batch)
    step = actions.Step(
      number,
      state,
      step_metrics,
      log=number % run.config.train.log_every == 0,
      final=number == num_steps,
      input_wait_s=waited,
    )
    for action in loop_actions:
      action.after(step)
    if step.stop:
      break
  return state


def final_evaluation(
  run: RunSetup,
  state,
  preempted: bool,
  skipped: int,
  pruned: bool = False,
  programs: ahead_of_time.Programs | None = None,
) -> dict[str, Any]:
  """The run's result: its final model and, unless the run was preempted or pruned, has no
  test split or evaluate.test_after_training is off, that model's held-out BLEU (printed with
  a few examples).

  The final model is the one the experiment defines: with evaluate.average_last = N > 1 the
  mean of the last N regular checkpoints, written as WORKDIR/averaged_lastN_toSTEP
  (averaging.final_model, which `reproduce` shares) and named on the closing line, so the
  model whose BLEU is printed is the one `translate`, `evaluate` and `score` load from there.
  Otherwise it is the last parameters, which the workdir's latest checkpoint holds."""
  settings = dict(
    model_config=run.layout.model_config,
    tokenizer=run.tokenizer,
    mesh=run.mesh,
    forced_first_id=run.forced_first_id,
    ahead=programs,
    **decode_settings(run.config),
  )
  translator = Translator(params=state.params, **settings)
  result = {
    "step": int(state.step),
    "state": state,
    "translator": translator,
    "final_model": run.workdir,
    "bleu": None,
    "bleu_signature": None,
    "preempted": preempted,
    "nonfinite_steps_skipped": skipped,
  }
  last_n = run.config.evaluate.average_last
  if last_n > 1 and not preempted and not pruned:
    # Setup checked that train.keep_checkpoints keeps N.
    final_dir, steps = averaging.final_model(run.workdir, last_n)
    result.update(final_model=final_dir, averaged_steps=steps)
    if final_dir != run.workdir:
      params = checkpointing.restore_params(final_dir, steps[-1], run.layout.abstract_params)
      translator = result["translator"] = Translator(params=params, **settings)
      if jax.process_index() == 0:
        print(
          f"The final model: the mean of the last {len(steps)} checkpoints, steps {steps}, in "
          f"{final_dir} (pass it as --workdir to translate, evaluate or score it)."
        )
  if (
    run.pairs.get("test")
    and not preempted
    and not pruned
    and run.config.evaluate.test_after_training
  ):
    result.update(
      validation.evaluate_held_out(
        translator, run.pairs["test"], validation.HELD_OUT_EXAMPLES, run.config.evaluate.bleu
      )
    )
  return result


def _the(loop_actions: Sequence[actions.Action], kind: type):
  """The one action of type `kind` in `loop_actions`."""
  return next(action for action in loop_actions if isinstance(action, kind))


def default_actions(
  run: RunSetup,
  stop_signal: preemption.StopOnSignal,
  progress: bool,
  programs: ahead_of_time.Programs | None = None,
) -> list[actions.Action]:
  """The run's actions, in the order the loop calls them; the validations wait for their
  programs in `programs` (compiling ahead) instead of compiling them."""
  config = run.config
  bar = tqdm(
    total=config.train.num_steps,
    initial=run.start,
    desc="train",
    unit="step",
    disable=not progress or jax.process_index() != 0,
  )
  # A skipped step advances the step but not the optimizer's count (train_step.train_step).
  skipped = run.start - int(optimizer.updates_applied(run.state.opt_state))

  def scores(params):
    # Looked up on the module at each call, so a test's replacement takes effect.
    return validation.validation_scores(
      params,
      run.layout.model_config,
      run.tokenizer,
      run.mesh,
      config,
      run.pairs["validation"],
      run.forced_first_id,
      programs,
    )

  return [
    actions.Profile(config.train.profile_steps, run.workdir),
    actions.Preemption(stop_signal),
    actions.LogMetrics(
      run.writer,
      bar,
      run.manager,
      run.filter_counts,
      config.train.nonfinite,
      skipped,
      config.data.max_len,
    ),
    actions.ValidationLoss(run.validate, config.train.eval_every, run.writer),
    # Setup refused a patience without a validation split, so the validation loss is there.
    actions.EarlyStopping(
      config.train.patience, metrics.validation_history(run.workdir, run.start)
    ),
    actions.ValidationBleu(
      scores, run.bleu_every, run.writer, run.manager, run.best_manager, config, run.tokenizer
    ),
    actions.SaveCheckpoint(run.manager, run.batches, config, run.tokenizer, run.restored_step),
  ]

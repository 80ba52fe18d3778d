"""The concerns of the training loop, one action each: profiling, preemption, metrics (with
the NaN/Inf policy), validation loss, validation BLEU with the best checkpoint, and saving.

The loop (train.run_loop) dispatches a step and hands it to every action in turn; each action
decides by itself whether the step concerns it. The order of `train.default_actions` is part of the
contract: metrics are fetched, and a non-finite step stops the run, before any checkpoint of
that step is written, and the best-BLEU checkpoint is saved only once the latest manager has
no save in flight. This is t5x's `Trainer` actions and clu's `periodic_actions`, in our words.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import jax

from transformer_mt.runtime import distributed, errors
from transformer_mt.training import train_step
from transformer_mt.workdir import checkpointing

if TYPE_CHECKING:
  from transformer_mt.training.preemption import StopOnSignal

NONFINITE_POLICIES = ("stop", "skip")


@dataclasses.dataclass
class Step:
  """What the loop hands each action after dispatching a step."""

  number: int  # 1-based step just dispatched
  state: Any  # TrainState after the step (arrays may still be computing)
  metrics: dict  # this step's metrics, on device: nothing fetched yet
  log: bool  # number % train.log_every == 0
  final: bool  # number == train.num_steps
  stop: bool = False  # set by Preemption or EarlyStopping: checkpoint this step, then leave
  preempted: bool = False  # set by Preemption: a signal, not the recipe, ends the run here
  validation_loss: float | None = None  # set by ValidationLoss on the steps it evaluates
  # Every validation score of this step ("validation/loss", "validation/bleu", ...), set by
  # ValidationLoss and ValidationBleu on the steps they evaluate; read by Pruning.
  scores: dict = dataclasses.field(default_factory=dict)
  # Seconds the loop waited for this step's batch (next(batches)): the input pipeline's share
  # of the wall time, logged as input_wait_share (the device is busy with earlier steps then).
  input_wait_s: float = 0.0

  @property
  def last(self) -> bool:
    """The step the run ends on, whatever the reason."""
    return self.final or self.stop


class Action:
  """One concern of the loop. Each decides by itself whether it is due; all no-ops by default.

  `close` runs only when the loop ends normally (its last step, a preemption, or no step left
  to run); an exception leaves the loop as it came, closing nothing."""

  def before(self, number: int) -> None:
    """Before step `number` is dispatched."""

  def after(self, step: Step) -> None:
    """Once `step` is dispatched, in the order of the action list."""

  def close(self) -> None:
    """After the loop, in the order of the action list."""

  @property
  def ended_run(self) -> bool:
    """True once this action has ended the run for good, so that the loop runs no further
    step, even after a resume (EarlyStopping restored from the log)."""
    return False


def profile_range(steps) -> tuple[int, int]:
  """(first, last) of `train.profile_steps`, or (0, -1) for [] (nothing traced).

  Raises:
    BadValue: not [] or [first, last] with 1 <= first <= last.
  """
  steps = list(steps or [])
  if steps and (
    len(steps) != 2 or not all(isinstance(s, int) and s >= 1 for s in steps) or steps[0] > steps[1]
  ):
    raise errors.BadValue(
      f"train.profile_steps={steps!r} must be [] or [first, last] with 1 <= first <= last, "
      "e.g. train.profile_steps=[10,12]."
    )
  return tuple(steps) if steps else (0, -1)


def nonfinite_policy(policy: str) -> str:
  """`train.nonfinite`, checked: "stop" or "skip"."""
  if policy not in NONFINITE_POLICIES:
    raise errors.BadValue(f"train.nonfinite={policy!r} must be 'stop' or 'skip'.")
  return policy


class Profile(Action):
  """`train.profile_steps=[a, b]`: a JAX profiler trace of steps a..b (inclusive) in
  WORKDIR/tensorboard/plugins/profile/<run>/, where TensorBoard's profile tab finds it. The
  trace starts just before step a is dispatched and stops once step b's results are ready, so
  it holds whole steps: their XLA ops and the host work between them (input pipeline, logging).
  An empty list (the default) traces nothing; a resumed run traces what is left of the range."""

  def __init__(self, steps, workdir: str):
    self.first, self.last = profile_range(steps)
    self.directory = os.path.join(workdir, "tensorboard")
    self.active = False

  def before(self, number: int) -> None:
    if not self.active and self.first <= number <= self.last:
      jax.profiler.start_trace(self.directory)
      self.active = True

  def after(self, step: Step) -> None:
    if self.active and step.number >= self.last:
      jax.block_until_ready(step.metrics)
      self.close()

  def close(self) -> None:
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
      logging.info(
        "Wrote a profiler trace of steps %d-%d to %s.", self.first, self.last, self.directory
      )


class Preemption(Action):
  """Asks `stop_signal` (preemption.StopOnSignal) after every step whether to stop there: the
  step is then checkpointed (its `last` is true) and the loop left."""

  def __init__(self, stop_signal: StopOnSignal):
    self.stop_signal = stop_signal
    self.stopped_at: int | None = None

  @property
  def stopped(self) -> bool:
    return self.stopped_at is not None

  def after(self, step: Step) -> None:
    step.stop = self.stop_signal.stop_after(step.number, step.log)
    if step.stop:
      step.preempted = True
      self.stopped_at = step.number

  def close(self) -> None:
    if self.stopped:
      logging.warning(
        "Stopped by %s after step %d; its checkpoint is saved. Run the same "
        "command again to resume.",
        self.stop_signal.describe(),
        self.stopped_at,
      )


class LogMetrics(Action):
  """Writes every step's metrics to metrics.jsonl, fetched (one host sync) at log steps, at the
  last step and before every checkpoint, so a non-finite step is seen before any checkpoint
  after it is written; under `nonfinite="stop"` the run then stops naming it, under "skip" it
  is counted (`skipped`, carried over from before a resume) and warned about."""

  def __init__(self, writer, bar, manager, filter_counts, policy: str, skipped: int, max_len: int):
    self.writer, self.bar, self.manager = writer, bar, manager
    self.filter_counts, self.policy = filter_counts, nonfinite_policy(policy)
    self.skipped = skipped  # non-finite steps so far, this run's and those before a resume
    self.max_len = max_len  # data.max_len, named in the data-filter summary
    self.pending, self.interval_start = [], time.perf_counter()
    self.input_wait_s = 0.0  # of the pending steps

  def after(self, step: Step) -> None:
    self.pending.append((step.number, step.metrics))
    self.input_wait_s += step.input_wait_s
    if step.log or step.last or self.manager.should_save(step.number):
      self._fetch(step.number)

  def _fetch(self, number: int) -> None:
    pending, counts = self.pending, self.filter_counts
    fetched = jax.device_get([m for _, m in pending])
    elapsed = time.perf_counter() - self.interval_start
    tokens_per_second = sum(float(m["num_tokens"]) for m in fetched) / max(elapsed, 1e-9)
    # The share of the interval's wall time spent waiting for batches: near 0 when the input
    # keeps up, near 1 when it binds (timing, like tokens_per_second).
    input_wait_share = min(self.input_wait_s / max(elapsed, 1e-9), 1.0)
    for (logged_step, _), values in zip(pending, fetched):
      self.writer.write(
        logged_step,
        dict(values, tokens_per_second=tokens_per_second, input_wait_share=input_wait_share),
      )
    bad_steps = [s for (s, _), m in zip(pending, fetched) if m["nonfinite"]]
    self.skipped += len(bad_steps)
    self.writer.write(
      number,
      {
        "data/pairs_seen": counts.seen,
        "data/dropped_empty": counts.empty,
        "data/dropped_too_long": counts.too_long,
        "nonfinite_steps_skipped": self.skipped,
      },
    )
    self.writer.flush()
    if bad_steps and self.policy == "stop":
      checkpointing.wait(self.manager)
      self.bar.close()  # so the error prints on a line of its own
      raise train_step.NonFiniteError(
        f"Non-finite loss or gradient at step {bad_steps[0]}; its update was not applied "
        f"and the last checkpoint (step {self.manager.latest_step()}) is intact. Lower the "
        "learning rate or clip gradients (train.grad_clip_norm), or set "
        "train.nonfinite='skip' to skip such steps, then rerun to resume."
      )
    for bad in bad_steps:
      logging.warning("Skipped the update of step %d: non-finite loss or gradient.", bad)
    last = fetched[-1]
    self.bar.set_postfix(
      loss=f"{last['loss']:.3f}",
      acc=f"{last['accuracy']:.3f}",
      tok_s=f"{tokens_per_second:,.0f}",
    )
    self.bar.update(len(pending))
    self.pending, self.interval_start = [], time.perf_counter()
    self.input_wait_s = 0.0

  def close(self) -> None:
    self.bar.update(len(self.pending))
    self.bar.close()
    counts = self.filter_counts
    if counts.empty or counts.too_long:
      logging.info(
        "Training pairs read by this process: %d; dropped %d empty and %d longer than "
        "data.max_len=%d tokens.",
        counts.seen,
        counts.empty,
        counts.too_long,
        self.max_len,
      )


class ValidationLoss(Action):
  """Validation loss and accuracy every `eval_every` steps and at the final step."""

  def __init__(self, validate, eval_every: int, writer):
    self.validate, self.eval_every, self.writer = validate, eval_every, writer

  def after(self, step: Step) -> None:
    if self.validate and self.eval_every and (step.number % self.eval_every == 0 or step.final):
      scores = self.validate(step.state.params)
      step.validation_loss = scores["validation/loss"]
      step.scores.update(scores)
      self.writer.write(step.number, scores)
      self.writer.flush()


def patience_of(train_config) -> int:
  """`train.patience`, checked: 0 (never stop early) or a number of evaluations."""
  patience = train_config.patience
  if not isinstance(patience, int) or patience < 0:
    raise errors.BadValue(
      f"train.patience={patience!r} must be 0 (never stop early) or the number of validation-"
      "loss evaluations without a new best after which to stop, e.g. train.patience=10."
    )
  if patience and not train_config.eval_every:
    raise errors.BadValue(
      f"train.patience={patience} counts validation-loss evaluations, but train.eval_every=0 "
      "makes none: set train.eval_every (e.g. to the steps of an epoch) or train.patience=0."
    )
  return patience


class EarlyStopping(Action):
  """`train.patience=N`: ends the run at the first validation-loss evaluation that is the Nth
  in a row without a lower validation loss than the best so far, as fairseq's `--patience`
  (which counts epochs; here evaluations, every `train.eval_every` steps). That step is
  checkpointed (its `last` is true) and the run then ends as a finished one: held-out BLEU,
  and for `reproduce` the averaging of the last checkpoints, follow.

  `history` is the validation losses the run logged up to the step it resumes from
  (metrics.jsonl, `validation_history`), so a resumed run counts on from where it stopped,
  and a run that has already stopped early runs no further step when started again."""

  def __init__(self, patience: int, history: list[tuple[int, float]]):
    self.patience = patience
    self.best, self.since_best, self.stopped_at = float("inf"), 0, None
    for number, loss in history:
      self._count(number, loss)

  def _count(self, number: int, loss: float) -> None:
    if loss < self.best:
      self.best, self.since_best = loss, 0
    else:
      self.since_best += 1
    if self.patience and self.since_best >= self.patience and self.stopped_at is None:
      self.stopped_at = number

  @property
  def ended_run(self) -> bool:
    return self.stopped_at is not None

  def after(self, step: Step) -> None:
    if step.validation_loss is None or self.ended_run:
      return
    self._count(step.number, step.validation_loss)
    if self.ended_run:
      step.stop = True
      logging.info(
        "Stopping early at step %d: %d validation-loss evaluations in a row without a better "
        "loss than %.4f (train.patience=%d).",
        step.number,
        self.patience,
        self.best,
        self.patience,
      )


class Pruning(Action):
  """A sweep trial's early stop: at each step with the trial's metric (`metric_key`, e.g.
  "validation/bleu", which ValidationBleu or ValidationLoss just computed), the value is
  reported to the trial (`reporter.report(step, value)`, training/sweep_study.py) and the run
  ends there when its pruner says so. That step is checkpointed (its `last` is true), as
  EarlyStopping's is, and the run ends without the held-out evaluation: the trial is over.

  Process 0 alone talks to the study (`reporter` is None on the others); its decision reaches
  every process (distributed.any_process, at each such step on all of them), so every host of
  a multi-process trial stops at the same step."""

  def __init__(self, reporter, metric_key: str):
    self.reporter, self.metric_key = reporter, metric_key
    self.pruned_at: int | None = None

  def after(self, step: Step) -> None:
    if self.metric_key not in step.scores:
      return
    prune = self.reporter is not None and self.reporter.report(
      step.number, float(step.scores[self.metric_key])
    )
    if distributed.any_process(prune):
      step.stop = True
      self.pruned_at = step.number
      logging.info("The sweep's pruner stopped this trial at step %d.", step.number)


class ValidationBleu(Action):
  """Validation BLEU and chrF (`scores(params)`) every `bleu_every` steps and at the final step;
  the parameters with the best BLEU so far are saved by `best_manager` (WORKDIR/best).

  On a step that stops the run (a preemption notice, or early stopping) the step's checkpoint
  comes first: the evaluation waits for `close`, after SaveCheckpoint has saved the step and
  the save is on disk, so decoding the validation set never delays the save a preemption's
  grace period is for."""

  def __init__(self, scores, bleu_every: int, writer, manager, best_manager, config, tokenizer):
    self.scores, self.bleu_every, self.writer = scores, bleu_every, writer
    self.manager, self.best_manager = manager, best_manager
    self.config, self.tokenizer = config, tokenizer
    self.deferred: Step | None = None  # a stopping step's evaluation, run by close

  def after(self, step: Step) -> None:
    if not (self.bleu_every and (step.number % self.bleu_every == 0 or step.final)):
      return
    if step.stop:
      self.deferred = step
      return
    self._evaluate(step)

  def close(self) -> None:
    if self.deferred is not None:
      self.manager.wait_until_finished()  # the stopping step's checkpoint is on disk
      step, self.deferred = self.deferred, None
      self._evaluate(step)

  def _evaluate(self, step: Step) -> None:
    scores = self.scores(step.state.params)
    step.scores.update(scores)
    bleu = scores["validation/bleu"]
    self.writer.write(step.number, scores)
    self.writer.flush()
    # One save in flight at a time: Orbax coordinates the processes of a multi-process
    # run per save, and two managers saving at once can interleave those steps.
    self.manager.wait_until_finished()
    checkpointing.save_best(
      self.best_manager, step.number, step.state.params, self.config, self.tokenizer, bleu
    )
    self.best_manager.wait_until_finished()


class SaveCheckpoint(Action):
  """A checkpoint every `train.checkpoint_every` steps (the manager decides) and always at the
  last step; its close waits until the saves are on disk.

  A save forced off that grid (the stop a signal forces, the last step of a run whose
  num_steps is off the grid, an early stop between grid steps) is marked a resume point only:
  it never counts toward `train.keep_checkpoints`, is never averaged, and goes once a newer
  checkpoint is on disk (workdir/retention.py). So the checkpoints kept and averaged are those
  of a run never stopped, as fairseq's average of the last N epoch checkpoints never sees its
  mid-epoch `checkpoint_last`."""

  def __init__(self, manager, batches, config, tokenizer, restored_step: int | None):
    self.manager, self.batches = manager, batches
    self.config, self.tokenizer = config, tokenizer
    self.restored_step = restored_step  # the checkpoint the run resumed from, if any

  def after(self, step: Step) -> None:
    regular = self.manager.should_save(step.number)
    checkpointing.save(
      self.manager,
      step.number,
      step.state,
      self.batches,
      self.config,
      self.tokenizer,
      force=step.last,
      resume_point_only=step.last and not regular,
    )

  def close(self) -> None:
    num_steps = self.config.train.num_steps
    if self.restored_step is not None and self.restored_step >= num_steps:
      logging.info(
        "Checkpoint step %d already reached train.num_steps=%d.", self.restored_step, num_steps
      )
    checkpointing.wait(self.manager)

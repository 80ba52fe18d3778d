"""The programs a training run will execute, listed up front so that they compile ahead
(runtime/ahead_of_time.py) instead of stopping the loop at their first call.

A run executes: the train step (one shape: packed batches are all [accum, rows, max_len]);
the eval step of each validation batch shape (actions.ValidationLoss); the beam search of each
padded shape of the validation sentences BLEU decodes (actions.ValidationBleu); and the
beam search of the held-out test sentences after training, which mostly shares those
programs (Translator.program_shapes pads batches of one decode length to one program). The
train step compiles first; the others beside the first steps.
"""

from __future__ import annotations

import jax

from transformer_mt.decoding.settings import decode_settings
from transformer_mt.decoding.translator import Translator
from transformer_mt.runtime.ahead_of_time import Programs
from transformer_mt.training import validation
from transformer_mt.training.setup import RunSetup

TRAIN_STEP = "train_step"


def list_programs(run: RunSetup, programs: Programs) -> None:
  """Adds every program `train.train` will run after `run`'s setup to `programs` and starts
  their compilation, the train step first.

  The train step's batch shapes are the first batch's (`DevicePrefetch.peek`, which the loop
  then takes: no batch is read twice). Programs the run will not reach are left out: no
  validation BLEU without `bleu_every`, no test decode without a test split or with
  evaluate.test_after_training off, nothing at all when the run has no step left."""
  config = run.config
  if run.start >= config.train.num_steps:
    return
  if hasattr(run.step_fn, "lower") and hasattr(run.batches, "peek"):
    batch = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), run.batches.peek()
    )
    programs.add(
      TRAIN_STEP, lambda: run.step_fn.lower(run.layout.abstract_state, batch), first=True
    )
  if (
    run.validate is not None and config.train.eval_every and hasattr(run.validate, "list_programs")
  ):
    run.validate.list_programs(programs, run.layout.abstract_params)
  decoded = []  # the sentences of each translate call: validation BLEU, then the test split
  if run.bleu_every:
    decoded.append([source for source, _ in validation.bleu_pairs(config, run.pairs["validation"])])
  if run.pairs.get("test") and config.evaluate.test_after_training:
    decoded.append([source for source, _ in run.pairs["test"]])
  translator = Translator(
    params=run.layout.abstract_params,
    model_config=run.layout.model_config,
    tokenizer=run.tokenizer,
    mesh=run.mesh,
    forced_first_id=run.forced_first_id,
    **decode_settings(config),
  )
  for lines in decoded:
    translator.list_programs(lines, programs)
  programs.start()

"""The train step with the loss from the full float32 logits and without them
(`train.loss_chunk_tokens`, training/chunked_loss.py), and with a padded vocabulary
(`model.vocab_pad_multiple`): XLA's memory analysis of each compiled step and its time, as a
table with ratios to the first setting.

`compare` is the function benchmarks/accelerator.py calls on a GPU (Base and Big at the
paper's batch); on a CPU, at a small size, from the command line:

    python benchmarks/_loss_memory.py        # d_model 256, Base's vocabulary, 2,048 tokens
    python benchmarks/_loss_memory.py --chunks 0 128 512 --pads 1 128 --reps 5

Each setting is one train step as train.py runs it (Adam, label smoothing 0.1, dropout 0.1,
the state donated) on full rows (one sentence pair filling each packed row), compiled ahead
of time; the program timed is the one whose memory is reported:
  temp        XLA's temporaries (`memory_analysis().temp_size_in_bytes`): activations kept for
              the backward pass, gradients, workspace; what the chunked loss shrinks
  peak        arguments + outputs - aliased + temporaries (benchmarks/memory.py peak_bytes)
  logits      what one float32 [tokens, vocab] array takes, for scale: the default path keeps
              it, and its cotangent, and take_along_axis's scatter, each of that size
  step        best wall time of `reps` steps (median beside it), and the least CPU time of one
              (all threads): on a shared machine other processes stretch wall time, hardly
              the CPU time of the work itself, so the CPU-time ratio is the steadier one
  loss        the loss of the step after the timed ones: every setting runs as many steps
              from the same state on the same batch, so equal losses mean equal training
Nothing is asserted about speed or memory: figures depend on the backend.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import ml_collections  # noqa: E402
from flax import linen as nn  # noqa: E402

from benchmarks import _timing  # noqa: E402
from benchmarks.memory import compile_train_step, peak_bytes  # noqa: E402
from benchmarks.train_step import full_rows_batch  # noqa: E402
from transformer_mt.config import defaults as _defaults  # noqa: E402
from transformer_mt.model.transformer_config import TransformerConfig  # noqa: E402
from transformer_mt.runtime import sharding  # noqa: E402
from transformer_mt.training import train_step  # noqa: E402
from transformer_mt.training.setup import training_setup  # noqa: E402

MIB = 2.0**20
# The CPU size of the command line: a small model with Base's vocabulary (37,000 ids, not a
# multiple of 128), whose logits are then, as in Base, the step's largest buffers.
CPU_MODEL = TransformerConfig(
  vocab_size=37_000,
  d_model=256,
  d_ff=1024,
  num_heads=4,
  num_encoder_layers=2,
  num_decoder_layers=2,
  dtype="auto",
)
CPU_ROWS, CPU_MAX_LEN = 16, 128


def measure(
  model_config: TransformerConfig, rows: int, max_len: int, chunk_tokens: int, reps: int
) -> dict[str, float]:
  """One setting's compiled step on the first device: its memory and its time."""
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1}), devices=jax.devices()[:1]
  )
  setup = training_setup(_defaults.base_config(), None, mesh, model_config=model_config)
  holder = {"state": train_step.create_sharded_state(0, setup.model, setup.tx, mesh)}
  batch = full_rows_batch(rows, max_len, model_config.vocab_size, seed=0)
  device_batch = sharding.global_batch_from_local(batch, mesh, batch_dim=1)
  step = compile_train_step(setup, mesh, device_batch, 0.1, loss_chunk_tokens=chunk_tokens)
  stats = step.memory_analysis()

  def call():
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.LOGICAL_AXIS_RULES):
      holder["state"], metrics = step(holder["state"], device_batch)
    return metrics

  timing = _timing.time_calls(call, warmup=1, reps=reps)
  return {
    "temp": stats.temp_size_in_bytes,
    "peak": peak_bytes(stats),
    "best": timing.best,
    "median": timing.median,
    "cpu": timing.cpu,
    "loss": float(call()["loss"]),
  }


def compare(
  model_config: TransformerConfig,
  rows: int,
  max_len: int,
  chunk_tokens: Sequence[int] = (0, 2048),
  vocab_pad_multiples: Sequence[int] = (1,),
  reps: int = 3,
  name: str = "",
  out: Callable[[str], None] = print,
) -> list[dict]:
  """Every (vocab_pad_multiple, loss_chunk_tokens) setting of `model_config` on rows x max_len
  target tokens, printed as a table (ratios to the first setting); returns its rows."""
  tokens = rows * max_len
  logits = tokens * model_config.output_vocab_size * 4
  out(
    f"{name + ' ' if name else ''}loss memory: d_model {model_config.d_model}, "
    f"{model_config.num_encoder_layers}+{model_config.num_decoder_layers} layers, vocab "
    f"{model_config.output_vocab_size:,}, {model_config.dtype}, {rows} x {max_len} = "
    f"{tokens:,} target tokens; one float32 [tokens, vocab] array: {logits / MIB:,.1f} MiB; "
    f"{jax.devices()[0].device_kind}"
  )
  out(
    f"{'vocab rows':>11}{'loss chunk':>12}{'temp MiB':>10}{'ratio':>7}{'peak MiB':>10}"
    f"{'ratio':>7}{'step ms':>9}{'median':>8}{'ratio':>7}{'cpu s':>7}{'ratio':>7}"
    f"{'tokens/s':>10}{'loss':>9}"
  )
  results = []
  for multiple in vocab_pad_multiples:
    config = model_config.replace(vocab_pad_multiple=multiple)
    for chunk in chunk_tokens:
      m = measure(config, rows, max_len, chunk, reps)
      m.update(vocab_rows=config.padded_output_vocab_size, chunk_tokens=chunk)
      results.append(m)
      first = results[0]
      out(
        f"{m['vocab_rows']:>11,}{chunk or 'full':>12}{m['temp'] / MIB:>10,.0f}"
        f"{m['temp'] / first['temp']:>7.2f}{m['peak'] / MIB:>10,.0f}"
        f"{m['peak'] / first['peak']:>7.2f}{m['best'] * 1e3:>9.1f}{m['median'] * 1e3:>8.1f}"
        f"{m['best'] / first['best']:>7.2f}{m['cpu']:>7.2f}{m['cpu'] / first['cpu']:>7.2f}"
        f"{tokens / m['best']:>10,.0f}{m['loss']:>9.4f}"
      )
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--chunks", type=int, nargs="+", default=[0, 128, 512, 2048])
  parser.add_argument("--pads", type=int, nargs="+", default=[1, 128])
  parser.add_argument("--rows", type=int, default=CPU_ROWS)
  parser.add_argument("--max_len", type=int, default=CPU_MAX_LEN)
  parser.add_argument("--vocab_size", type=int, default=CPU_MODEL.vocab_size)
  parser.add_argument("--reps", type=int, default=3)
  args = parser.parse_args()
  print(f"jax {jax.__version__}, backend {jax.default_backend()}")
  compare(
    CPU_MODEL.replace(vocab_size=args.vocab_size),
    args.rows,
    args.max_len,
    args.chunks,
    args.pads,
    args.reps,
  )


if __name__ == "__main__":
  main()

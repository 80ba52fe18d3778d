"""Pictures of a model and of its training run: cross-attention heatmaps and training curves.

Cross-attention comes from a teacher-forced forward pass with
`mutable=["intermediates"]`: every `MultiHeadAttention` sows its probabilities there,
so plotting needs no second code path through the model (and cannot drift from the
one that translates). The decode cache is not used for it; it keeps no weights.

Figures are drawn on a bare `matplotlib.figure.Figure` rendered by Agg, not through
pyplot: nothing global changes (the caller's backend, pyplot's list of open figures),
no display is needed, and no figure outlives the call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer_mt.data import text_files
from transformer_mt.decoding import incremental as decode
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors, sharding
from transformer_mt.workdir import metrics_log as metrics

# (record key, legend label) of each series `training_curves` knows, grouped by panel.
_LOSS_SERIES = (("loss", "training loss"), ("validation/loss", "validation loss"))
_LEARNING_RATE_SERIES = (("learning_rate", "learning rate"),)
_BLEU_SERIES = (("validation/bleu", "validation BLEU"),)


@functools.partial(jax.jit, static_argnames=("config",))
def _cross_attention_weights(
  params: Any, inputs: jax.Array, targets_in: jax.Array, config: TransformerConfig
) -> jax.Array:
  """float32 [layers, batch, heads, tgt_len, src_len]; jitted so a large model is not run
  op by op."""
  model = Transformer(config.replace(deterministic=True, decode=False))
  _, variables = model.apply({"params": params}, inputs, targets_in, mutable=["intermediates"])
  intermediates = variables["intermediates"]
  # `sow` appends to a tuple; one forward pass leaves exactly one entry per module.
  return jnp.stack(
    [
      intermediates[f"decoder_layers_{i}"]["cross_attention"]["attention_weights"][0]
      for i in range(config.num_decoder_layers)
    ]
  ).astype(jnp.float32)


def cross_attention(
  params: Any, model_config: TransformerConfig, inputs: Any, targets_in: Any
) -> np.ndarray:
  """Cross-attention probabilities of every decoder layer for one sentence pair.

  Args:
    params: model parameters (boxed or not).
    model_config: the model's config; dropout is switched off here whatever it says.
    inputs: int [1, src_len], the source ids (EOS included, PAD allowed at the end).
    targets_in: int [1, tgt_len], the target shifted right (BOS first).

  Returns:
    float32 [layers, heads, tgt_len, src_len]: row t is where the decoder looks while
    predicting target token t; each row of a real target position sums to 1 over the
    source and is 0 at source padding.
  """
  inputs, targets_in = np.asarray(inputs), np.asarray(targets_in)
  for name, array in (("inputs", inputs), ("targets_in", targets_in)):
    if array.ndim != 2 or array.shape[0] != 1 or array.shape[1] == 0:
      raise ValueError(f"{name} must have shape [1, length>0] (one sentence), got {array.shape}")
  weights = _cross_attention_weights(
    params, jnp.asarray(inputs, jnp.int32), jnp.asarray(targets_in, jnp.int32), model_config
  )
  return np.asarray(jax.device_get(weights))[:, 0]


def _check_index(name: str, value: Any, count: int, allowed: str) -> None:
  """Raises unless `value` is None, "mean" or an int in [-count, count) (negative from the end)."""
  if value is None or value == "mean":
    return
  is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  if is_int and -count <= value < count:
    return
  raise errors.BadValue(
    f"{name}={value!r} is out of range: the model has {count} {allowed}, so "
    f"{name} must be an int in [0, {count - 1}] (or [-{count}, -1] counting from "
    f"the end), 'mean', or None"
  )


def _select(
  weights: np.ndarray, layer: int | str | None, head: int | str | None
) -> tuple[np.ndarray, str]:
  """[layers, heads, q, k] -> [q, k] and the words for the title."""
  num_layers, num_heads = weights.shape[:2]
  if layer == "mean":
    weights, layer_words = weights.mean(axis=0), f"mean of {num_layers} decoder layers"
  else:
    index = num_layers - 1 if layer is None else int(layer) % num_layers
    weights, layer_words = weights[index], f"decoder layer {index} (of 0-{num_layers - 1})"
  if head is None or head == "mean":
    return weights.mean(axis=0), f"{layer_words}, mean of {num_heads} heads"
  index = int(head) % num_heads
  return weights[index], f"{layer_words}, head {index} (of 0-{num_heads - 1})"


def _new_figure(width: float, height: float):
  from matplotlib.figure import Figure  # imported here: training never pays for matplotlib

  return Figure(figsize=(width, height), layout="constrained")


def _save(figure, path: str | os.PathLike) -> str:
  path = os.fspath(path)
  directory = os.path.dirname(path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  try:
    figure.savefig(path, dpi=120)
  except OSError as e:
    raise text_files.DataError(text_files.cannot_write(path, e)) from e
  return path


def attention_heatmap(
  translator,
  source_text: str,
  path: str | os.PathLike,
  layer: int | str | None = None,
  head: int | str | None = None,
  max_len: int | None = None,
) -> str:
  """Translates `source_text` greedily and writes its cross-attention as a PNG heatmap.

  The translation is decoded with the KV cache exactly as `Translator.translate` does;
  the attention then comes from a teacher-forced pass over (source, BOS + translation
  without its last token), so row t shows the attention while the decoder produced
  the t-th generated piece (EOS included), and each column is a source piece.

  Args:
    translator: a `translate.Translator` (its params, model_config, tokenizer and mesh).
    source_text: one source sentence.
    path: where the PNG goes; missing parent directories are created.
    layer: decoder layer index (default: the last one, which most often looks like an
      alignment), or "mean" to average every layer.
    head: head index, or None / "mean" for the mean over heads.
    max_len: target tokens generated at most; default as in `Translator.translate`
      (source length + extra_len, capped at max_target_len).

  Returns:
    The translation text.
  """
  config, tokenizer = translator.model_config, translator.tokenizer
  # Checked before decoding: a typo should not cost a translation first.
  _check_index("layer", layer, config.num_decoder_layers, "decoder layers")
  _check_index("head", head, config.num_heads, "attention heads")
  if not source_text.strip():
    raise errors.BadValue("source_text is empty: there is nothing to translate or plot.")
  source_ids = tokenizer.encode([source_text.strip()])[0]
  if len(source_ids) > translator.max_source_len:  # as translate() does, without dropping it
    source_ids = source_ids[: translator.max_source_len - 1] + [config.eos_id]
  if max_len is None:
    max_len = min(translator.max_target_len, len(source_ids) + translator.extra_len)
  if max_len < 1:
    raise errors.BadValue(f"max_len={max_len} must be at least 1")

  inputs = np.asarray([source_ids], np.int32)
  with jax.set_mesh(translator.mesh):
    # One sentence cannot be split over the data axis: every device gets all of it.
    device_inputs = jax.device_put(inputs, sharding.replicated(translator.mesh))
    outputs = decode.greedy_decode(translator.params, device_inputs, config, int(max_len))
    generated = [int(t) for t in np.asarray(jax.device_get(outputs))[0]]
    if config.eos_id in generated:
      generated = generated[: generated.index(config.eos_id) + 1]
    else:  # stopped by max_len: the PAD tail is not output
      generated = [t for t in generated if t != config.pad_id]
    targets_in = np.asarray([[config.decoder_start_id] + generated[:-1]], np.int32)
    weights = cross_attention(translator.params, config, inputs, targets_in)

  matrix, description = _select(weights, layer, head)
  source_pieces, target_pieces = tokenizer.pieces(source_ids), tokenizer.pieces(generated)
  # About a quarter inch per cell, so the rotated piece labels do not overlap.
  figure = _new_figure(
    width=min(40.0, max(4.5, 0.28 * len(source_pieces) + 2.5)),
    height=min(40.0, max(3.5, 0.28 * len(target_pieces) + 2.0)),
  )
  axes = figure.add_subplot()
  # vmin=0 but no fixed vmax: spread-out attention over a long source would be invisible
  # on a 0-1 scale.
  image = axes.imshow(matrix, cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
  axes.set_xticks(range(len(source_pieces)), labels=source_pieces, rotation=90, fontsize=8)
  axes.set_yticks(range(len(target_pieces)), labels=target_pieces, fontsize=8)
  axes.set_xlabel("source pieces")
  axes.set_ylabel("generated target pieces")
  axes.set_title(f"Cross-attention\n{description}", fontsize=9)
  figure.colorbar(image, ax=axes, label="attention weight")
  _save(figure, path)
  return tokenizer.decode(generated)


def _series(records: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of `key`, sorted by step.

  metrics.jsonl is appended to: a run resumed from an older checkpoint logs some
  steps twice, and the later record is the one the final model descends from.
  """
  by_step = {int(r["step"]): float(r[key]) for r in records if key in r and "step" in r}
  steps = sorted(by_step)
  return steps, [by_step[s] for s in steps]


def _linear_map(xs, ys):
  """x -> y along the points, extended at the average rate past both ends: np.interp alone
  clamps, so axis ticks past the last step all land on its minute, over each other."""
  xs, ys = np.asarray(xs, float), np.asarray(ys, float)
  rate = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if xs[-1] != xs[0] else 0.0

  def apply(x):
    x = np.asarray(x, float)
    inside = np.interp(x, xs, ys)
    return np.where(
      x < xs[0],
      ys[0] + (x - xs[0]) * rate,
      np.where(x > xs[-1], ys[-1] + (x - xs[-1]) * rate, inside),
    )

  return apply


def training_minutes(records: Sequence[dict]) -> tuple[list[int], list[float]]:
  """(steps, minutes of the training loop up to the end of each step), from the per-step
  `num_tokens` / `tokens_per_second` records.

  Every step of a logging interval carries that interval's tokens/s (its tokens over its wall
  time, which includes any validation and checkpoint work done in it), so the tokens over the
  tokens/s of each step add up to the loop's wall time. Not counted: start-up before the first
  step (data, tokenizer, compilation shows up in the first interval) and the final test. A
  resumed run counts the surviving record of each step, i.e. the time of the steps that made
  the final model.
  """
  num_tokens, rates = _series(records, "num_tokens"), _series(records, "tokens_per_second")
  if not num_tokens[0] or num_tokens[0] != rates[0]:
    return [], []
  seconds = np.cumsum([n / max(r, 1e-9) for n, r in zip(num_tokens[1], rates[1])])
  return num_tokens[0], list(seconds / 60.0)


def training_curves(workdir: str | os.PathLike, path: str | os.PathLike) -> list[str]:
  """Plots `workdir/metrics.jsonl` against the step into one PNG.

  Panels: loss (training, plus validation when logged), learning rate, and BLEU
  (only when "validation/bleu" records exist). A panel without data is left out. The top
  axis shows the training loop's wall minutes at each step (`training_minutes`).

  Returns:
    The metrics.jsonl keys that were plotted, e.g. ["loss", "validation/loss",
    "learning_rate"].
  """
  workdir = os.fspath(workdir)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(metrics_path):
    raise errors.MissingFile(
      f"No metrics.jsonl in {workdir!r}: is it a training workdir, and "
      "has the run logged a step yet?"
    )
  records = metrics.read_metrics(workdir)
  panels = []  # (y label, [(key, legend label, steps, values)])
  for ylabel, candidates in (
    ("loss", _LOSS_SERIES),
    ("learning rate", _LEARNING_RATE_SERIES),
    ("BLEU", _BLEU_SERIES),
  ):
    lines = [(key, label) + _series(records, key) for key, label in candidates]
    lines = [line for line in lines if line[2]]
    if lines:
      panels.append((ylabel, lines))
  if not panels:
    known = [
      key for series in (_LOSS_SERIES, _LEARNING_RATE_SERIES, _BLEU_SERIES) for key, _ in series
    ]
    raise errors.BadValue(f"{metrics_path} has none of the series {known} to plot.")

  figure = _new_figure(width=6.5, height=2.4 * len(panels) + 0.6)
  axes_list = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
  plotted = []
  for axes, (ylabel, lines) in zip(axes_list, panels):
    for key, label, steps, values in lines:
      # Sparse series (validation every few thousand steps) get markers to stay visible.
      marker = "o" if len(steps) <= 50 else None
      axes.plot(steps, values, label=label, marker=marker, markersize=3, linewidth=1.2)
      plotted.append(key)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    if len(lines) > 1 or ylabel == "BLEU":
      axes.legend(fontsize=8)
  axes_list[-1].set_xlabel("step")
  steps, minutes = training_minutes(records)
  if len(steps) > 1:
    # Wall minutes of the training loop on a second axis: time-to-BLEU at a glance.
    to_minutes, to_steps = _linear_map(steps, minutes), _linear_map(minutes, steps)
    top = axes_list[0].secondary_xaxis("top", functions=(to_minutes, to_steps))
    top.set_xlabel("minutes of training", fontsize=8)
  figure.suptitle(f"Training curves: {os.path.basename(os.path.normpath(workdir))}", fontsize=10)
  _save(figure, path)
  return plotted

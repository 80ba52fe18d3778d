"""The loss without full float32 logits (train.loss_chunk_tokens, training/chunked_loss.py) and
the padded vocabulary (model.vocab_pad_multiple) compute what the default path computes.

Each is compared with the default path itself, on a tiny float32 model and packed rows with
padding: the chunked loss's loss, nll, accuracy count, token count and every parameter's
gradient against `losses.cross_entropy_sums` of the model's logits (autodiff through them),
chunked so that the last chunk of each row is partial; a padded model, whose padded rows and
logits bias hold large adversarial values, against the unpadded model with the same real rows
(loss, gradients of the shared rows, no gradient in the padded ones, greedy and beam output).

Tolerances (float32, fixed per test): the two paths sum the same float32 terms in another
order (the vocabulary matmul per chunk, the token sums per chunk); measured on this model the
sums differ by <= 2e-7 relative and the gradients by <= 3e-6 absolute (of values up to ~10).
"""

from __future__ import annotations

import contextlib
import functools

import flax
import jax
import jax.extend
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import init_params, tiny_model_config

from transformer_mt import cli
from transformer_mt.config import defaults as _defaults
from transformer_mt.decoding import beam_decode
from transformer_mt.decoding import incremental as decode
from transformer_mt.model import estimates
from transformer_mt.model.transformer import Transformer, count_parameters, parameter_shapes
from transformer_mt.runtime import errors, sharding
from transformer_mt.training import chunked_loss, optimizer, train_step
from transformer_mt.workdir import checkpointing

SUMS_RTOL = 2e-6
GRAD_ATOL = 2e-5
GRAD_RTOL = 1e-5
VOCAB = 40
ROWS, SRC_LEN, TGT_LEN = 3, 9, 13
# 3 rows: 15 tokens a chunk are 5 positions; a row of 13 is cut into 3 chunks of 5, the last
# holding 3 real positions and 2 of padding.
CHUNK_TOKENS = 15
# The output layers a model can have: the tied embedding, with a logits bias (Marian, mBART),
# and an untied projection with its own bias (FSMT).
OUTPUT_LAYERS = {
  "tied": dict(),
  "tied_bias": dict(logits_bias=True),
  "untied": dict(share_embeddings=False, target_vocab_size=VOCAB - 3),
}


@pytest.fixture(autouse=True)
def _full_precision_matmuls():
  with jax.default_matmul_precision("highest"):
    yield


def model_config(output_layer: str, **changes):
  """A 1+1-layer tiny model (each layer kind once: compilations are what these tests cost)."""
  values = dict(vocab_size=VOCAB, num_encoder_layers=1, num_decoder_layers=1)
  return tiny_model_config(**{**values, **OUTPUT_LAYERS[output_layer], **changes})


@functools.cache
def _teacher_forced(config):
  """The model's jitted teacher-forced logits, compiled once per config."""
  model = Transformer(config)

  def logits(params, batch):
    return model.apply(
      {"params": params},
      batch["inputs"],
      batch["targets_in"],
      inputs_positions=batch["inputs_positions"],
      targets_positions=batch["targets_positions"],
      inputs_segmentation=batch["inputs_segment_ids"],
      targets_segmentation=batch["targets_segment_ids"],
    )

  return jax.jit(logits)


@functools.cache
def _gradient(config, chunk_tokens):
  """The train step's (gradients, sums) of one micro-batch, jitted once per setting."""
  model = Transformer(config)
  grad = jax.grad(train_step._micro_batch_sums, has_aux=True)
  return jax.jit(lambda params, batch: grad(params, batch, None, model, 0.1, chunk_tokens))


def random_params(config, seed=0):
  """Initial params, with a random (nonzero) logits bias where the model has one."""
  params = init_params(config, seed)
  rng = np.random.default_rng(seed + 100)
  if "logits_bias" in params:
    params["logits_bias"] = jnp.asarray(rng.normal(size=params["logits_bias"].shape), jnp.float32)
  if "output_projection" in params:
    bias = params["output_projection"]["bias"]
    params["output_projection"]["bias"] = jnp.asarray(rng.normal(size=bias.shape), jnp.float32)
  return params


def packed_batch(config, params, seed=0):
  """[rows, len] arrays as the input pipeline makes them: row 0 two packed sentences and
  padding, row 1 one sentence and padding, row 2 one sentence filling the row (so the
  partial last chunk holds real tokens). Half the targets are the model's own argmax, so the
  accuracy count is far from 0 (random targets would give 0 or 1 correct)."""
  rng = np.random.default_rng(seed)
  vocab = config.output_vocab_size
  inputs = rng.integers(3, config.vocab_size, (ROWS, SRC_LEN)).astype(np.int32)
  inputs[0, 7:] = inputs[1, 5:] = 0
  src_segments = np.array([[1] * 4 + [2] * 3 + [0] * 2, [1] * 5 + [0] * 4, [1] * 9])
  tgt_segments = np.array([[1] * 5 + [2] * 6 + [0] * 2, [1] * 8 + [0] * 5, [1] * 13])
  positions = lambda segments: np.stack(  # noqa: E731
    [np.concatenate([np.arange((row == s).sum()) for s in (1, 2, 0)]) for row in segments]
  )
  batch = {
    "inputs": inputs,
    "inputs_segment_ids": src_segments,
    "targets_segment_ids": tgt_segments,
    "inputs_positions": positions(src_segments),
    "targets_positions": positions(tgt_segments),
  }
  targets = rng.integers(3, vocab, (ROWS, TGT_LEN)).astype(np.int32)
  for _ in range(2):  # the argmax of the model fed these targets, at even positions
    batch.update(targets=targets, targets_in=_shifted(targets, tgt_segments))
    logits = _teacher_forced(config)(params, batch)
    argmax = np.asarray(jnp.argmax(logits, -1), np.int32)
    targets = np.where(np.arange(TGT_LEN) % 2 == 0, np.maximum(argmax, 3), targets)
  targets[tgt_segments == 0] = 0
  batch.update(targets=targets, targets_in=_shifted(targets, tgt_segments))
  return {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}


def _shifted(targets, segments):
  """Each sentence's targets shifted right behind BOS (2); 0 at padding."""
  shifted = np.zeros_like(targets)
  for r in range(targets.shape[0]):
    for s in np.unique(segments[r][segments[r] > 0]):
      where = np.flatnonzero(segments[r] == s)
      shifted[r, where] = np.concatenate([[2], targets[r, where[:-1]]])
  return shifted


def sums_and_grads(config, params, batch, chunk_tokens):
  grads, sums = _gradient(config, chunk_tokens)(params, batch)
  return jax.device_get(sums), jax.device_get(grads)


def assert_same_sums(got, want):
  assert set(got) == set(want)
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=SUMS_RTOL, atol=0, err_msg=key)


def assert_same_grads(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(
      g, w, rtol=GRAD_RTOL, atol=GRAD_ATOL, err_msg=jax.tree_util.keystr(path)
    )


# ---------------------------------------------------------------------------------------------
# The chunked loss against the full logits
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("output_layer", sorted(OUTPUT_LAYERS))
def test_chunked_loss_metrics_and_gradients_equal_the_full_logits(output_layer):
  config = model_config(output_layer)
  params = random_params(config)
  batch = packed_batch(config, params)
  want_sums, want_grads = sums_and_grads(config, params, batch, 0)
  # Every token counts: row 2's last positions, in the partial chunk, are real ones.
  assert want_sums["num_tokens"] == 5 + 6 + 8 + 13
  assert 6 <= want_sums["correct"] < want_sums["num_tokens"]
  # 3 chunks, the last partial; and (the tied layer only, each is a compilation) one chunk
  for chunk_tokens in (CHUNK_TOKENS, 10_000) if output_layer == "tied" else (CHUNK_TOKENS,):
    got_sums, got_grads = sums_and_grads(config, params, batch, chunk_tokens)
    assert_same_sums(got_sums, want_sums)
    assert_same_grads(got_grads, want_grads)
  assert chunked_loss.chunk_shape(CHUNK_TOKENS, ROWS, TGT_LEN) == (3, 5)  # the last is partial


def test_the_chunked_loss_alone_matches_autodiff_of_the_formula():
  """The custom VJP against jax.grad of losses.cross_entropy_sums on explicit logits, with a
  cotangent on the nll as well as the loss (the train step only differentiates the loss), a
  padded weight (rows past the vocabulary) and label smoothing 0.2."""
  from transformer_mt.training import losses

  rng = np.random.default_rng(3)
  vocab, padded, d = 11, 16, 6
  hidden = jnp.asarray(rng.normal(size=(2, 7, d)), jnp.float32)
  weight = jnp.asarray(rng.normal(size=(padded, d)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=padded), jnp.float32)
  targets = jnp.asarray(rng.integers(0, vocab, (2, 7)), jnp.int32)
  weights = jnp.asarray(rng.integers(0, 2, (2, 7)), jnp.float32)

  def objective(sums):
    return sums["loss"] + 0.3 * sums["nll"]

  def full(h, w, b):
    logits = (h @ w.T + b)[..., :vocab]
    return objective(losses.cross_entropy_sums(logits, targets, weights, 0.2))

  def chunked(h, w, b):
    sums = chunked_loss.cross_entropy_sums(
      h,
      w,
      b,
      targets,
      weights,
      label_smoothing=0.2,
      vocab_size=vocab,
      chunk_tokens=6,  # 3 positions a chunk: chunks of 3, 3 and 1 (+2 padding)
      compute_dtype=jnp.float32,
    )
    return objective(sums)

  # Jitted: one compilation each (op by op, every primitive would compile on its own).
  want_value, want_grads = jax.jit(jax.value_and_grad(full, argnums=(0, 1, 2)))(
    hidden, weight, bias
  )
  got_value, got_grads = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1, 2)))(
    hidden, weight, bias
  )
  np.testing.assert_allclose(got_value, want_value, rtol=SUMS_RTOL)
  for got, want in zip(got_grads, want_grads):
    np.testing.assert_allclose(got, want, rtol=GRAD_RTOL, atol=GRAD_ATOL)
  assert not np.any(np.asarray(got_grads[1][vocab:])) and not np.any(got_grads[2][vocab:])


def _largest_vocabulary_array(jaxpr, vocab, d_model) -> int:
  """Elements of the largest array in `jaxpr` (sub-jaxprs included) whose last axis is the
  vocabulary: the logits, their cotangent and anything of their size (not the embedding's
  transposed gradient [d_model, vocab], which both paths have)."""
  largest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      shape = getattr(var.aval, "shape", ())
      if shape and shape[-1] == vocab and tuple(shape) != (d_model, vocab):
        largest = max(largest, int(np.prod(shape)))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      largest = max(largest, _largest_vocabulary_array(sub, vocab, d_model))
  return largest


def test_the_chunked_step_never_holds_the_logits_of_all_tokens():
  """The gradient program of the chunked loss has no [tokens, vocab] array at all: its largest
  vocabulary-wide one is one chunk's [rows, 5, vocab]; the default path's is all of them."""
  config = model_config("tied")
  params = random_params(config)
  batch = packed_batch(config, params)

  def program(chunk_tokens):
    return jax.make_jaxpr(
      jax.grad(train_step._micro_batch_sums, has_aux=True), static_argnums=(2, 3, 4, 5)
    )(params, batch, None, Transformer(config), 0.1, chunk_tokens).jaxpr

  d_model = config.d_model
  assert _largest_vocabulary_array(program(0), VOCAB, d_model) == ROWS * TGT_LEN * VOCAB
  assert _largest_vocabulary_array(program(CHUNK_TOKENS), VOCAB, d_model) == ROWS * 5 * VOCAB


def test_a_sharded_train_step_with_the_chunked_loss_equals_the_default_one(cpu_devices):
  """Two SGD steps on a data x fsdp x tensor = 2 x 2 x 2 mesh (rows over data and fsdp, the
  vocabulary over tensor): the chunked loss's metrics and parameters equal the default's.
  (No dropout, which the loss never sees: its random bits would only add to each of the two
  compilations.)"""
  config = model_config("tied_bias", num_heads=2)
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": 2, "fsdp": 2, "tensor": 2}), cpu_devices
  )
  train = _defaults.base_config().train
  train.update(optimizer="sgd", lr_scale=1.0, warmup_steps=10, grad_clip_norm=0.0)
  model = Transformer(config.replace(deterministic=False, dropout_rate=0.0))
  tx, schedule = optimizer.make_optimizer(train, config.d_model)
  shardings = train_step.state_shardings(model, tx, mesh)
  # The initial state built (compiled) once; each run starts from a copy in its layout.
  initial_state = jax.device_get(train_step.create_sharded_state(0, model, tx, mesh))
  initial = initial_state.params
  # 4 x 3 rows: 12, divisible by the 4 batch shards; half the targets the initial argmax.
  rows = [packed_batch(config, initial, seed) for seed in range(4)]
  batch = {k: np.concatenate([r[k] for r in rows])[None] for k in rows[0]}  # [1, 12, len]

  def run(chunk_tokens):
    state = jax.device_put(initial_state, shardings)
    step = train_step.jit_train_step(
      model, tx, schedule, 0.1, mesh, shardings, loss_chunk_tokens=chunk_tokens
    )
    metrics = []
    for _ in range(2):
      state, m = step(state, sharding.global_batch_from_local(batch, mesh, batch_dim=1))
      metrics.append(jax.device_get(m))
    return metrics, jax.device_get(state.params)

  want_metrics, want_params = run(0)
  # 12 tokens a device: over its 3 rows, 4 positions a chunk: 4 chunks, the last partial.
  got_metrics, got_params = run(12)
  for got, want in zip(got_metrics, want_metrics):
    for key in ("loss", "nll", "accuracy", "num_tokens", "grad_norm"):
      np.testing.assert_allclose(got[key], want[key], rtol=SUMS_RTOL, err_msg=key)
  assert want_metrics[0]["accuracy"] > 0.1
  for got, want in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params)):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def _scan_lengths(jaxpr) -> set[int]:
  """The lengths of the scans (lax.map among them) in `jaxpr`, sub-jaxprs included."""
  lengths = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      lengths.add(eqn.params["length"])
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      lengths |= _scan_lengths(sub)
  return lengths


@pytest.mark.parametrize(
  "mesh_shape, chunks, positions",
  [
    (None, 13, 1),  # one device, all 24 rows: 1 position a chunk
    ((2, 2, 2), 4, 4),  # rows over data x fsdp: 6 a device, 4 positions a chunk
    ((8, 1, 1), 2, 7),  # 3 a device: 8 positions asked, 13 cut as 2 chunks of 7
  ],
  ids=["one-device", "data2-fsdp2-tensor2", "data8"],
)
def test_a_chunk_holds_the_asked_tokens_on_each_device(cpu_devices, mesh_shape, chunks, positions):
  """train.loss_chunk_tokens counts one device's tokens: 24 tokens a chunk on a batch of 24
  rows split over 1, 4 or 8 of the simulated devices give each device's chunk about 24 of its
  own tokens (not 24 of all devices' rows, 1 position). Read from the traced gradient program
  (global shapes, nothing compiled): the scans over the chunks, and its largest
  vocabulary-wide array, one chunk's logits [24 rows, positions, vocab]."""
  config = model_config("tied")
  rows, chunk_tokens = 24, 24
  batch = {
    key: jax.ShapeDtypeStruct((rows, SRC_LEN if key.startswith("inputs") else TGT_LEN), jnp.int32)
    for key in ("inputs", "targets", "targets_in")
    + tuple(
      f"{side}_{kind}" for side in ("inputs", "targets") for kind in ("positions", "segment_ids")
    )
  }
  mesh = contextlib.nullcontext()
  if mesh_shape is not None:
    sizes = ml_collections.ConfigDict(dict(zip(sharding.MESH_AXES, mesh_shape)))
    mesh = jax.set_mesh(sharding.make_mesh(sizes, cpu_devices))
  with mesh:
    program = jax.make_jaxpr(
      jax.grad(train_step._micro_batch_sums, has_aux=True), static_argnums=(2, 3, 4, 5)
    )(parameter_shapes(config), batch, None, Transformer(config), 0.1, chunk_tokens).jaxpr
  assert _scan_lengths(program) == {chunks}  # the forward's lax.map and the backward's scan
  assert _largest_vocabulary_array(program, VOCAB, config.d_model) == rows * positions * VOCAB
  device_rows = rows // (1 if mesh_shape is None else mesh_shape[0] * mesh_shape[1])
  # Each device's chunk: at most the tokens asked, and more than half of them.
  assert device_rows * positions <= chunk_tokens < 2 * device_rows * positions


@pytest.mark.parametrize("value", [-1, 2.5, "8192", True])
def test_a_bad_loss_chunk_tokens_is_one_error_line(value, tmp_path, capsys):
  with pytest.raises(errors.BadValue, match="train.loss_chunk_tokens="):
    chunked_loss.check_chunk_tokens(value)
  if value == -1:
    argv = ["train", "--experiment", "demo", "--workdir", str(tmp_path / "w")]
    assert cli.main(argv + ["train.loss_chunk_tokens=-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: train.loss_chunk_tokens=-1 must be 0") and "\n" not in err
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------------------------
# The padded vocabulary against the unpadded model
# ---------------------------------------------------------------------------------------------

PAD_MULTIPLE = 16  # 40 ids -> 48 rows (37 -> 48 for the untied target side)


def _flat(tree) -> dict:
  return flax.traverse_util.flatten_dict(tree, sep="/")


def padded_params(config, padded_config, params):
  """The padded model's params: the unpadded model's in the real rows, and in the padded ones
  values that would win every argmax and dominate the softmax if they took part: rows 30 times
  the largest real row's size in random directions, and a logits bias of +50."""
  rng = np.random.default_rng(9)
  shapes = {k: v.shape for k, v in _flat(parameter_shapes(padded_config)).items()}
  flat = _flat(params)
  padded = {}
  for name, value in flat.items():
    value = np.asarray(value)
    shape = shapes[name]
    if shape == value.shape:
      padded[name] = value
      continue
    axis = [a for a in range(value.ndim) if shape[a] != value.shape[a]]
    assert len(axis) == 1, name
    extra_shape = list(shape)
    extra_shape[axis[0]] = shape[axis[0]] - value.shape[axis[0]]
    if value.ndim == 1:
      extra = np.full(extra_shape, 50.0, np.float32)
    else:
      extra = rng.normal(size=extra_shape).astype(np.float32) * 30 * np.abs(value).max()
    padded[name] = np.concatenate([value, extra], axis=axis[0])
  assert set(padded) == set(shapes)
  assert any(padded[n].shape != np.shape(flat[n]) for n in flat), "nothing was padded"
  return jax.tree.map(jnp.asarray, flax.traverse_util.unflatten_dict(padded, sep="/"))


def _hidden_and_output_layer(module, *args):
  return module.hidden_states(*args), module.output_layer()


def real_rows(grads, config):
  """The padded model's gradients cut to the unpadded model's shapes, and the largest
  absolute gradient of a padded row."""
  flat = _flat(grads)
  shapes = {k: v.shape for k, v in _flat(parameter_shapes(config)).items()}
  cut, padded_max = {}, 0.0
  for name, g in flat.items():
    g = np.asarray(g)
    index = tuple(slice(0, n) for n in shapes[name])
    cut[name] = g[index]
    rest = g.copy()
    rest[index] = 0
    padded_max = max(padded_max, float(np.abs(rest).max(initial=0.0)))
  return flax.traverse_util.unflatten_dict(cut, sep="/"), padded_max


# The default loss's cut (output_logits) comes after the output layer's branches: one layer
# checks it. The chunked loss reads each layer's weight and bias itself (output_layer): all.
PADDED_CHUNKINGS = {
  "tied": (CHUNK_TOKENS,),
  "tied_bias": (0, CHUNK_TOKENS),
  "untied": (CHUNK_TOKENS,),
}


@pytest.mark.parametrize("output_layer", sorted(OUTPUT_LAYERS))
def test_a_padded_vocabulary_trains_as_the_unpadded_model(output_layer):
  """Loss, metrics and the shared rows' gradients are the unpadded model's; the padded rows
  (and their logits bias) get exactly zero gradient, so Adam never moves them: through the
  chunked loss for every output layer, and through the default loss (each a compilation)."""
  config = model_config(output_layer)
  padded_config = config.replace(vocab_pad_multiple=PAD_MULTIPLE)
  assert (padded_config.padded_vocab_size, padded_config.padded_output_vocab_size) == (48, 48)
  params = random_params(config)
  batch = packed_batch(config, params)
  want_sums, want_grads = sums_and_grads(config, params, batch, 0)
  padded = padded_params(config, padded_config, params)
  for chunk_tokens in PADDED_CHUNKINGS[output_layer]:
    got_sums, got_grads = sums_and_grads(padded_config, padded, batch, chunk_tokens)
    assert_same_sums(got_sums, want_sums)
    shared, padded_max = real_rows(got_grads, config)
    assert_same_grads(shared, want_grads)
    assert padded_max == 0.0


@pytest.mark.parametrize("output_layer", sorted(OUTPUT_LAYERS))
def test_a_padded_vocabulary_decodes_as_the_unpadded_model(output_layer):
  """The logits themselves, and (the untied layer only: decoding reads the same cut logits
  whatever the layer, and each decoder is two compilations) greedy and beam-4 output, token
  for token: the padded ids are never produced, however large their logits would be."""
  config = model_config(output_layer, eos_id=1)
  padded_config = config.replace(vocab_pad_multiple=PAD_MULTIPLE)
  params = random_params(config)
  padded = padded_params(config, padded_config, params)
  batch = packed_batch(config, params)
  logits = _teacher_forced(config)(params, batch)
  padded_logits = _teacher_forced(padded_config)(padded, batch)
  assert padded_logits.shape == logits.shape
  np.testing.assert_allclose(padded_logits, logits, rtol=1e-6, atol=1e-5)
  # The padded rows are adversarial: over all rows, the padded ids would win most argmaxes.
  hidden, (weight, bias) = jax.jit(
    lambda p, inputs, targets_in: Transformer(padded_config).apply(
      {"params": p}, inputs, targets_in, method=_hidden_and_output_layer
    )
  )(padded, batch["inputs"], batch["targets_in"])
  all_rows = hidden @ weight.T + (0.0 if bias is None else bias)
  assert np.mean(np.argmax(all_rows, -1) >= padded_config.output_vocab_size) > 0.5
  if output_layer != "untied":
    return
  inputs = batch["inputs"]
  greedy = decode.greedy_decode(params, inputs, config, 8)
  np.testing.assert_array_equal(decode.greedy_decode(padded, inputs, padded_config, 8), greedy)
  beam = beam_decode.beam_decode(params, inputs, config, 4, 8)
  padded_beam = beam_decode.beam_decode(padded, inputs, padded_config, 4, 8)
  np.testing.assert_array_equal(padded_beam.all_sequences, beam.all_sequences)
  np.testing.assert_allclose(padded_beam.all_scores, beam.all_scores, rtol=1e-5)


def test_parameter_counts_and_estimates_count_the_real_vocabulary():
  config = model_config("tied")
  padded_config = config.replace(vocab_pad_multiple=128)
  assert padded_config.padded_vocab_size == 128
  assert count_parameters(padded_config) == count_parameters(config)
  run = _defaults.base_config()
  run.tokenizer.vocab_size = 9712
  plain = estimates.parameter_parts(run)
  run.model.vocab_pad_multiple = 128
  assert estimates.parameter_parts(run) == plain
  assert plain["output"] == 9712 * run.model.d_model


@pytest.mark.parametrize("value", [0, -128, 1.5])
def test_a_bad_vocab_pad_multiple_is_one_error_line(value, tmp_path, capsys):
  with pytest.raises(errors.BadValue, match="vocab_pad_multiple="):
    model_config("tied", vocab_pad_multiple=value)
  if value == 0:
    argv = ["train", "--experiment", "demo", "--workdir", str(tmp_path / "w")]
    assert cli.main(argv + ["model.vocab_pad_multiple=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "vocab_pad_multiple=0 must be" in err and "\n" not in err
    assert not (tmp_path / "w").exists()


def test_resuming_with_another_vocab_pad_multiple_is_refused(tmp_path):
  """A checkpoint of the unpadded model does not restore into a padded one: the existing
  shape check names the embedding."""
  from transformer_mt.data.tokenizer import train_tokenizer
  from transformer_mt.model import setup as model_setup

  config = _defaults.base_config()
  config.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
  tokenizer = train_tokenizer([("a b c d", "e f g h")] * 50, vocab_size=14)
  mesh = sharding.make_mesh(sharding.inference_mesh_config())
  setup = model_setup.model_setup(config, tokenizer, mesh)
  params = init_params(setup.model_config)
  checkpointing.save_inference(str(tmp_path), 3, params, config, tokenizer)
  config.model.vocab_pad_multiple = 8
  padded = model_setup.model_setup(config, tokenizer, mesh)
  assert padded.model_config.padded_vocab_size == 16
  with pytest.raises(
    checkpointing.ModelMismatch, match=r"embedding.*checkpoint \(14, 16\) vs model \(16, 16\)"
  ):
    checkpointing.check_compatible(str(tmp_path), 3, padded.abstract_params)

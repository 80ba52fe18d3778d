"""The fused kernels that take packed rows' sentences directly (model/fused_kernels.py) compute
what the default attention computes, on packed rows with several sentences and padding.

No CPU runs cuDNN, so "cudnn_packed" is checked in two independent halves: the lengths and
offsets it builds from segment ids, against a NumPy transcription of cuDNN's packed layout;
and everything around the kernel (padding, scale, causality, cross-attention, the bound on
sentences per row), with the kernel replaced by `emulated_cudnn`
(tests/cudnn_transcriptions.py, as the other two transcriptions), a transcription of what
JAX's packed-layout API documents, which also writes NaN wherever cuDNN leaves memory
undefined (outputs and gradients at padding). `emulated_cudnn` pairs sentence slots within a
row; `compacted_cudnn` transcribes what the kernel gets instead, JAX's own compaction of the
slots across the batch, which agrees only under cudnn_packed_attention's `fits` check (tested
on both sides). "pallas" runs JAX's Pallas kernel itself, in Pallas' interpreter."""

import functools
import logging

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cudnn_transcriptions import compacted_cudnn, emulated_cudnn, numpy_layout
from helpers import tiny_model_config

from transformer_mt.config import registry
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID
from transformer_mt.model import attention, fused_kernels
from transformer_mt.model.attention import AttentionMask, fused_attention
from transformer_mt.model.transformer import Transformer
from transformer_mt.runtime import errors
from transformer_mt.training import train


def packed_segments(lengths_per_row, length):
  """[rows, length] segment ids 1, 2, ... of consecutive sentences, 0 at trailing padding."""
  ids = np.zeros((len(lengths_per_row), length), np.int32)
  for row, lengths in enumerate(lengths_per_row):
    start = 0
    for segment, n in enumerate(lengths, start=1):
      ids[row, start : start + n] = segment
      start += n
  return ids


@pytest.fixture
def cudnn_emulated(monkeypatch):
  """ "cudnn_packed" runs here, on the emulated kernel."""
  monkeypatch.setattr(fused_kernels, "cudnn_packed_problem", lambda: None)
  monkeypatch.setattr(fused_kernels, "_cudnn_dot_product_attention", emulated_cudnn)


@pytest.fixture
def pallas_interpreted(monkeypatch):
  monkeypatch.setattr(fused_kernels, "INTERPRET_PALLAS_OFF_GPU", True)


def qkv(seed, batch, q_len, k_len, heads=2, depth=8):
  keys = jax.random.split(jax.random.key(seed), 3)
  shapes = [(batch, q_len, heads, depth)] + [(batch, k_len, heads, depth)] * 2
  return [jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, shapes)]


def outputs_and_gradients(implementation, q, k, v, mask, cross=False):
  """Attention outputs and d(q, k, v) for a fixed cotangent that is zero at padded queries
  (what the model sends back: nothing reads those outputs); jitted afresh for each call, so
  that what the fixtures patched is what gets traced."""
  cotangent = jax.random.normal(jax.random.key(9), q.shape) * mask.query_valid[:, :, None, None]

  def run(q, k, v, mask, cotangent):
    attend = functools.partial(
      fused_attention, mask=mask, implementation=implementation, cross_attention=cross
    )
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v), q, k, v)
    return out, vjp(cotangent)

  out, grads = jax.jit(run)(q, k, v, mask, cotangent)
  return np.asarray(out), [np.asarray(g) for g in grads]


def assert_same_attention(implementation, q, k, v, mask, cross=False):
  out, grads = outputs_and_gradients(implementation, q, k, v, mask, cross)
  reference, reference_grads = outputs_and_gradients("auto", q, k, v, mask, cross)
  valid = np.asarray(mask.query_valid)
  np.testing.assert_allclose(out[valid], reference[valid], rtol=1e-5, atol=1e-5)
  for grad, reference_grad in zip(grads, reference_grads):
    np.testing.assert_allclose(grad, reference_grad, rtol=1e-4, atol=1e-5)
  return out


# Two packed rows with padding (3 and 2 sentences), one full row of one sentence.
SOURCE = packed_segments([[4, 6, 3], [7, 5], [16]], 16)
TARGET = packed_segments([[5, 2, 6], [3, 8], [16]], 16)


def test_packed_layout_matches_a_numpy_transcription():
  rng = np.random.default_rng(0)
  rows = [[2, 5, 3, 2], [16], [], [3, 3, 3, 3, 2], [1, 1, 2]] + [
    list(rng.integers(1, 6, size=rng.integers(1, 5))) for _ in range(20)
  ]
  rows = [[n for n in row if n] for row in rows if sum(row) <= 16]
  segments = packed_segments(rows, 16)
  seqlens, offsets = jax.jit(fused_kernels.packed_layout, static_argnums=1)(
    jnp.asarray(segments), 8
  )
  expected = numpy_layout(segments, 8)
  np.testing.assert_array_equal(np.asarray(seqlens), expected[0])
  np.testing.assert_array_equal(np.asarray(offsets), expected[1])
  assert fused_kernels.max_segments(16) == 8 and fused_kernels.max_segments(1) == 2


@pytest.mark.usefixtures("cudnn_emulated")
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_packed_self_attention_equals_the_default(causal):
  q, k, v = qkv(0, 3, 16, 16)
  valid = jnp.asarray(TARGET > 0)
  segments = jnp.asarray(TARGET)
  out = assert_same_attention(
    "cudnn_packed", q, k, v, AttentionMask(valid, valid, segments, segments, causal)
  )
  assert np.all(out[~np.asarray(valid)] == 0)  # padded queries: zeros, not cuDNN's garbage


@pytest.mark.usefixtures("cudnn_emulated")
def test_cudnn_packed_cross_attention_equals_the_default():
  """Target sentence m attends to source sentence m, at other offsets and other lengths."""
  source = packed_segments([[4, 6, 3], [7, 5], [20]], 20)
  q, k, v = qkv(1, 3, 16, 20)
  mask = AttentionMask(
    jnp.asarray(TARGET > 0), jnp.asarray(source > 0), jnp.asarray(TARGET), jnp.asarray(source)
  )
  assert_same_attention("cudnn_packed", q, k, v, mask, cross=True)


@pytest.mark.usefixtures("cudnn_emulated")
def test_cudnn_packed_poisons_rows_beyond_its_bound():
  """A row with more sentences than `max_segments` (1-token sentences, which the pipeline
  never packs) gives NaN, the train step's non-finite signal, not a silently wrong result."""
  segments = jnp.asarray(packed_segments([list(np.ones(10, int)), [8]], 10))  # 10 > 5 slots
  valid = segments > 0
  q, k, v = qkv(2, 2, 10, 10)
  mask = AttentionMask(valid, valid, segments, segments)
  out = jax.jit(lambda q, k, v: fused_attention(q, k, v, mask, "cudnn_packed"))(q, k, v)
  assert np.isnan(np.asarray(out)).all()


KERNELS = (compacted_cudnn, emulated_cudnn)


@pytest.mark.parametrize("cross", [False, True])
def test_cudnn_packed_equals_the_default_as_jax_compacts_sentences(monkeypatch, cross):
  """Through JAX's own compaction of the layout (`compacted_cudnn`): rows whose query and
  key sentences fill the same slots (`fits` in cudnn_packed_attention), as the pipeline's
  rows always do, attend as the default does; here with 3, 2 and 1 sentences per row, so
  that row 0's extra sentence shifts every later row's position in the compacted list."""
  monkeypatch.setattr(fused_kernels, "cudnn_packed_problem", lambda: None)
  monkeypatch.setattr(fused_kernels, "_cudnn_dot_product_attention", compacted_cudnn)
  keys = packed_segments([[4, 6, 3], [7, 5], [20]], 20) if cross else TARGET
  q, k, v = qkv(5, 3, 16, keys.shape[1])
  mask = AttentionMask(
    jnp.asarray(TARGET > 0),
    jnp.asarray(keys > 0),
    jnp.asarray(TARGET),
    jnp.asarray(keys),
    causal=not cross,
  )
  out, reference = (
    np.asarray(
      jax.jit(functools.partial(fused_attention, implementation=i, cross_attention=cross))(
        q, k, v, mask
      )
    )
    for i in ("cudnn_packed", "auto")
  )
  valid = TARGET > 0
  np.testing.assert_allclose(out[valid], reference[valid], rtol=1e-5, atol=1e-5)


def test_cudnn_packed_refuses_rows_whose_sentences_do_not_fit():
  """Row 0 has a target sentence more than its sources, row 1 one less (the same total): in
  JAX's compacted list, row 0's third target sentence meets row 1's first source sentence,
  and every row-1 pairing shifts by one, where the per-row slots (`emulated_cudnn`) pair
  within the row. The kernel's answer is wrong either way: all NaN, the train step's
  non-finite signal, under both transcriptions."""
  source = jnp.asarray(packed_segments([[6, 7], [4, 5, 3], [16]], 16))
  target = jnp.asarray(packed_segments([[5, 2, 6], [3, 8], [16]], 16))
  mask = AttentionMask(target > 0, source > 0, target, source)

  def kernels_and_adapter(q, k, v):  # one program for all four
    q_seqlen, q_offsets = fused_kernels.packed_layout(target, 8)
    kv_seqlen, kv_offsets = fused_kernels.packed_layout(source, 8)
    layout = dict(q_seqlen=q_seqlen, kv_seqlen=kv_seqlen, q_offsets=q_offsets)
    layout.update(kv_offsets=kv_offsets, scale=0.5, mask_type="PADDING", qkv_layout="BTNH")
    outputs = [kernel(q, k, v, **layout) for kernel in KERNELS]
    for kernel in KERNELS:
      with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fused_kernels, "cudnn_packed_problem", lambda: None)
        patch.setattr(fused_kernels, "_cudnn_dot_product_attention", kernel)
        outputs.append(fused_attention(q, k, v, mask, "cudnn_packed", cross_attention=True))
    return outputs

  compacted, per_row, *adapted = map(np.asarray, jax.jit(kernels_and_adapter)(*qkv(6, 3, 16, 16)))
  row_1 = np.asarray(target[1] > 0)
  assert not np.allclose(compacted[1, row_1], per_row[1, row_1])
  for out, kernel in zip(adapted, KERNELS):
    assert np.isnan(out).all(), kernel.__name__


def model_args():
  """The model's packed-row arguments for SOURCE and TARGET (positions restart per sentence)."""

  def positions(segments):
    pos = np.zeros_like(segments)
    for row in range(segments.shape[0]):
      for col in range(1, segments.shape[1]):
        pos[row, col] = pos[row, col - 1] + 1 if segments[row, col] == segments[row, col - 1] else 0
    return np.where(segments > 0, pos, 0)

  rng = np.random.default_rng(1)
  inputs = np.where(SOURCE > 0, rng.integers(4, 40, SOURCE.shape), PAD_ID)
  targets = np.where(TARGET > 0, rng.integers(4, 40, TARGET.shape), PAD_ID)
  targets_in = np.where(positions(TARGET) == 0, BOS_ID, np.roll(targets, 1, axis=1))
  targets_in = np.where(TARGET > 0, targets_in, PAD_ID)
  args = (inputs, targets_in, positions(SOURCE), positions(TARGET), SOURCE, TARGET)
  return tuple(jnp.asarray(a, jnp.int32) for a in args), jnp.asarray(targets, jnp.int32)


def model_loss_and_gradients(config, params):
  """A training step's loss (token NLL at real targets, dropout on) and its gradients."""
  args, targets = model_args()
  model = Transformer(config.replace(deterministic=False, dropout_rate=0.1))

  def loss(params):
    logits = model.apply({"params": params}, *args, rngs={"dropout": jax.random.key(5)})
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    return -jnp.sum(jnp.where(args[5] > 0, picked, 0))

  return jax.jit(jax.value_and_grad(loss))(params)


def assert_same_training(config, reference_config):
  params = helpers.init_params(reference_config)
  loss, grads = model_loss_and_gradients(config, params)
  reference_loss, reference_grads = model_loss_and_gradients(reference_config, params)
  np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, reference_grads
  )


@pytest.mark.usefixtures("cudnn_emulated")
@pytest.mark.parametrize("decoder_start_id", [BOS_ID, PAD_ID])
def test_cudnn_packed_model_loss_and_gradients_equal_the_default(monkeypatch, decoder_start_id):
  """All 3 attention kinds of the model on the emulated kernel (its NaN at padding
  included): the default's loss and gradients. The config stays float32 (cuDNN wants
  bf16, the emulation does not): "auto" is made to stand for "cudnn_packed". A decoder
  that starts with PAD (Marian) counts padding at position 0 as valid: still padding here."""
  config = tiny_model_config(
    num_encoder_layers=1, num_decoder_layers=1, decoder_start_id=decoder_start_id
  )
  params = helpers.init_params(config)
  reference = model_loss_and_gradients(config, params)
  calls = []

  def packed(implementation, dtype):
    calls.append(implementation)
    return "cudnn_packed"

  monkeypatch.setattr(fused_kernels, "resolve", packed)
  loss_and_grads = model_loss_and_gradients(config, params)
  assert len(calls) == 3  # encoder self, decoder self, cross
  np.testing.assert_allclose(loss_and_grads[0], reference[0], rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
    loss_and_grads[1],
    reference[1],
  )


def test_fused_kernels_refuse_a_backend_that_cannot_run_them():
  """On this CPU: one `error:` line each (errors.BadValue, exit status 2 in run.py)."""
  dummy = jnp.ones((1, 16), jnp.int32)
  for implementation, dtype, words in (
    ("cudnn_packed", "bfloat16", "needs an NVIDIA GPU with cuDNN, and this process runs on cpu"),
    ("pallas", "float32", "runs Triton kernels on an NVIDIA GPU, and this process runs on cpu"),
  ):
    config = tiny_model_config(attention_implementation=implementation, dtype=dtype)
    with pytest.raises(errors.BadValue, match=words) as raised:
      Transformer(config).init(jax.random.key(0), dummy, dummy)
    assert "\n" not in str(raised.value)


# A later check of the same config (evaluate.average_last=3 needs 3 kept checkpoints) ends
# train() before it reads any data, so the two tests below cost no training run.
_THEN_REFUSED = ["evaluate.average_last=3", "train.keep_checkpoints=2"]


def test_training_refuses_a_kernel_this_process_lacks_before_tracing(tmp_path):
  """With attention dropout, training's trace never reaches the kernel: without the config
  check, a run on this CPU would train and refuse only at its first validation."""
  config = registry.load_experiment(
    "demo",
    [
      "model.attention_implementation='cudnn_packed'",
      "model.dtype='bfloat16'",
      "model.attention_dropout_rate=0.1",
      *_THEN_REFUSED,
    ],
  )
  with pytest.raises(errors.BadValue, match="'cudnn_packed' needs an NVIDIA GPU"):
    train.train(config, str(tmp_path / "run"), progress=False)
  assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("pallas_interpreted")
@pytest.mark.parametrize("rate", [0.1, 0.0])
def test_attention_dropout_keeping_training_off_the_kernel_is_one_warning(tmp_path, caplog, rate):
  """Dropout on the probabilities needs them as an array, which the kernel never stores:
  training spells the softmax out, and one warning line names the key and what runs."""
  config = registry.load_experiment(
    "demo",
    [
      "model.attention_implementation='pallas'",
      f"model.attention_dropout_rate={rate}",
      *_THEN_REFUSED,
    ],
  )
  with pytest.raises(errors.BadValue, match="train.keep_checkpoints=3"):
    train.train(config, str(tmp_path / "run"), progress=False)
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  warnings = [line for line in warnings if "attention_dropout_rate" in line]
  assert len(warnings) == (rate > 0), warnings
  if rate:
    assert "model.attention_dropout_rate=0.1" in warnings[0] and "'pallas'" in warnings[0]
    assert "softmax spelled out" in warnings[0] and "\n" not in warnings[0]


def test_auto_stays_xla_until_the_constant_says_otherwise(monkeypatch):
  monkeypatch.setattr(fused_kernels, "cudnn_packed_problem", lambda: None)  # a Hopper GPU
  assert not fused_kernels.AUTO_PICKS_CUDNN_PACKED_ON_GPU
  assert fused_kernels.resolve("auto", jnp.bfloat16) == "auto"
  monkeypatch.setattr(fused_kernels, "AUTO_PICKS_CUDNN_PACKED_ON_GPU", True)
  assert fused_kernels.resolve("auto", jnp.bfloat16) == "cudnn_packed"
  assert fused_kernels.resolve("auto", jnp.float32) == "auto"  # cuDNN takes no float32
  assert fused_kernels.resolve("xla", jnp.bfloat16) == "xla"
  monkeypatch.setattr(fused_kernels, "cudnn_packed_problem", lambda: "needs a Hopper GPU")
  assert fused_kernels.resolve("auto", jnp.bfloat16) == "auto"


@pytest.mark.usefixtures("pallas_interpreted")
@pytest.mark.parametrize("causal", [False, True])
def test_pallas_self_attention_equals_the_default(causal):
  q, k, v = qkv(3, 3, 16, 16)
  valid, segments = jnp.asarray(SOURCE > 0), jnp.asarray(SOURCE)
  assert_same_attention("pallas", q, k, v, AttentionMask(valid, valid, segments, segments, causal))


@pytest.mark.usefixtures("pallas_interpreted")
@pytest.mark.parametrize(
  "rows, length, blocks",
  [
    ([[7, 12, 9, 11], [30, 18]], 48, (16, 16)),  # 3 blocks each way
    ([[20, 25, 10], [64]], 64, (64, 32)),  # 1 forward block, 2 backward ones
  ],
  ids=["48_tokens", "64_tokens"],
)
def test_pallas_tiles_rows_of_several_blocks_as_the_default(rows, length, blocks):
  """Causal self-attention over rows longer than one block, sentences and padding across the
  block boundaries: the forward pass's causal bound on key blocks, the backward pass's on
  query blocks, and a backward block smaller than the forward one."""
  assert fused_kernels.pallas_blocks(length) == blocks
  segments = jnp.asarray(packed_segments(rows, length))
  q, k, v = qkv(7, len(rows), length, length, heads=1, depth=16)
  valid = segments > 0
  assert_same_attention("pallas", q, k, v, AttentionMask(valid, valid, segments, segments, True))


def test_pallas_blocks_divide_the_row_and_fit_the_backward_kernels():
  """Per length: forward, the largest power-of-two block of 16 to 128 tokens dividing it;
  backward, the largest of 16 or 32 tokens dividing it (JAX's default backward block is 32:
  its kernels hold a query and a key block at once). None where no block divides it."""
  for length in range(1, 600):
    divisors = [b for b in (16, 32, 64, 128) if length % b == 0]
    expected = (max(divisors), max(b for b in divisors if b <= 32)) if divisors else None
    assert fused_kernels.pallas_blocks(length) == expected, length


@pytest.mark.usefixtures("pallas_interpreted")
def test_pallas_leaves_cross_attention_and_odd_lengths_to_the_default(monkeypatch):
  """Pallas' kernel takes one segment array for queries and keys, and Triton blocks of 16+
  tokens: cross-attention, and rows of 12 tokens, go the default way (bit for bit)."""
  q, k, v = qkv(4, 3, 16, 12)
  source = jnp.asarray(packed_segments([[4, 6], [12], [3, 3]], 12))
  mask = AttentionMask(jnp.asarray(TARGET > 0), source > 0, jnp.asarray(TARGET), source)
  reference = fused_attention(q, k, v, mask, "auto")
  np.testing.assert_array_equal(
    fused_attention(q, k, v, mask, "pallas", cross_attention=True), reference
  )
  self_mask = AttentionMask(source > 0, source > 0, source, source)
  np.testing.assert_array_equal(
    fused_attention(k, k, v, self_mask, "pallas"), fused_attention(k, k, v, self_mask, "auto")
  )
  assert fused_kernels.pallas_blocks(12) is None


@pytest.mark.usefixtures("pallas_interpreted")
def test_pallas_model_loss_and_gradients_equal_the_default():
  config = tiny_model_config(num_encoder_layers=1, num_decoder_layers=1, num_heads=2)
  assert_same_training(config.replace(attention_implementation="pallas"), config)


def test_the_model_reaches_the_kernels_through_fused_attention(monkeypatch):
  """MultiHeadAttention tells fused_attention which attentions are cross-attention."""
  config = tiny_model_config(num_encoder_layers=1, num_decoder_layers=1)
  params = helpers.init_params(config)
  seen = []
  real = attention.fused_attention

  def spy(*args, cross_attention=False, **kwargs):
    seen.append(cross_attention)
    return real(*args, cross_attention=cross_attention, **kwargs)

  monkeypatch.setattr(attention, "fused_attention", spy)
  args, _ = model_args()
  Transformer(config).apply({"params": params}, *args)
  assert seen == [False, False, True]

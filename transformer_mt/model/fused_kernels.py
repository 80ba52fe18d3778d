"""Fused attention kernels told the packed rows' sentences in a packed form, not as a mask.

`jax.nn.dot_product_attention` (JAX 0.10, and 0.11) takes padding as sequence lengths and
causality as a flag, but no segment ids: a packed row's same-sentence mask can only reach
its cuDNN kernel as a dense [batch, 1, q, k] array, which JAX turns into an additive bias
that the kernel reads in full (and whose gradient it is asked for). Two kernels take the
sentences of a row directly:

  "cudnn_packed": cuDNN flash attention in its packed ("ragged") layout, reached through
    `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention` (not public API; JAX's
    own test of it is `test_sdpa_packed_layout`): per row, each sentence's length
    (q_seqlen/kv_seqlen, [batch, M]) and first token (q_offsets/kv_offsets, [batch, M + 1]),
    -1 where a row has fewer than M sentences. Every attention of a packed training row
    runs on it: encoder self-attention, causal decoder self-attention and cross-attention
    (sentence m of the targets attends to sentence m of the sources). Needs a Hopper GPU
    (compute capability 9.0) or newer, cuDNN 9.6 or newer, bfloat16 or float16.
  "pallas": JAX's Pallas flash attention for GPUs (Triton),
    `jax.experimental.pallas.ops.gpu.attention.mha`, which takes one segment-id array for
    the queries and keys alike: the two self-attentions only (cross-attention stays on the
    default path). Off a GPU it runs only in Pallas' interpreter, which the tests use.

What cuDNN leaves at padding is undefined: JAX's own packed-layout test multiplies the
outputs and the gradients by the padding mask before comparing. The adapter therefore zeroes
padded queries, keys and values going in (so whatever the kernel writes into their
gradients is dropped by `where`'s transpose) and padded outputs coming out.

Where a kernel cannot run (`platform_problem`), training refuses before its first trace
(`require`, one `error:` line), and inference on a checkpoint that names it runs "auto",
the same attention from the same parameters (model/setup.py's `runnable_here`): a model
trained on a Hopper GPU translates on a CPU.

The rest of attention (masks, projections, the decode cache) is model/attention.py's; this
module adapts the kernels and says where they can run.
"""

from __future__ import annotations

import functools
import inspect
import math

import jax
import jax.numpy as jnp

from transformer_mt.runtime import errors

# The model.attention_implementation values this module serves.
FUSED_IMPLEMENTATIONS = ("cudnn_packed", "pallas")

# Whether "auto" stands for "cudnn_packed" on a GPU that can run it (bfloat16/float16
# compute, Hopper or newer, cuDNN >= 9.6). False until a device run of
# benchmarks/accelerator.py has shown it faster than XLA's attention with the same loss
# (its "packed attention" lines): no GPU has run this kernel from this code yet.
AUTO_PICKS_CUDNN_PACKED_ON_GPU = False

# cuDNN's packed layout: JAX refuses it below Hopper, and its own test asks for cuDNN 9.6.
PACKED_MIN_COMPUTE_CAPABILITY = (9, 0)
PACKED_MIN_CUDNN_VERSION = 90600

# Off a GPU "pallas" runs in Pallas' interpreter only when this is True (the tests set it):
# the interpreter is far too slow to train with, so a run asking for it on a CPU is refused.
INTERPRET_PALLAS_OFF_GPU = False

# Triton blocks are powers of two of at least 16 tokens; JAX's defaults are 128 for the
# forward kernel and 32 for the backward ones.
_PALLAS_BLOCK, _PALLAS_BACKWARD_BLOCK, _PALLAS_MIN_BLOCK = 128, 32, 16


def resolve(implementation: str, dtype) -> str:
  """The implementation `implementation` stands for at compute dtype `dtype`: itself,
  except "auto", which is "cudnn_packed" on a GPU that runs it once
  AUTO_PICKS_CUDNN_PACKED_ON_GPU is set, and JAX's own choice (XLA) otherwise."""
  if implementation != "auto" or not AUTO_PICKS_CUDNN_PACKED_ON_GPU:
    return implementation
  if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and cudnn_packed_problem() is None:
    return "cudnn_packed"
  return "auto"


@functools.cache
def cudnn_packed_problem() -> str | None:
  """Why cuDNN's packed layout cannot run in this process (None: it can)."""
  problem = cudnn_problem()
  if problem is not None:
    return problem
  from jax._src.cudnn import fused_attention_stablehlo as cudnn

  if "q_offsets" not in inspect.signature(cudnn.dot_product_attention).parameters:
    return f"needs cuDNN's packed layout (q_offsets), which JAX {jax.__version__} does not pass"
  version = cudnn.check_cudnn_version()
  if version < PACKED_MIN_CUDNN_VERSION:
    return f"needs cuDNN >= {PACKED_MIN_CUDNN_VERSION}, found {version}"
  capability = getattr(jax.devices()[0], "compute_capability", "0.0")
  if tuple(int(x) for x in capability.split(".")[:2]) < PACKED_MIN_COMPUTE_CAPABILITY:
    return (
      f"needs a Hopper GPU or newer (compute capability 9.0; this one has {capability}): "
      "use 'cudnn' or 'pallas'"
    )
  return None


@functools.cache
def cudnn_problem() -> str | None:
  """Why JAX's cuDNN attention cannot run in this process (None: it can)."""
  backend = jax.default_backend()
  if backend != "gpu":
    return f"needs an NVIDIA GPU with cuDNN, and this process runs on {backend}"
  try:
    from jax._src.cudnn import fused_attention_stablehlo as cudnn
  except ImportError:
    return f"needs jax._src.cudnn.fused_attention_stablehlo, which JAX {jax.__version__} lacks"
  try:
    cudnn.check_cudnn_version()
  except RuntimeError as error:  # "cuDNN is not detected." (a ROCm GPU, say)
    return f"needs cuDNN: {error}"
  return None


def platform_problem(implementation: str) -> str | None:
  """Why the kernel `implementation` names cannot run in this process; None where it can, or
  where it names none ("auto", "xla"). "pallas" runs off a GPU only interpreted, and only
  when INTERPRET_PALLAS_OFF_GPU is set."""
  if implementation == "cudnn":
    return cudnn_problem()
  if implementation == "cudnn_packed":
    return cudnn_packed_problem()
  backend = jax.default_backend()
  if implementation == "pallas" and backend != "gpu" and not INTERPRET_PALLAS_OFF_GPU:
    return (
      f"runs Triton kernels on an NVIDIA GPU, and this process runs on {backend}: use 'auto' here"
    )
  return None


def require(implementation: str) -> None:
  """Refuses (one `error:` line) a kernel that cannot run in this process."""
  problem = platform_problem(implementation)
  if problem is not None:
    raise errors.BadValue(f"model.attention_implementation={implementation!r} {problem}")


def pallas_interpret() -> bool:
  """Whether "pallas" runs interpreted here; refuses (one `error:` line) off a GPU unless
  INTERPRET_PALLAS_OFF_GPU is set."""
  require("pallas")
  return jax.default_backend() != "gpu"


def attention_dropout_note(implementation: str, attention_dropout_rate: float) -> str | None:
  """What training runs instead of the kernel `implementation` asks for when attention
  dropout needs the probabilities as an array (attention.py's `_needs_weights`); None when
  nothing is skipped. Evaluation and decoding, deterministic, still use the kernel."""
  if attention_dropout_rate <= 0 or implementation in ("auto", "xla"):
    return None
  return (
    f"model.attention_dropout_rate={attention_dropout_rate:g} keeps training's attention off "
    f"model.attention_implementation={implementation!r}: it applies dropout to the "
    "probabilities, which the kernel never stores, so it runs the softmax spelled out "
    "(evaluation and decoding still use the kernel); set it to 0 to train on the kernel"
  )


def max_segments(length: int) -> int:
  """The most sentences a packed row of `length` tokens holds, a static bound for the
  packed layout: ceil(length / 2), since every side of a packed pair has at least 2 tokens
  (input_pipeline.KeepPair drops a side that is EOS alone). At least 2: JAX takes one
  segment per row (offsets [batch, 2]) as no packing at all. M costs memory: JAX keeps
  cuDNN's float32 softmax statistics as [batch * M, heads, q] per attention for the
  backward pass (Base's 96 x 256 rows, M = 128: 100 MB each, 1.8 GB for 18 attentions,
  against 201 MB each for XLA's float32 probabilities)."""
  return max(2, -(-length // 2))


def packed_layout(segments: jax.Array, num_segments: int) -> tuple[jax.Array, jax.Array]:
  """A packed row's sentences as cuDNN's packed layout describes them.

  Args:
    segments: int [batch, length], the sentence (1, 2, ...) of each token, each sentence
      one contiguous run, 0 at padding.
    num_segments: M, the static number of sentence slots per row; sentence m goes in slot
      m - 1, so the slots of a source row and of its target row pair the same sentences.

  Returns:
    seqlens: int32 [batch, M], the tokens of each sentence, -1 for a sentence the row lacks.
    offsets: int32 [batch, M + 1], each sentence's first token in its row, -1 where it is
      missing and in the last column (JAX's layout: M + 1 columns, -1 filled).
  """
  ids = jnp.arange(1, num_segments + 1, dtype=segments.dtype)
  member = segments[:, :, None] == ids  # [batch, length, M]
  lengths = jnp.sum(member, axis=1, dtype=jnp.int32)  # [batch, M]
  starts = jnp.argmax(member, axis=1).astype(jnp.int32)  # [batch, M], 0 where absent
  present = lengths > 0
  seqlens = jnp.where(present, lengths, -1)
  offsets = jnp.where(present, starts, -1)
  return seqlens, jnp.pad(offsets, ((0, 0), (0, 1)), constant_values=-1)


def _zero_padding(x: jax.Array, valid: jax.Array) -> jax.Array:
  """x [batch, len, heads, head_dim] with the rows of padded tokens (valid False) zeroed."""
  return jnp.where(valid[:, :, None, None], x, jnp.zeros((), x.dtype))


def _cudnn_dot_product_attention(*args, **kwargs):
  """The cuDNN call itself (a seam: the tests put a transcription of its documented
  semantics here, since no CPU runs cuDNN)."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn

  kwargs["mask_type"] = getattr(cudnn.MaskType, kwargs["mask_type"])
  return cudnn.dot_product_attention(*args, **kwargs)


def cudnn_packed_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  query_segments: jax.Array,
  key_segments: jax.Array,
  causal: bool,
) -> jax.Array:
  """Attention over packed rows in cuDNN's packed layout.

  Args:
    query: [batch, q, heads, head_dim]; key, value: [batch, k, heads, head_dim].
    query_segments, key_segments: int [batch, q] / [batch, k], 0 at padding. A token is
      padding here by its segment alone: a model whose decoder starts with PAD (Marian)
      counts every position 0 as valid, padding included, and cuDNN leaves all of them
      undefined.
    causal: query i sees keys <= i of its own sentence (self-attention only, where query
      and key sentences start at the same token).

  Returns:
    [batch, q, heads, head_dim]; zeros at padded queries. All NaN if a row holds more
    sentences than `max_segments` allows, or a query sentence without its key sentence:
    impossible for the input pipeline's rows, and a loud failure (the step's non-finite
    check) rather than training on silently dropped sentences.
  """
  slots = max(max_segments(query.shape[1]), max_segments(key.shape[1]))
  q_seqlen, q_offsets = packed_layout(query_segments, slots)
  kv_seqlen, kv_offsets = packed_layout(key_segments, slots)
  query_real, key_real = query_segments > 0, key_segments > 0  # [batch, q] / [batch, k]
  context = _cudnn_dot_product_attention(
    _zero_padding(query, query_real),
    _zero_padding(key, key_real),
    _zero_padding(value, key_real),
    q_seqlen=q_seqlen,
    kv_seqlen=kv_seqlen,
    q_offsets=q_offsets,
    kv_offsets=kv_offsets,
    scale=1.0 / math.sqrt(query.shape[-1]),
    mask_type="PADDING_CAUSAL" if causal else "PADDING",
    qkv_layout="BTNH",
  )
  context = _zero_padding(context, query_real)
  fits = (jnp.max(query_segments) <= slots) & (jnp.max(key_segments) <= slots)
  fits &= jnp.all((q_seqlen > 0) == (kv_seqlen > 0))
  return jnp.where(fits, context, jnp.asarray(jnp.nan, context.dtype))


def pallas_blocks(length: int) -> tuple[int, int] | None:
  """(forward, backward) Triton blocks for self-attention over rows of `length` tokens, or
  None if no block of at least 16 tokens divides `length`.

  Forward: the largest power of two of at most 128 tokens dividing `length`. Backward: JAX's
  32 (its kernels hold a query block and a key block at once), or the forward block where
  that is smaller. It must divide `length` as well: the backward kernel tiles the gradient
  of queries and of keys with the same grid, and JAX checks only that both sides have as
  many blocks, not that the blocks cover the row."""
  block = _PALLAS_BLOCK
  while block >= _PALLAS_MIN_BLOCK and length % block:
    block //= 2
  if block < _PALLAS_MIN_BLOCK:
    return None
  return block, min(_PALLAS_BACKWARD_BLOCK, block)


def pallas_self_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  valid: jax.Array,
  segments: jax.Array | None,
  causal: bool,
  interpret: bool,
) -> jax.Array | None:
  """Self-attention through Pallas' GPU flash attention with segment ids.

  Args:
    query, key, value: [batch, len, heads, head_dim], the same positions.
    valid: bool [batch, len]; segments: int [batch, len] (0 at padding) or None for
      unpacked rows, which become one segment of their valid tokens.

  Returns:
    [batch, len, heads, head_dim], or None when `len` fits no Triton block (not a multiple
    of 16): the caller then takes the default path. Padded queries attend to the padded
    keys at or before them (segment 0), a finite value nothing reads.
  """
  blocks = pallas_blocks(query.shape[1])
  if blocks is None:
    return None
  from jax.experimental.pallas.ops.gpu import attention as pallas_attention

  block, backward = blocks
  sizes = pallas_attention.BlockSizes(
    block_q=block,
    block_k=block,
    block_q_dkv=backward,
    block_kv_dkv=backward,
    block_q_dq=backward,
    block_kv_dq=backward,
  )
  segments = valid.astype(jnp.int32) if segments is None else segments.astype(jnp.int32)
  return pallas_attention.mha(
    query,
    key,
    value,
    segments,
    sm_scale=1.0 / math.sqrt(query.shape[-1]),
    causal=causal,
    block_sizes=sizes,
    interpret=interpret,
  )

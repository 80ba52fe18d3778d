"""The PyTorch reference of issue 42: the paper's Base and Big train step in PyTorch's strongest
standard setup, on the very batches benchmarks/accelerator.py times ours on.

    python benchmarks/torch_reference.py                 # Base and Big, on the first CUDA GPU
    python benchmarks/torch_reference.py --tiny          # toy sizes on the CPU (tests, CI)
    python benchmarks/torch_reference.py --sizes Big --no-compile

The model is ours in PyTorch: post-LN encoder-decoder, ReLU FFN, biases, sinusoidal positions,
embeddings scaled by sqrt(d_model) and tied three ways (source, target, pre-softmax), dropout 0.1
on embeddings and sub-layer outputs, none on attention, no key bias. It starts from our
`Transformer`'s initial parameters (`torch_state`: every one of ours, under its name here), and
before timing each size prints the float32 loss of both models on the same rows with dropout
off: equal within SAME_LOSS_TOLERANCE, or the exit status says they are not the same model
(tests/test_torch_reference.py checks it at the toy size). The step: bf16 autocast (float32
parameters, Adam and loss, as ours), `F.scaled_dot_product_attention` (flash on a GPU: no mask
tensor, `is_causal` for the decoder), label-smoothed cross-entropy (eps 0.1 spread over the whole
vocabulary, as ours), `torch.optim.Adam(fused=True)` (betas 0.9/0.98, eps 1e-9), the model under
`torch.compile` (default mode; `--no-compile` without). Batches: benchmarks/harness/steps.py's
`full_rows_batch`, seed 0, at its SIZES, accelerator.py's (one pair filling each row of 256,
so no padding and no mask). Printed per size: best and median step time of --reps steps after
3 warm-ups (the first compiles), target tokens/s, useful TFLOP/s and MFU with FLOPs counted by
our `useful_flops` (the same count as accelerator.py's lines, so the two lines' ratio is the
ratio of tokens/s), and torch's peak memory.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import time

# JAX is imported only to count FLOPs (parameter shapes): it must not take the GPU's memory.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flax import linen  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.harness.steps import (  # noqa: E402
  SIZES,
  TINY,
  full_rows_batch,
  model_config,
  peak_of,
  useful_flops,
)
from transformer_mt.model.transformer import Transformer  # noqa: E402
from transformer_mt.training import losses  # noqa: E402

DROPOUT, LABEL_SMOOTHING, LN_EPS = 0.1, 0.1, 1e-6
# |loss_torch / loss_ours - 1| allowed on the same parameters and rows, both in float32 with
# dropout off: the two differ only in the order of float32 sums (2^-24 relative per rounding,
# a few hundred of them along a row of a 37k-vocabulary logsumexp).
SAME_LOSS_TOLERANCE = 1e-5
# Rows of the size's batch the loss is compared on: JAX runs on the CPU in this process.
CHECK_ROWS = 2


def sinusoids(length: int, d_model: int) -> torch.Tensor:
  """[length, d_model], sin and cos interleaved (our "sinusoidal")."""
  position = torch.arange(length, dtype=torch.float32)[:, None]
  rate = torch.exp(
    torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
  )
  table = torch.zeros(length, d_model)
  table[:, 0::2] = torch.sin(position * rate)
  table[:, 1::2] = torch.cos(position * rate)
  return table


class Attention(nn.Module):
  def __init__(self, d_model, heads):
    super().__init__()
    self.heads = heads
    self.q, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(3))
    # No key bias, as ours: q . b adds the same to every logit of a query, so softmax drops it.
    self.k = nn.Linear(d_model, d_model, bias=False)

  def forward(self, x, memory, causal):
    # x [b, q, d], memory [b, k, d] -> [b, q, d]
    b = x.shape[0]

    def split(t):  # [b, n, d] -> [b, heads, n, d / heads]
      return t.view(b, t.shape[1], self.heads, -1).transpose(1, 2)

    out = F.scaled_dot_product_attention(
      split(self.q(x)), split(self.k(memory)), split(self.v(memory)), is_causal=causal
    )
    return self.o(out.transpose(1, 2).reshape(x.shape))


class Layer(nn.Module):
  """Post-LN: x = LN(x + dropout(sublayer(x))) for self-attention, [cross-attention,] FFN."""

  def __init__(self, d_model, d_ff, heads, cross):
    super().__init__()
    self.self_attention = Attention(d_model, heads)
    self.cross_attention = Attention(d_model, heads) if cross else None
    self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
    self.norms = nn.ModuleList(nn.LayerNorm(d_model, eps=LN_EPS) for _ in range(2 + cross))
    self.dropout = nn.Dropout(DROPOUT)

  def forward(self, x, memory=None):
    x = self.norms[0](x + self.dropout(self.self_attention(x, x, causal=memory is not None)))
    if self.cross_attention is not None:
      x = self.norms[1](x + self.dropout(self.cross_attention(x, memory, causal=False)))
    return self.norms[-1](x + self.dropout(self.ffn(x)))


class TransformerReference(nn.Module):
  def __init__(self, d_model, d_ff, heads, layers, vocab, max_len):
    super().__init__()
    self.embedding = nn.Embedding(vocab, d_model)
    nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
    self.register_buffer("positions", sinusoids(max_len, d_model), persistent=False)
    self.encoder = nn.ModuleList(Layer(d_model, d_ff, heads, False) for _ in range(layers))
    self.decoder = nn.ModuleList(Layer(d_model, d_ff, heads, True) for _ in range(layers))
    self.dropout = nn.Dropout(DROPOUT)
    self.scale = d_model**0.5

  def embed(self, tokens):  # [b, n] -> [b, n, d]
    x = self.embedding(tokens) * self.scale + self.positions[: tokens.shape[1]]
    return self.dropout(x)

  def forward(self, inputs, targets_in):  # [b, s], [b, t] -> logits [b, t, vocab]
    memory = self.embed(inputs)
    for layer in self.encoder:
      memory = layer(memory)
    x = self.embed(targets_in)
    for layer in self.decoder:
      x = layer(x, memory)
    return x @ self.embedding.weight.T  # tied pre-softmax projection


def our_initial_params(size, seed: int = 0) -> dict:
  """Our `Transformer`'s initial parameters for a SIZES / TINY tuple (float32, on the CPU)."""
  config = model_config(size, "float32")
  dummy = jax.numpy.ones((1, 2), jax.numpy.int32)
  init = jax.jit(Transformer(config).init)  # one program, not hundreds of dispatched ops
  return linen.unbox(init(jax.random.key(seed), dummy, dummy)["params"])


def torch_state(params: dict, layers: int) -> dict[str, torch.Tensor]:
  """Our parameters (a flax tree) as TransformerReference's state dict: projection kernels
  [d_model, heads, head_dim] become nn.Linear weights [heads * head_dim, d_model] (heads
  major, as `Attention.forward` splits them), LayerNorm scale its weight.

  Raises:
    ValueError: one of our parameters has no place here (it would be silently dropped).
  """
  used = set()

  def take(*path) -> torch.Tensor:
    tree = params
    for key in path:
      tree = tree[key]
    used.add(path)
    return torch.from_numpy(np.array(tree, np.float32))

  state = {"embedding.weight": take("source_embedder", "embedding", "embedding")}

  def attention(theirs, *ours):
    for name, short in (("query", "q"), ("key", "k"), ("value", "v")):
      kernel = take(*ours, name, "kernel")
      state[f"{theirs}.{short}.weight"] = kernel.reshape(kernel.shape[0], -1).T
      if name != "key":  # no key bias, on either side
        state[f"{theirs}.{short}.bias"] = take(*ours, name, "bias").reshape(-1)
    kernel = take(*ours, "out", "kernel")  # [heads, head_dim, d_model]
    state[f"{theirs}.o.weight"] = kernel.reshape(-1, kernel.shape[-1]).T
    state[f"{theirs}.o.bias"] = take(*ours, "out", "bias")

  def layer(theirs, ours, attentions, blocks):
    for name in attentions:
      attention(f"{theirs}.{name}", ours, name)
    for index, block in enumerate(blocks):
      state[f"{theirs}.norms.{index}.weight"] = take(ours, block, "norm", "scale")
      state[f"{theirs}.norms.{index}.bias"] = take(ours, block, "norm", "bias")
    for index, name in ((0, "wi"), (2, "wo")):
      state[f"{theirs}.ffn.{index}.weight"] = take(ours, "ffn", name, "kernel").T
      state[f"{theirs}.ffn.{index}.bias"] = take(ours, "ffn", name, "bias")

  for i in range(layers):
    layer(
      f"encoder.{i}", f"encoder_layers_{i}", ("self_attention",), ("attention_block", "ffn_block")
    )
    layer(
      f"decoder.{i}",
      f"decoder_layers_{i}",
      ("self_attention", "cross_attention"),
      ("self_attention_block", "cross_attention_block", "ffn_block"),
    )
  leaves = {
    tuple(getattr(k, "key", k) for k in path)
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  }
  if leaves != used:
    raise ValueError(f"our parameters without a place in the reference: {sorted(leaves - used)}")
  return state


def reference_with_our_params(size, params: dict) -> TransformerReference:
  """TransformerReference of a size, on the CPU, holding `params` (ours) exactly."""
  d_model, d_ff, heads, layers, vocab, _, max_len = size
  model = TransformerReference(d_model, d_ff, heads, layers, vocab, max_len)
  # strict: every parameter of the reference set, no name left over.
  model.load_state_dict(torch_state(params, layers), strict=True)
  return model


def same_weights_losses(size, params: dict, model: nn.Module, rows: int) -> tuple[float, float]:
  """(our loss, the reference's) on the first `rows` rows of the size's batch (seed 0), both
  float32 with dropout off: label-smoothed cross-entropy per target token, as each trains."""
  numpy_batch = {k: v[0, :rows] for k, v in full_rows_batch(*size[5:7], size[4], seed=0).items()}
  config = model_config(size, "float32").replace(deterministic=True)
  logits = jax.jit(Transformer(config).apply)(
    {"params": params},
    numpy_batch["inputs"],
    numpy_batch["targets_in"],
    inputs_positions=numpy_batch["inputs_positions"],
    targets_positions=numpy_batch["targets_positions"],
    inputs_segmentation=numpy_batch["inputs_segment_ids"],
    targets_segmentation=numpy_batch["targets_segment_ids"],
  )
  weights = np.ones(numpy_batch["targets"].shape, np.float32)  # full rows: no padding
  sums = losses.cross_entropy_sums(logits, numpy_batch["targets"], weights, LABEL_SMOOTHING)
  ours = float(sums["loss"]) / float(sums["num_tokens"])
  batch = {k: torch.from_numpy(numpy_batch[k]).long() for k in ("inputs", "targets", "targets_in")}
  training = model.training
  model.eval()
  with torch.no_grad():
    theirs = float(loss_fn(model, batch))
  model.train(training)
  return ours, theirs


def loss_fn(model, batch):
  logits = model(batch["inputs"], batch["targets_in"])
  return F.cross_entropy(
    logits.float().flatten(0, 1), batch["targets"].flatten(), label_smoothing=LABEL_SMOOTHING
  )


def same_model_line(name, size, params, model, rows) -> tuple[str, bool]:
  """(the printed comparison of our loss with the reference's on our weights, whether they
  agree within SAME_LOSS_TOLERANCE)."""
  ours, theirs = same_weights_losses(size, params, model, rows)
  relative = abs(theirs / ours - 1)
  same = relative <= SAME_LOSS_TOLERANCE
  return (
    f"PyTorch {name} on our initial weights, float32, dropout off, {rows} x {size[6]} target "
    f"tokens: loss {theirs:.6f}, ours {ours:.6f}, relative difference {relative:.1e}, "
    f"{'within' if same else 'OUTSIDE'} the tolerance {SAME_LOSS_TOLERANCE:g}"
  ), same


def step_figures(name, size, device, reps, compile_model, peak, model) -> None:
  """Times one size's step, `model` (on the CPU) moved to `device`, and prints its line."""
  d_model, d_ff, heads, layers, vocab, rows, max_len = size
  torch.manual_seed(0)  # dropout's draws
  model = model.to(device)
  fused = device.type == "cuda"
  optimizer = torch.optim.Adam(
    model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=fused or None
  )
  forward = torch.compile(model) if compile_model else model
  numpy_batch = full_rows_batch(rows, max_len, vocab, seed=0)
  batch = {
    k: torch.from_numpy(numpy_batch[k][0]).long().to(device)
    for k in ("inputs", "targets", "targets_in")
  }

  def one_step():
    with torch.autocast(device.type, dtype=torch.bfloat16):
      loss = loss_fn(forward, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss

  def synchronize():
    if device.type == "cuda":
      torch.cuda.synchronize()

  start = time.perf_counter()
  for _ in range(3):
    loss = one_step().detach()
  synchronize()
  warmup_s = time.perf_counter() - start
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    loss = one_step().detach()
    synchronize()
    times.append(time.perf_counter() - start)
  best, median = min(times), float(np.median(times))
  lengths = np.full(rows, max_len)
  flops = useful_flops(model_config(size, "float32"), lengths, lengths)["total"]
  mfu = f"{flops / best / peak:.1%}" if peak else "n/a (no published peak)"
  memory = (
    f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.type == "cuda" else "n/a"
  )
  tokens = rows * max_len
  print(
    f"PyTorch {name} train step, bf16 autocast, SDPA, fused Adam, "
    f"{'torch.compile' if compile_model else 'eager'}, {rows} x {max_len} target tokens: "
    f"{best * 1e3:.1f} ms (median {median * 1e3:.1f}), {tokens / best:,.0f} tokens/s, "
    f"{flops / best / 1e12:.2f} TFLOP/s useful, MFU {mfu}, loss {loss.item():.4f}, "
    f"warm-up (3 steps, compiling) {warmup_s:.0f} s, torch peak memory {memory}",
    flush=True,
  )


def parameter_count(model: nn.Module) -> int:
  return sum(p.numel() for p in model.parameters())


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tiny", action="store_true", help="toy sizes on the CPU: tests and CI")
  parser.add_argument("--sizes", default="Base,Big", help="comma-separated: Base, Big")
  parser.add_argument("--reps", type=int, default=None, help="timed steps (default 10, tiny 2)")
  parser.add_argument("--no-compile", action="store_true", help="eager PyTorch, no torch.compile")
  args = parser.parse_args(argv)
  sizes = TINY if args.tiny else SIZES
  unknown = [name for name in args.sizes.split(",") if name not in sizes]
  if unknown:
    parser.error(f"--sizes: no size {', '.join(unknown)}; choose from {', '.join(sizes)}")
  device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
  kind = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
  peak = peak_of(kind) if device.type == "cuda" else None
  if device.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
  print(f"PyTorch {torch.__version__} on {kind}", flush=True)
  different = 0
  for name in args.sizes.split(","):
    params = our_initial_params(sizes[name])
    model = reference_with_our_params(sizes[name], params)
    line, same = same_model_line(name, sizes[name], params, model, min(CHECK_ROWS, sizes[name][5]))
    print(line, flush=True)
    different += not same
    del params  # the CPU copy: only the reference's is trained from here
    step_figures(
      name,
      sizes[name],
      device,
      args.reps or (2 if args.tiny else 10),
      not args.no_compile,
      peak,
      model,
    )
  return 1 if different else 0


if __name__ == "__main__":
  sys.exit(main())

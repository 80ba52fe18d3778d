"""The PyTorch reference of issue 42: the paper's Base and Big train step in PyTorch's strongest
standard setup, on the very batches benchmarks/accelerator.py times ours on.

    python benchmarks/torch_reference.py                 # Base and Big, on the first CUDA GPU
    python benchmarks/torch_reference.py --tiny          # toy sizes on the CPU (tests, CI)
    python benchmarks/torch_reference.py --sizes Big --no-compile

The model is ours in PyTorch: post-LN encoder-decoder, ReLU FFN, biases, sinusoidal positions,
embeddings scaled by sqrt(d_model) and tied three ways (source, target, pre-softmax), dropout 0.1
on embeddings and sub-layer outputs, none on attention, no key bias; the same parameter count as our
`Transformer` (tests/test_torch_reference.py checks it). The step: bf16 autocast (float32
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

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.harness.steps import (  # noqa: E402
  SIZES,
  TINY,
  full_rows_batch,
  model_config,
  peak_of,
  useful_flops,
)

DROPOUT, LABEL_SMOOTHING, LN_EPS = 0.1, 0.1, 1e-6


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


def loss_fn(model, batch):
  logits = model(batch["inputs"], batch["targets_in"])
  return F.cross_entropy(
    logits.float().flatten(0, 1), batch["targets"].flatten(), label_smoothing=LABEL_SMOOTHING
  )


def step_figures(name, size, device, reps, compile_model, peak) -> None:
  """Times one size's step and prints its line."""
  d_model, d_ff, heads, layers, vocab, rows, max_len = size
  torch.manual_seed(0)
  model = TransformerReference(d_model, d_ff, heads, layers, vocab, max_len).to(device)
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
  for name in args.sizes.split(","):
    step_figures(
      name, sizes[name], device, args.reps or (2 if args.tiny else 10), not args.no_compile, peak
    )


if __name__ == "__main__":
  main()

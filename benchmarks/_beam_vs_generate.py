"""Issue 42's decoding anchor, the `generate` section of benchmarks/accelerator.py: our beam 4
against transformers' `generate` on the same GPU, the same weights and the same sources.

The model is benchmarks/_decode_regime.py's random Marian (N(0, 1) weights, swish, tied and
scaled embeddings, final logits bias) at the Base shape: 6 + 6 layers, d_model 512, d_ff 2048,
8 heads, vocabulary 32000. `sentences` sources of 32 random tokens, beam 4, exactly 64 generated
tokens on both sides (EOS outside the vocabulary: nothing ends early, so both do the same work).
On a GPU both sides compute in bfloat16 (ours `model.dtype="bfloat16"`: float32 parameters,
LayerNorm, softmax and logits; transformers' model cast to bfloat16 as a whole, its usual GPU
setup), on a CPU in float32; the --tiny CI run at 2 + 2 layers and toy widths (TINY_MARIAN).
Both are timed after a warm-up, best of `reps`, the GPU synchronized before the clock is
read. Printed: sentences/s, target tokens/s (sentences x 64), the ratio, and how many sentences
got the same best hypothesis on both sides (bf16 rounding differs between the two, so fewer
than on a CPU; on the H200, 65% of 256).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from benchmarks import _decode_regime

# The --tiny CI run's model: 2 + 2 layers at toy widths (the program, not the figures).
TINY_MARIAN = dict(
  d_model=64,
  encoder_ffn_dim=128,
  decoder_ffn_dim=128,
  encoder_attention_heads=4,
  decoder_attention_heads=4,
  vocab_size=1000,
  decoder_vocab_size=1000,
  pad_token_id=999,
  decoder_start_token_id=999,
)


def comparison_lines(sentences: int, reps: int, tiny: bool) -> list[str]:
  on_gpu = jax.default_backend() == "gpu"
  layers = 2 if tiny else 6
  model, config, params = _decode_regime.build_model(
    encoder_layers=layers, decoder_layers=layers, **(TINY_MARIAN if tiny else {})
  )
  config = config.replace(dtype="bfloat16" if on_gpu else "float32")
  sources = _decode_regime.random_sources(config, sentences=sentences)
  outputs, ours = _decode_regime.time_ours(params, config, sources, reps)
  new = _decode_regime.NEW_TOKENS
  shape = (
    f"random Marian {layers}+{layers} layers, d_model {config.d_model}, vocab "
    f"{config.vocab_size}, {config.dtype}; {sentences} sentences x "
    f"{_decode_regime.SOURCE_TOKENS} source tokens, beam {_decode_regime.BEAM}, exactly {new} out"
  )
  lines = [
    f"beam-4 vs generate ({shape}): ours {sentences / ours.best:,.1f} sentences/s, "
    f"{sentences * new / ours.best:,.0f} target tokens/s ({ours.best:.3f} s)"
  ]
  if model is None:
    return lines + ["transformers generate: not measured (transformers/torch not importable)"]
  sequences, seconds = time_generate(model, config, sources, reps, on_gpu)
  same = float(np.mean(np.all(sequences == np.asarray(outputs.sequences), axis=1)))
  lines.append(
    f"transformers generate: {sentences / seconds:,.1f} sentences/s, "
    f"{sentences * new / seconds:,.0f} target tokens/s ({seconds:.3f} s); "
    f"ours / generate {seconds / ours.best:.2f}x; same best hypothesis for {same:.0%} of sentences"
  )
  return lines


def time_generate(model, config, sources, reps, on_gpu) -> tuple[np.ndarray, float]:
  """(sequences [sentences, NEW_TOKENS], best seconds) of transformers' beam search."""
  import torch

  device = torch.device("cuda" if on_gpu else "cpu")
  model = model.to(device, torch.bfloat16 if on_gpu else torch.float32)
  settings = _decode_regime.generate_settings(config)
  inputs = torch.tensor(sources, dtype=torch.long, device=device)
  mask = torch.ones_like(inputs)
  best = np.inf
  with torch.inference_mode():
    for rep in range(reps + 1):  # the first is the warm-up
      start = time.perf_counter()
      sequences = model.generate(input_ids=inputs, attention_mask=mask, **settings)
      if on_gpu:
        torch.cuda.synchronize()
      if rep:
        best = min(best, time.perf_counter() - start)
  return sequences.cpu().numpy()[:, 1:], best

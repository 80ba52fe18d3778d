"""The models the decoding benchmarks run, at random initialization, and our beam search
against transformers' `generate` on the same weights.

`random_model`: a model of an experiment's shape with a SentencePiece vocabulary of its size
trained on its training text: what benchmarks decode when the speed, not the translation, is
measured (a random model emits no EOS, so every sentence runs to its limit).

The `generate` regime (`python benchmarks/decode.py --regime issue`, and accelerator.py's
"generate" section through `comparison_lines`): one random Marian model (2+2 layers, d_model
512, d_ff 2048, 8 heads, vocabulary 32000; swish, scaled and tied embeddings, final logits
bias) runs on both sides: built as a transformers MarianMTModel and converted with
`hf_convert`, or, without transformers, as the same `TransformerConfig` with our own random
init (and then no reference is timed). 32 sentences of 32 random source tokens, beam 4, exactly
64 generated tokens on both sides: the EOS id is set outside the vocabulary, so no hypothesis
ends before the maximum length, and both sides mask PAD (ours always does; `generate` gets it
as `suppress_tokens`). Ours reorders its cache as users' decoding does on the device
(decode.cache_reorder "auto": "gather" on a GPU or TPU).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from benchmarks.harness import timing
from transformer_mt.config import defaults
from transformer_mt.data import sources as data_sources
from transformer_mt.data.tokenizer import Tokenizer, train_tokenizer
from transformer_mt.decoding import beam_decode, beam_rows
from transformer_mt.interop import hf_convert
from transformer_mt.model import setup as run_setup
from transformer_mt.model.transformer import Transformer

# The scripts' --tiny model: every experiment shrunk to toy widths, one layer a side, seconds on a
# CPU (decode.py, memory.py, ctranslate2_decode.py).
TINY_MODEL = (
  "model.d_model=32",
  "model.d_ff=64",
  "model.num_heads=2",
  "model.num_encoder_layers=1",
  "model.num_decoder_layers=1",
  "tokenizer.vocab_size=256",
)

# Sentences a random model's vocabulary is trained on (~10 s on 2 cores).
VOCABULARY_SAMPLE = 20_000


def random_model(
  config: ml_collections.ConfigDict, mesh, vocabulary_sample: int = VOCABULARY_SAMPLE
) -> tuple[run_setup.ModelSetup, dict, Tokenizer]:
  """(the model setup on `mesh`, parameters at seed 0, the tokenizer) for `config`, whose
  data section names the training text."""
  pairs = data_sources.load_pairs(config.data)["train"]
  tokenizer = train_tokenizer(
    pairs, config.tokenizer.vocab_size, config.tokenizer.model_type, sample_size=vocabulary_sample
  )
  setup = run_setup.model_setup(config, tokenizer, mesh)
  dummy = jnp.ones((1, 2), jnp.int32)
  params = nn.unbox(setup.model.init(jax.random.key(0), dummy, dummy)["params"])
  return setup, params, tokenizer


SENTENCES, SOURCE_TOKENS, BEAM, NEW_TOKENS = 32, 32, 4, 64
MARIAN = dict(
  model_type="marian",
  vocab_size=32000,
  decoder_vocab_size=32000,
  d_model=512,
  encoder_layers=2,
  decoder_layers=2,
  encoder_attention_heads=8,
  decoder_attention_heads=8,
  encoder_ffn_dim=2048,
  decoder_ffn_dim=2048,
  max_position_embeddings=512,
  pad_token_id=31999,
  eos_token_id=0,
  decoder_start_token_id=31999,
  activation_function="swish",
  scale_embedding=True,
  dropout=0.0,
)
# Token ids generation never produces: EOS set to it means no hypothesis ends before NEW_TOKENS.
NO_EOS = MARIAN["vocab_size"]


def build_model(seed: int = 0, **marian_changes):
  """(transformers model or None, our config, our params): the same random weights on both
  sides when transformers and torch are importable; `marian_changes` override MARIAN (the
  accelerator's Base shape: 6 + 6 layers). Weights are N(0, 1) (sinusoidal position
  tables aside), as in tests/test_hf_models.py, so that the next-token distributions are
  peaked and both sides pick the same beams."""
  marian = {**MARIAN, **marian_changes}
  try:
    import torch
    import transformers
  except ImportError:
    config = hf_convert.config_from_hf(marian).replace(deterministic=True)
    dummy = jnp.ones((1, 2), jnp.int32)
    params = Transformer(config).init(jax.random.key(seed), dummy, dummy)["params"]
    return None, config, nn.unbox(params)
  hf_config = transformers.MarianConfig(**{k: v for k, v in marian.items() if k != "model_type"})
  torch.manual_seed(seed)
  model = transformers.MarianMTModel(hf_config).eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      if "embed_positions" not in name:
        parameter.copy_(torch.randn_like(parameter))
  with tempfile.TemporaryDirectory() as directory:
    model.save_pretrained(directory)
    config, params = hf_convert.load_pretrained(directory)
  return model, config.replace(deterministic=True), params


def random_sources(config, seed: int = 0, sentences: int = SENTENCES) -> np.ndarray:
  """int32 [sentences, SOURCE_TOKENS]: ordinary tokens, EOS last, no padding."""
  rng = np.random.default_rng(seed)
  sources = rng.integers(1, config.vocab_size - 1, (sentences, SOURCE_TOKENS))
  sources[:, -1] = config.eos_id
  return sources.astype(np.int32)


def flops_per_sentence(config) -> tuple[float, str]:
  """(FLOPs, the formula): the matmuls one sentence needs, 2 FLOPs per multiply-add.

  Decoder, per generated token t (1..T) and beam: self-attention Q, K, V, O projections
  (4 d^2), cross-attention Q, O (2 d^2; its K, V are the encoder's), FFN (2 d d_ff) per
  layer, attention scores and weighted values over t target and S source positions
  (2 d (t + S)) per layer, and the vocabulary projection (d V). Encoder, once per sentence,
  per source token: self-attention (4 d^2 + 2 d S) and FFN (2 d d_ff) per encoder layer, and
  the cross-attention K, V projections (2 d^2) per decoder layer.
  """
  d, f, v = config.d_model, config.d_ff, config.vocab_size
  s, t, k = SOURCE_TOKENS, NEW_TOKENS, BEAM
  ld, le = config.num_decoder_layers, config.num_encoder_layers
  # sum over t = 1..T of (t + S) = T (T + 1) / 2 + T S
  decoder = k * (
    t * (ld * (6 * d * d + 2 * d * f) + d * v) + ld * 2 * d * (t * (t + 1) / 2 + t * s)
  )
  encoder = s * (le * (4 * d * d + 2 * d * s + 2 * d * f) + ld * 2 * d * d)
  formula = (
    f"2 * [beam {k} * (T {t} * (Ld {ld} * (6 d^2 + 2 d d_ff) + d V) + Ld * 2 d (T(T+1)/2 + T S)) "
    f"+ S {s} * (Le {le} * (4 d^2 + 2 d S + 2 d d_ff) + Ld * 2 d^2)], d {d}, d_ff {f}, V {v}"
  )
  return 2.0 * (decoder + encoder), formula


def time_ours(params, config, sources, reps):
  """(outputs, Timing) of beam_decode with transformers' scoring, after compiling."""
  inputs = jnp.asarray(sources)
  settings = dict(
    config=config.replace(eos_id=NO_EOS),
    beam_size=BEAM,
    max_len=NEW_TOKENS,
    alpha=1.0,
    length_penalty="power",
    candidate_pool="hf",
    # No sentence ends before NEW_TOKENS (EOS is outside the vocabulary): a shrinking batch
    # would only compile stages that never run.
    shrink_batch=False,
    # The reorder users get: decode.cache_reorder's default ("auto") for this device and batch
    # ("gather" on a GPU or TPU), as the Translator resolves it.
    cache_reorder=beam_rows.resolve_cache_reorder(
      defaults.base_config().decode.cache_reorder, batch_size=len(sources)
    ),
  )
  compiled = beam_decode.beam_decode.lower(params, inputs, **settings).compile()
  outputs = []

  def call():
    outputs[:] = [compiled(params, inputs)]
    return outputs[0]

  measured = timing.time_calls(call, warmup=1, reps=reps)
  return outputs[0], measured


def generate_settings(config) -> dict:
  """transformers' `generate` arguments for this regime: beam BEAM, exactly NEW_TOKENS new
  tokens (EOS set outside the vocabulary), transformers' length penalty 1.0, PAD suppressed
  as ours never emits it."""
  return dict(
    num_beams=BEAM,
    max_new_tokens=NEW_TOKENS,
    early_stopping="never",
    do_sample=False,
    length_penalty=1.0,
    use_cache=True,
    eos_token_id=NO_EOS,
    forced_eos_token_id=None,  # MarianConfig's default would force EOS as the last token
    suppress_tokens=list(config.suppressed_ids),
  )


def time_generate(model, config, sources, reps, one_thread=False):
  """(sequences [SENTENCES, NEW_TOKENS], {torch threads: (best seconds, CPU seconds)}) of
  transformers' beam search, after one small warm-up call per thread count.

  Timed with torch on every core this process may use and on one: on a machine shared with
  other processes, torch's threads wait for each other at every op and one thread was
  several times faster (0.7 against 3.6 sentences/s at a load average of 7 on 2 cores).
  The faster one is the reference. `one_thread`: on one thread only (--tiny: the same loop,
  without the thread count whose waiting costs the most CPU time on a busy machine).
  """
  import torch

  settings = generate_settings(config)
  inputs = torch.tensor(sources, dtype=torch.long)
  mask = torch.ones_like(inputs)
  timings = {}
  counts = {1} if one_thread else {len(os.sched_getaffinity(0)), 1}
  with torch.inference_mode():
    for threads in sorted(counts, reverse=True):
      with torch_threads(threads):
        model.generate(
          input_ids=inputs[:2], attention_mask=mask[:2], **dict(settings, max_new_tokens=4)
        )
        best = cpu = np.inf
        for _ in range(reps):
          start, cpu_start = time.perf_counter(), timing.cpu_seconds()
          sequences = model.generate(input_ids=inputs, attention_mask=mask, **settings)
          best = min(best, time.perf_counter() - start)
          cpu = min(cpu, timing.cpu_seconds() - cpu_start)
      timings[threads] = (best, cpu)
  return sequences.numpy()[:, 1:], timings  # without the decoder start token


@contextlib.contextmanager
def torch_threads(count: int | None):
  """torch's intra-op threads set to `count` inside the block (None: left as they are), and
  set back after it: the setting is the whole process's."""
  import torch

  before = torch.get_num_threads()
  if count:
    torch.set_num_threads(count)
  try:
    yield
  finally:
    torch.set_num_threads(before)


def issue_table(reps: int, tiny: bool = False) -> dict:
  """Sentences/s of ours and of transformers' generate, their ratio, and our share of the
  compute floor, all measured in this process (`tiny`: TINY_MARIAN's shape, 8 sentences, torch
  on one thread, for CI)."""
  model, config, params = build_model(**(TINY_MARIAN if tiny else {}))
  sentences = 8 if tiny else SENTENCES
  sources = random_sources(config, sentences=sentences)
  flops, formula = flops_per_sentence(config)
  peak, cpu_peak = timing.matmul_peak(512 if tiny else 2048)
  floor = peak / flops
  outputs, ours = time_ours(params, config, sources, reps)
  result = {
    "sentences_per_s": sentences / ours.best,
    "run_s": ours.best,
    "cpu_s": ours.cpu,
    "flops_per_sentence": flops,
    "matmul_peak_flops": peak,
    "floor_sentences_per_s": floor,
    "share_of_floor": sentences / ours.best / floor,
    # The same per CPU-second (all threads), less disturbed by other processes.
    "cpu_share_of_floor": sentences / ours.cpu / (cpu_peak / flops),
  }
  print(
    f"\nIssue regime: random Marian {config.num_encoder_layers}+{config.num_decoder_layers} "
    f"layers, d_model {config.d_model}, d_ff {config.d_ff}, {config.num_heads} heads, vocab "
    f"{config.vocab_size}; {sentences} sentences x {SOURCE_TOKENS} source tokens, beam {BEAM}, "
    f"exactly {NEW_TOKENS} generated tokens; best of {reps}"
  )
  print(f"compute floor: {formula}\n  = {flops / 1e9:.2f} GFLOP per sentence")
  print(
    f"  / f32 matmul peak {peak / 1e9:.0f} GFLOP/s (benchmarks/timing.matmul_peak) = "
    f"{floor:.1f} sentences/s"
  )
  print(
    f"ours (beam_decode):     {result['sentences_per_s']:6.2f} sentences/s ({ours.best:.2f} s, "
    f"{ours.cpu:.2f} CPU s), {result['share_of_floor']:.0%} of the floor "
    f"({result['cpu_share_of_floor']:.0%} per CPU-second against the peak per CPU-second)"
  )
  if model is None:
    print("transformers generate:  not measured (transformers/torch not importable)")
    return result
  sequences, timings = time_generate(model, config, sources, reps, tiny)
  for threads, (seconds, cpu) in timings.items():
    print(
      f"transformers generate:  {sentences / seconds:6.2f} sentences/s ({seconds:.2f} s, "
      f"{cpu:.2f} CPU s), torch on {threads} thread(s)"
    )
  threads, (hf_seconds, hf_cpu) = min(timings.items(), key=lambda item: item[1][0])
  same = float(np.mean(np.all(sequences == np.asarray(outputs.sequences), axis=1)))
  result.update(
    hf_sentences_per_s=sentences / hf_seconds,
    hf_run_s=hf_seconds,
    hf_cpu_s=hf_cpu,
    hf_threads=threads,
    hf_timings={str(t): list(v) for t, v in timings.items()},
    ratio=hf_seconds / ours.best,
    cpu_ratio=hf_cpu / ours.cpu,
    hf_share_of_floor=sentences / hf_seconds / floor,
    same_sequences=same,
  )
  print(
    f"ratio ours / generate (its faster thread count, {threads}): {result['ratio']:.2f}x wall, "
    f"{result['cpu_ratio']:.2f}x CPU time; generate reaches {result['hf_share_of_floor']:.0%} of "
    f"the floor; best hypotheses identical on both sides: {same:.0%} of sentences"
  )
  return result


# The --tiny CI run's model: 1 + 1 layers at toy widths (the program, not the figures).
TINY_MARIAN = dict(
  encoder_layers=1,
  decoder_layers=1,
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
  """accelerator.py's "generate" section: our beam 4 against `generate` at the Base shape
  (6 + 6 layers; --tiny: TINY_MARIAN's 1 + 1), `sentences` sources; on a GPU both
  sides in bfloat16 (transformers' model cast as a whole, its usual GPU setup), on a CPU in
  float32. Lines: sentences/s and target tokens/s of each, the ratio, and how many sentences
  got the same best hypothesis (bf16 rounds differently on the two sides: fewer on a GPU)."""
  on_gpu = jax.default_backend() == "gpu"
  layers = 1 if tiny else 6
  model, config, params = build_model(
    **{"encoder_layers": layers, "decoder_layers": layers, **(TINY_MARIAN if tiny else {})}
  )
  config = config.replace(dtype="bfloat16" if on_gpu else "float32")
  sources = random_sources(config, sentences=sentences)
  outputs, ours = time_ours(params, config, sources, reps)
  new = NEW_TOKENS
  shape = (
    f"random Marian {layers}+{layers} layers, d_model {config.d_model}, vocab "
    f"{config.vocab_size}, {config.dtype}; {sentences} sentences x "
    f"{SOURCE_TOKENS} source tokens, beam {BEAM}, exactly {new} out"
  )
  lines = [
    f"beam-4 vs generate ({shape}): ours {sentences / ours.best:,.1f} sentences/s, "
    f"{sentences * new / ours.best:,.0f} target tokens/s ({ours.best:.3f} s)"
  ]
  if model is None:
    return lines + ["transformers generate: not measured (transformers/torch not importable)"]
  # --tiny on a CPU: torch on one thread (time_generate's reason; the figure is not the point).
  threads = 1 if tiny and not on_gpu else None
  sequences, seconds = time_generate_on_device(model, config, sources, reps, on_gpu, threads)
  same = float(np.mean(np.all(sequences == np.asarray(outputs.sequences), axis=1)))
  lines.append(
    f"transformers generate: {sentences / seconds:,.1f} sentences/s, "
    f"{sentences * new / seconds:,.0f} target tokens/s ({seconds:.3f} s); "
    f"ours / generate {seconds / ours.best:.2f}x; same best hypothesis for {same:.0%} of sentences"
  )
  return lines


def time_generate_on_device(
  model, config, sources, reps, on_gpu, threads=None
) -> tuple[np.ndarray, float]:
  """(sequences [sentences, NEW_TOKENS], best seconds) of transformers' beam search; `threads`:
  torch's intra-op threads for it (None: as they are)."""
  import torch

  device = torch.device("cuda" if on_gpu else "cpu")
  model = model.to(device, torch.bfloat16 if on_gpu else torch.float32)
  settings = generate_settings(config)
  inputs = torch.tensor(sources, dtype=torch.long, device=device)
  mask = torch.ones_like(inputs)
  best = np.inf
  with torch.inference_mode(), torch_threads(threads):
    for rep in range(reps + 1):  # the first is the warm-up
      start = time.perf_counter()
      sequences = model.generate(input_ids=inputs, attention_mask=mask, **settings)
      if on_gpu:
        torch.cuda.synchronize()
      if rep:
        best = min(best, time.perf_counter() - start)
  return sequences.cpu().numpy()[:, 1:], best

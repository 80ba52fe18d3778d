"""What the `generate` settings our decoding does not reproduce change, one at a time.

    python benchmarks/hf_generate_flags.py

Our greedy_decode and beam_decode (candidate_pool "hf", length_penalty "power") equal
transformers' `generate` called with the settings the interop tests pass (docs/importing.md,
"Decoding as `generate` does"): `early_stopping="never"`, `forced_eos_token_id=None`,
`min_length=0`, `renormalize_logits=True`, `suppress_tokens=TransformerConfig.suppressed_ids`.
This script measures how far `generate` moves when one of them is left at its default instead (the
model's generation config, else transformers' own), and, for the settings whose default is
off on these models, at an illustrative value (`min_length=10`, `no_repeat_ngram_size=3`).

Models: the four tiny types of tests/test_hf_models.py (tests/hf_fakes.py: 2+2 layers, d_model
16), twice: its `trained` fixture's (trained ~2 s each to translate its 10 sources into targets
of 4-14 tokens, one token recurring, so they end with EOS, two after the 12-token limit) and its
`converted` fixture's (every weight random: no EOS within 12 tokens, one token repeated). Each
decodes those 10 sources, padded in one batch, greedily and with beam 4 (alpha 1.0), at most 12
new tokens. Per setting, model set and decoder: the rows (of 40: 10 per type) whose best
sequence, cut after EOS, differs from ours; the largest |log P(theirs) - log P(ours)| of those
sequences, teacher-forced by the model (unprocessed log-softmax, EOS included); for beam also
the largest |sequences_scores - our score| over all rows (generate's own score: log-prob after
its logits processors, / length). The first row, the tests' settings, is the control: 0 rows,
scores within float32 noise. Prints a markdown table per model set, then one JSON line. ~1 min
on 2 busy cores (training and compiling; nothing is timed).
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import hf_fakes  # noqa: E402
import test_hf_models  # noqa: E402  (its trained fixture's sources and targets)
import transformers  # noqa: E402

from transformer_mt.decoding import beam_decode  # noqa: E402
from transformer_mt.decoding import incremental as decode
from transformer_mt.interop import hf_convert  # noqa: E402

BEAM = 4
ALPHA = 1.0
NEW_TOKENS = 12
KINDS = ("trained", "random")

# name -> (generate arguments replacing the tests' ones, with a value read from the model's
# generation config where it has one: None = take the default).
SETTINGS = {
  "none (the tests' settings)": {},
  'early_stopping=False (default; ours: "never")': {"early_stopping": False},
  "forced_eos_token_id (model config's)": {"forced_eos_token_id": "config"},
  "renormalize_logits=False (default)": {"renormalize_logits": False},
  "suppress_tokens=None (default)": {"suppress_tokens": None},
  "min_length (config's: 0)": {"min_length": "config"},
  "min_length=10 (illustrative)": {"min_length": 10},
  "no_repeat_ngram_size (config's: 0)": {"no_repeat_ngram_size": "config"},
  "no_repeat_ngram_size=3 (illustrative)": {"no_repeat_ngram_size": 3},
}


def tiny_model(model_type: str, kind: str, directory: pathlib.Path):
  """(HF model, our config, params, sources int64 [10, src_len]): test_hf_models' `trained`
  model (kind "trained"), or its `converted` one (kind "random": every weight random)."""
  torch.manual_seed(0)
  model = transformers.AutoModelForSeq2SeqLM.from_config(hf_fakes.hf_config(model_type))
  config = hf_convert.config_from_hf(model.config.to_dict())
  batches = [
    test_hf_models.decoded_sources(config, lengths)
    for lengths in (test_hf_models.GREEDY_LENGTHS, test_hf_models.BEAM_LENGTHS)
  ]
  sources = [[int(t) for t in row if t != config.pad_id] for batch in batches for row in batch]
  ordinary = test_hf_models.ordinary_ids(config, config.output_vocab_size)
  targets = hf_fakes.repeating_targets(
    np.random.default_rng(2), ordinary, test_hf_models.TARGET_LENGTHS
  )
  if kind == "trained":
    hf_fakes.train_to_translate(model, sources, targets)
  else:
    torch.manual_seed(0)
    scale = test_hf_models._WEIGHT_SCALE[model_type]
    with torch.no_grad():
      for name, parameter in model.named_parameters():
        if model_type == "mbart" or "embed_positions" not in name:
          parameter.copy_(torch.randn_like(parameter) * scale)
      if hasattr(model, "final_logits_bias"):
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
  model.eval().save_pretrained(directory)
  config, params = hf_convert.load_pretrained(str(directory))
  padded = np.full((len(sources), max(map(len, sources))), config.pad_id, np.int64)
  for row, source in enumerate(sources):
    padded[row, : len(source)] = source
  return model, config.replace(deterministic=True), params, padded


def generate_kwargs(model, config, num_beams: int, changed: dict) -> dict:
  kwargs = dict(
    num_beams=num_beams,
    do_sample=False,
    max_new_tokens=NEW_TOKENS,
    length_penalty=ALPHA,
    early_stopping="never",
    min_length=0,
    forced_eos_token_id=None,
    renormalize_logits=True,
    suppress_tokens=list(config.suppressed_ids),
    no_repeat_ngram_size=0,
  )
  for name, value in changed.items():
    kwargs[name] = getattr(model.generation_config, name, None) if value == "config" else value
    if name == "min_length" and kwargs[name] is None:
      kwargs[name] = 0  # transformers' default
    if name == "no_repeat_ngram_size" and kwargs[name] is None:
      kwargs[name] = 0
  return kwargs


def sequence_logprob(model, source, target, start_id: int) -> float:
  """log P(target | source), teacher-forced: the model's log-softmax, no processing."""
  with torch.no_grad():
    logits = model(
      input_ids=torch.tensor([source]),
      decoder_input_ids=torch.tensor([[start_id, *target[:-1]]]),
    ).logits[0]  # [len(target), vocab]
  log_probs = torch.log_softmax(logits.double(), dim=-1)
  return float(log_probs[torch.arange(len(target)), torch.tensor(target)].sum())


def measure(model_type: str, kind: str, directory: pathlib.Path) -> dict[str, dict[str, float]]:
  """setting -> {greedy_rows, greedy_logprob, beam_rows, beam_logprob, beam_score} for one
  model."""
  model, config, params, sources = tiny_model(model_type, kind, directory)
  inputs = jnp.asarray(sources, jnp.int32)
  with jax.default_matmul_precision("highest"):
    greedy = np.asarray(decode.greedy_decode(params, inputs, config, max_len=NEW_TOKENS))
    beam = beam_decode.beam_decode(
      params,
      inputs,
      config,
      beam_size=BEAM,
      max_len=NEW_TOKENS,
      alpha=ALPHA,
      length_penalty="power",
      candidate_pool="hf",
    )
  ours = {
    "greedy": [hf_fakes.until_eos(row, config.eos_id) for row in greedy],
    "beam": [hf_fakes.until_eos(row, config.eos_id) for row in np.asarray(beam.sequences)],
  }
  our_scores = np.asarray(beam.scores)
  attention_mask = torch.tensor(sources != config.pad_id)
  unpadded = [[int(t) for t in row if t != config.pad_id] for row in sources]
  results = {}
  for setting, changed in SETTINGS.items():
    result = {}
    for name, num_beams in (("greedy", 1), ("beam", BEAM)):
      with torch.no_grad():
        out = model.generate(
          input_ids=torch.tensor(sources),
          attention_mask=attention_mask,
          return_dict_in_generate=True,
          output_scores=True,
          generation_config=model.generation_config,
          **generate_kwargs(model, config, num_beams, changed),
        )
      theirs = [hf_fakes.until_eos(row[1:], config.eos_id) for row in out.sequences.numpy()]
      differ = [row for row in range(len(sources)) if theirs[row] != ours[name][row]]
      result[f"{name}_rows"] = len(differ)
      result[f"{name}_logprob"] = max(
        (
          abs(
            sequence_logprob(model, unpadded[r], theirs[r], config.decoder_start_id)
            - sequence_logprob(model, unpadded[r], ours[name][r], config.decoder_start_id)
          )
          for r in differ
        ),
        default=0.0,
      )
      if name == "beam":
        result["beam_score"] = float(np.abs(out.sequences_scores.numpy() - our_scores).max())
    results[setting] = result
  return results


def main() -> None:
  types = hf_convert.SUPPORTED_MODEL_TYPES
  rows = len(types) * len(test_hf_models.GREEDY_LENGTHS + test_hf_models.BEAM_LENGTHS)
  report = {"benchmark": "hf_generate_flags", "rows": rows}
  for kind in KINDS:
    with tempfile.TemporaryDirectory() as tmp:
      per_type = {t: measure(t, kind, pathlib.Path(tmp) / t) for t in types}
    print(f"\n{kind} models: rows whose best sequence differs from ours, of {rows}")
    print(
      "| setting left to generate | greedy rows | max abs Δ log P | beam 4 rows | max abs Δ log P "
      f"| max abs Δ score | rows greedy/beam per type ({', '.join(types)}) |"
    )
    print("|---|---|---|---|---|---|---|")
    table = {}
    for setting in SETTINGS:
      values = [per_type[t][setting] for t in types]
      row = {
        key: (sum if key.endswith("_rows") else max)(v[key] for v in values)
        for key in ("greedy_rows", "greedy_logprob", "beam_rows", "beam_logprob", "beam_score")
      }
      by_type = ", ".join(
        f"{per_type[t][setting]['greedy_rows']}/{per_type[t][setting]['beam_rows']}" for t in types
      )
      print(
        f"| {setting} | {row['greedy_rows']} | {row['greedy_logprob']:.2g} | "
        f"{row['beam_rows']} | {row['beam_logprob']:.2g} | {row['beam_score']:.2g} | {by_type} |"
      )
      table[setting] = dict(row, by_type={t: per_type[t][setting] for t in types})
    report[kind] = table
  print(json.dumps(report))


if __name__ == "__main__":
  main()

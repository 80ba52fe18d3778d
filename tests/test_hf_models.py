"""Hugging Face translation models run by our Transformer: same logits, same greedy output.

For each supported model type two tiny models are built with transformers (tests/hf_fakes.py:
2+2 layers, d_model 16, 4 heads, vocab ~100), saved with `save_pretrained` and read back by
`hf_convert.load_pretrained`. The logits are compared on a random one, every weight random at
a larger scale than its own initialization (so logits spread out and argmax ties are far
away), on one padded batch of 3 sentences of different lengths, masks on both sides. Greedy
decoding is compared on one trained to translate the decoded sources (a random model writes
one token repeated whatever the source), after checking that the outputs vary.

Select with `-m interop`; skipped when transformers (>= 5) or torch is not installed
(`pip install -e ".[interop]"`).
"""

from __future__ import annotations

import hf_fakes
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch, transformers = hf_fakes.require_interop()

from hf_fakes import (  # noqa: E402, F401  (the benchmark reads BEAM_LENGTHS, ordinary_ids here)
  BEAM_LENGTHS,
  GREEDY_LENGTHS,
  decoded_sources,
  ordinary_ids,
  special_ids,
)

from transformer_mt.decoding import incremental as decode  # noqa: E402
from transformer_mt.interop import hf_convert  # noqa: E402
from transformer_mt.model.transformer import Transformer  # noqa: E402

pytestmark = pytest.mark.interop

# The trained models of the greedy test (and test_hf_beam's) and what they decode are
# hf_fakes'; benchmarks/hf_generate_flags.py reads them, and TARGET_LENGTHS, here.
TARGET_LENGTHS = hf_fakes.TRAINED_TARGET_LENGTHS
trained = hf_fakes.trained  # the fixture: one tiny trained model of each type

# Logits of the same float32 computation done by PyTorch and by XLA, op order aside.
LOGITS_TOLERANCE = 1e-4
GREEDY_STEPS = 12

# Standard deviation of the random weights of `converted`, spread so that argmax ties are far
# from its teacher-forced logits (random models mostly repeat one token at any scale).
_WEIGHT_SCALE = {"marian": 1.0, "fsmt": 1.0, "mbart": 2.0, "m2m_100": 1.0}


@pytest.fixture(scope="module", params=hf_convert.SUPPORTED_MODEL_TYPES)
def converted(request, tmp_path_factory):
  """A tiny random model of each type, every weight random (the logits bias too)."""
  model_type = request.param
  torch.manual_seed(0)
  model = transformers.AutoModelForSeq2SeqLM.from_config(hf_fakes.hf_config(model_type)).eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      # Sinusoidal tables are fixed (FSMT saves its own, Marian's is rebuilt on load): kept.
      if model_type == "mbart" or "embed_positions" not in name:
        parameter.copy_(torch.randn_like(parameter) * _WEIGHT_SCALE[model_type])
    if hasattr(model, "final_logits_bias"):  # a buffer, zeros at init: make it count
      model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
  return hf_fakes.saved_and_read_back(model_type, model, tmp_path_factory)


def _inputs(config):
  rng = np.random.default_rng(0)
  sources = hf_fakes.random_batch(config, (7, 4, 2), config.vocab_size, rng)
  targets_in = hf_fakes.random_batch(
    config, (5, 3, 6), config.output_vocab_size, rng, config.decoder_start_id
  )
  # The decoder start token counts as real even where it is PAD (Marian).
  targets_valid = targets_in != config.pad_id
  targets_valid[:, 0] = True
  return sources, targets_in, targets_valid


def test_teacher_forced_logits_match_transformers(converted):
  model_type, model, config, params = converted
  sources, targets_in, targets_valid = _inputs(config)
  with torch.no_grad():
    expected = model(
      input_ids=torch.tensor(sources),
      attention_mask=torch.tensor(sources != config.pad_id),
      decoder_input_ids=torch.tensor(targets_in),
      decoder_attention_mask=torch.tensor(targets_valid),
      # FSMT applies its causal and decoder padding masks only without a cache.
      use_cache=False,
    ).logits.numpy()  # [batch, tgt_len, target_vocab]
  with jax.default_matmul_precision("highest"):
    logits = Transformer(config).apply(
      {"params": params}, jnp.asarray(sources, jnp.int32), jnp.asarray(targets_in, jnp.int32)
    )
  assert logits.shape == expected.shape
  difference = np.abs(np.asarray(logits) - expected)[targets_valid].max()
  print(f"{model_type}: max |logit difference| = {difference:.2e}")
  assert difference < LOGITS_TOLERANCE, model_type


def test_greedy_decoding_matches_generate(trained):
  model_type, model, config, params = trained
  sources = decoded_sources(config, GREEDY_LENGTHS)
  generation_config = model.generation_config
  with torch.no_grad():
    expected = model.generate(
      input_ids=torch.tensor(sources),
      attention_mask=torch.tensor(sources != config.pad_id),
      num_beams=1,
      do_sample=False,
      max_new_tokens=GREEDY_STEPS,
      min_length=0,
      # Our decoding never emits these; published generation configs forbid PAD too.
      suppress_tokens=list(config.suppressed_ids),
      # Forcing EOS at the last step is a generation option we do not have.
      forced_eos_token_id=None,
      generation_config=generation_config,
    ).numpy()  # [batch, 1 + steps]: the decoder start token first
  with jax.default_matmul_precision("highest"):
    outputs = decode.greedy_decode(
      params, jnp.asarray(sources, jnp.int32), config, max_len=GREEDY_STEPS
    )
  outputs = np.asarray(outputs)
  # Otherwise the comparison would prove little: rows that differ, each of several tokens.
  hf_fakes.assert_varied(expected[:, 1:], special_ids(config), config.eos_id)
  for row in range(len(sources)):
    ours = hf_fakes.until_eos(outputs[row], config.eos_id)
    theirs = hf_fakes.until_eos(expected[row, 1:], config.eos_id)
    assert ours == theirs, (model_type, row)


def test_unsupported_model_types_and_shapes_give_one_error(converted):
  model_type, model, config, params = converted
  with pytest.raises(ValueError, match="Unsupported Hugging Face model_type 'bart'"):
    hf_convert.config_from_hf({"model_type": "bart"})
  state_dict = {name: x.numpy() for name, x in model.state_dict().items()}
  hf_config = model.config.to_dict()
  fc1 = next(name for name in state_dict if name.endswith("layers.0.fc1.weight"))
  state_dict[fc1] = state_dict[fc1][:, :-1]
  with pytest.raises(ValueError, match="do not fit the model"):
    hf_convert.params_from_hf(state_dict, hf_config)

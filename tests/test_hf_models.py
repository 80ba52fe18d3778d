"""Hugging Face translation models run by our Transformer: same logits, same greedy output.

For each supported model type a tiny random model is built with transformers (2+2 layers,
d_model 16, 4 heads, vocab ~100), its weights randomized at a larger scale than its own
initialization (so logits spread out and argmax ties are far away) and saved with
`save_pretrained`; `hf_convert.load_pretrained` reads the directory back. The comparisons
run on one padded batch of 3 sentences of different lengths, masks on both sides.

Select with `-m interop`; skipped when transformers (>= 5) or torch is not installed
(`pip install -e ".[interop]"`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install -e '.[interop]'")
transformers = pytest.importorskip(
  "transformers", minversion="5", reason="needs transformers>=5: pip install -e '.[interop]'"
)

from transformer_mt import decode, hf_convert  # noqa: E402
from transformer_mt.model import Transformer  # noqa: E402

pytestmark = pytest.mark.interop

# Logits of the same float32 computation done by PyTorch and by XLA, op order aside.
LOGITS_TOLERANCE = 1e-4
GREEDY_STEPS = 12

_SIZES = dict(
  d_model=16,
  encoder_layers=2,
  decoder_layers=2,
  encoder_attention_heads=4,
  decoder_attention_heads=4,
  encoder_ffn_dim=32,
  decoder_ffn_dim=32,
  max_position_embeddings=64,
  dropout=0.0,
)


def _hf_config(model_type: str):
  """Tiny configs with the published models' switches (opus-mt, wmt19, mbart-large, m2m100)."""
  if model_type == "marian":  # opus-mt: swish, scaled embeddings, pad = decoder start, eos 0
    return transformers.MarianConfig(
      vocab_size=99,
      decoder_vocab_size=99,
      pad_token_id=98,
      eos_token_id=0,
      decoder_start_token_id=98,
      activation_function="swish",
      scale_embedding=True,
      **_SIZES,
    )
  if model_type == "fsmt":  # wmt19: separate source and target vocabularies
    return transformers.FSMTConfig(
      langs=["en", "ru"], src_vocab_size=99, tgt_vocab_size=87, activation_function="relu", **_SIZES
    )
  if model_type == "mbart":
    return transformers.MBartConfig(
      vocab_size=99, decoder_start_token_id=2, activation_function="gelu", **_SIZES
    )
  return transformers.M2M100Config(vocab_size=99, decoder_start_token_id=2, **_SIZES)


# Standard deviation of the random weights. Random models mostly repeat one token; at these
# scales m2m_100's rows differ from each other and mbart's rows end with EOS at different steps.
_WEIGHT_SCALE = {"marian": 1.0, "fsmt": 1.0, "mbart": 2.0, "m2m_100": 1.0}


@pytest.fixture(scope="module", params=hf_convert.SUPPORTED_MODEL_TYPES)
def converted(request, tmp_path_factory):
  """(model_type, HF model, our config, our params) for a tiny random model of each type."""
  model_type = request.param
  torch.manual_seed(0)
  model = transformers.AutoModelForSeq2SeqLM.from_config(_hf_config(model_type)).eval()
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      # Sinusoidal tables are fixed (FSMT saves its own, Marian's is rebuilt on load): kept.
      if model_type == "mbart" or "embed_positions" not in name:
        parameter.copy_(torch.randn_like(parameter) * _WEIGHT_SCALE[model_type])
    if hasattr(model, "final_logits_bias"):  # a buffer, zeros at init: make it count
      model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
  directory = tmp_path_factory.mktemp(model_type)
  model.save_pretrained(directory)
  config, params = hf_convert.load_pretrained(str(directory))
  return model_type, model, config.replace(deterministic=True), params


def _batch(config, lengths, vocab, rng, start=None):
  """int32 [3, max(lengths) (+1)] padded rows: random ordinary tokens ending with EOS, with
  `start` (the decoder start token) first when given."""
  special = {config.pad_id, config.eos_id, config.decoder_start_id, 0, 1, 2, 3}
  ordinary = np.array([t for t in range(vocab) if t not in special])
  offset = start is not None
  rows = np.full((len(lengths), max(lengths) + offset), config.pad_id, np.int64)
  for row, length in enumerate(lengths):
    tokens = list(rng.choice(ordinary, length - 1)) + [config.eos_id]
    rows[row, offset : offset + length] = tokens
    if offset:
      rows[row, 0] = start
  return rows


def _inputs(config):
  rng = np.random.default_rng(0)
  sources = _batch(config, (7, 4, 2), config.vocab_size, rng)
  targets_in = _batch(config, (5, 3, 6), config.output_vocab_size, rng, config.decoder_start_id)
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


def _until_eos(tokens, eos_id: int) -> list[int]:
  tokens = [int(t) for t in tokens]
  return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens


def test_greedy_decoding_matches_generate(converted):
  model_type, model, config, params = converted
  sources, _, _ = _inputs(config)
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
  for row in range(len(sources)):
    ours = _until_eos(outputs[row], config.eos_id)
    theirs = _until_eos(expected[row, 1:], config.eos_id)
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

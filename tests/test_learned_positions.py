"""Learned position embeddings (model.position_encoding='learned', e.g. imported Marian/mBART)
have model.max_len rows: no position past them is ever looked up. Training refuses rows longer
than the table; translation truncates longer lines with a warning and caps the output length;
padding past the table (a bucketed batch) reads the last row instead of JAX's NaN fill."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, tiny_model_config

from transformer_mt import cli
from transformer_mt.data.tokenizer import EOS_ID, PAD_ID
from transformer_mt.decoding import translator as translate
from transformer_mt.model.transformer import Transformer
from transformer_mt.runtime import sharding

TABLE = 12  # rows of the learned position table
CONFIG = tiny_model_config(
  num_encoder_layers=1, num_decoder_layers=1, position_encoding="learned", max_len=TABLE
)


class WordTokenizer:
  """ "w5 w17 ..." <-> ids 5, 17, ... (EOS appended): enough of a tokenizer for Translator."""

  vocab_size = CONFIG.vocab_size

  def encode(self, lines):
    return [[int(word[1:]) for word in line.split()] + [EOS_ID] for line in lines]

  def decode(self, ids):
    return " ".join(f"w{i}" for i in ids if i not in (PAD_ID, EOS_ID))


def make_translator(**settings):
  mesh = sharding.make_mesh(sharding.inference_mesh_config(), devices=jax.devices()[:1])
  return translate.Translator(
    params=init_params(CONFIG),
    model_config=CONFIG,
    tokenizer=WordTokenizer(),
    mesh=mesh,
    batch_size=2,
    **settings,
  )


def test_padding_past_the_table_changes_nothing_and_is_never_nan():
  """Ten tokens padded to 32 (a bucket past the 12-row table) encode exactly as padded to 12."""
  params = init_params(CONFIG)
  model = Transformer(CONFIG)
  tokens = np.arange(4, 14, dtype=np.int32)
  tokens[-1] = EOS_ID
  outputs = []
  for length in (TABLE, 32):
    inputs = np.full((1, length), PAD_ID, np.int32)
    inputs[0, :10] = tokens
    encoded = model.apply({"params": params}, jnp.asarray(inputs), method=Transformer.encode)
    outputs.append(np.asarray(encoded))
  assert np.isfinite(outputs[1]).all()
  np.testing.assert_allclose(outputs[1][0, :10], outputs[0][0, :10], rtol=1e-5, atol=1e-5)


def test_translation_truncates_to_the_table_with_a_warning(caplog):
  translator = make_translator(max_source_len=1024, max_target_len=256, extra_len=50)
  assert (translator.max_source_len, translator.max_target_len) == (TABLE, TABLE)
  long_line = " ".join(f"w{4 + i % 30}" for i in range(30))  # 31 tokens with EOS
  kept = " ".join(long_line.split()[: TABLE - 1])  # what truncation keeps: 11 words + EOS
  with caplog.at_level(logging.WARNING):
    (truncated,) = translator.encode_sources([long_line])
  assert truncated == WordTokenizer().encode([kept])[0]
  assert f"Line 1 has 31 tokens; using only its first {TABLE}" in caplog.text
  # The decode length is capped too: source 12 + extra 50 would reach position 61.
  _, max_lengths, max_len = translator.padded_batch([truncated])
  assert max_len <= TABLE and max_lengths.max() <= TABLE
  assert translator.translate([long_line]) == translator.translate([kept])
  (best,) = translator.nbest([long_line], 1)
  assert np.isfinite(best[0].logprob) and np.isfinite(best[0].score)


def test_an_ensemble_is_capped_by_its_smallest_table():
  translator = make_translator()
  wide = CONFIG.replace(max_len=64)
  ensemble = translate.dataclasses.replace(translator, members=(wide, CONFIG))
  assert ensemble.position_limit == TABLE and ensemble.max_source_len == TABLE
  sinusoidal = translate.dataclasses.replace(
    translator, model_config=CONFIG.replace(position_encoding="sinusoidal"), max_source_len=1024
  )
  assert sinusoidal.position_limit is None and sinusoidal.max_source_len == 1024


@pytest.mark.parametrize("data_max_len,ok", [(TABLE + 1, False), (TABLE, True)])
def test_training_rows_longer_than_the_table_are_an_error(tmp_path, capsys, data_max_len, ok):
  from transformer_mt.config import registry
  from transformer_mt.model import setup as run_setup

  config = registry.load_experiment(
    "demo", ["model.position_encoding='learned'", f"model.max_len={TABLE}"]
  )
  config.data.max_len = data_max_len
  if ok:
    run_setup.check_learned_positions(config, run_setup.model_config_for(config))
    return
  workdir = tmp_path / "run"
  argv = [
    "train",
    "--workdir",
    str(workdir),
    "model.position_encoding='learned'",
    f"model.max_len={TABLE}",
    f"data.max_len={data_max_len}",
  ]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err == (
    f"error: data.max_len={data_max_len} exceeds model.max_len={TABLE}, the rows of the "
    "learned position table: lower data.max_len or raise model.max_len."
  )
  assert not workdir.exists()

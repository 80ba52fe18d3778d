"""The experiment registry and its override parsing."""

import pytest

from transformer_mt.config import registry


def test_every_experiment_loads_with_a_description():
  names = registry.experiment_names()
  assert {
    "demo",
    "seed_minimal",
    "news_ende_small",
    "tatoeba_deen",
    "transformer_base_wmt14_ende",
    "transformer_big_wmt14_ende",
    "transformer_base_wmt14_enfr",
    "transformer_big_wmt14_enfr",
  } <= set(names)
  for name in names:
    assert registry.load_experiment(name).description


def test_unknown_experiment_lists_close_matches_first():
  with pytest.raises(ValueError, match=r"Unknown experiment 'dmo'\. Valid experiments: demo,"):
    registry.load_experiment("dmo")


def test_unknown_key_lists_close_matches_first():
  with pytest.raises(
    ValueError, match=r"Unknown config key 'train.num_step'\. Valid keys: train.num_steps"
  ):
    registry.load_experiment("demo", ["train.num_step=3"])


def test_overrides_are_typed_literals():
  config = registry.load_experiment(
    "demo",
    [
      "train.num_steps=7",
      "train.lr_scale=3",
      "model.layer_norm_position=pre",
      "model.use_bias=False",
      "data.source='synthetic'",
    ],
  )
  assert config.train.num_steps == 7
  assert config.train.lr_scale == 3.0 and isinstance(config.train.lr_scale, float)
  assert config.model.layer_norm_position == "pre"
  assert config.model.use_bias is False
  with pytest.raises(ValueError, match="expected a value of type int"):
    registry.load_experiment("demo", ["train.num_steps='many'"])
  with pytest.raises(ValueError, match="key=value"):
    registry.load_experiment("demo", ["train.num_steps"])


def test_override_code_is_rejected_and_not_run(tmp_path):
  marker = tmp_path / "ran"
  payload = f"__import__('os').system('touch {marker}')"
  for key in ("train.num_steps", "data.source"):
    with pytest.raises(ValueError, match="Python literals"):
      registry.load_experiment("demo", [f"{key}={payload}"])
  assert not marker.exists()


@pytest.mark.parametrize(
  "name,size,target,vocab,dropout",
  [
    ("transformer_base_wmt14_ende", "base", "de", 37000, 0.1),
    ("transformer_big_wmt14_ende", "big", "de", 37000, 0.3),
    ("transformer_base_wmt14_enfr", "base", "fr", 32000, 0.1),
    ("transformer_big_wmt14_enfr", "big", "fr", 32000, 0.1),
  ],
)
def test_paper_rows_have_the_papers_hyperparameters(name, size, target, vocab, dropout):
  """Every setting of Vaswani et al. (2017) section 5 / table 3 for the four WMT14 rows."""
  config = registry.load_experiment(name)
  model, train, data = config.model, config.train, config.data
  width = {"base": (512, 2048, 8), "big": (1024, 4096, 16)}[size]
  assert (model.d_model, model.d_ff, model.num_heads) == width
  assert (model.num_encoder_layers, model.num_decoder_layers) == (6, 6)
  assert model.layer_norm_position == "post" and model.use_residual and model.use_layer_norm
  assert model.position_encoding == "sinusoidal" and model.scale_embeddings
  assert model.share_embeddings and model.dropout_rate == dropout
  assert train.label_smoothing == 0.1 and train.warmup_steps == 4000 and train.lr_scale == 1.0
  assert (train.adam_b1, train.adam_b2, train.adam_eps) == (0.9, 0.98, 1e-9)
  assert train.num_steps == {"base": 100_000, "big": 300_000}[size]
  # ~25k target tokens per update (and as many source slots), packed rows of data.max_len.
  assert 24_000 <= train.batch_tokens <= 26_000
  assert config.tokenizer.vocab_size == vocab
  assert config.evaluate.average_last == {"base": 5, "big": 20}[size]
  assert train.keep_checkpoints >= config.evaluate.average_last
  assert (config.decode.beam_size, config.decode.alpha, config.decode.extra_len) == (4, 0.6, 50)
  assert (data.source, data.tfds_name, data.source_lang, data.target_lang) == (
    "tfds",
    "wmt14_translate",
    "en",
    target,
  )  # validation newstest2013, test newstest2014

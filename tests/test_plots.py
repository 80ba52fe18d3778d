"""Cross-attention extraction, the attention heatmap and the training-curve plot.

A random-init model is enough: the tests check shapes, normalization, consistency
with `Translator.translate` and that readable PNG files come out, not what the
model learned.
"""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import init_params, tiny_model_config

from transformer_mt.data import tokenizer
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding import incremental as decode
from transformer_mt.decoding.translator import Translator
from transformer_mt.evaluation import plots
from transformer_mt.runtime import sharding

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PAIRS = [
  ("the cat sat on the mat", "die katze sass auf der matte"),
  ("a dog barks at night", "ein hund bellt in der nacht"),
  ("the bird sings in the tree", "der vogel singt im baum"),
] * 20
SOURCE = "the cat sings at night"


@pytest.fixture(scope="module")
def translator():
  tok = tokenizer.train_tokenizer(PAIRS, vocab_size=60, model_type="bpe")
  config = tiny_model_config(vocab_size=tok.vocab_size, num_heads=2)
  params = init_params(config, unbox=False)
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}), jax.devices()[:1]
  )
  # A short max_target_len keeps the random model's (EOS-less) output small.
  return Translator(
    params=params, model_config=config, tokenizer=tok, mesh=mesh, batch_size=4, max_target_len=12
  )


def test_cross_attention_shape_and_normalization(translator):
  source = translator.tokenizer.encode([SOURCE])[0]
  inputs = np.array([source + [PAD_ID, PAD_ID]], np.int32)  # trailing padding is masked
  targets_in = np.array([[BOS_ID, 5, 9, 7, PAD_ID]], np.int32)
  weights = plots.cross_attention(translator.params, translator.model_config, inputs, targets_in)
  assert weights.shape == (2, 2, 5, len(source) + 2)
  real = weights[:, :, :4]  # the real target positions
  np.testing.assert_allclose(real.sum(axis=-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(real[..., len(source) :], 0.0, atol=1e-7)
  assert (weights >= 0).all()


def test_cross_attention_rejects_a_batch(translator):
  with pytest.raises(ValueError, match=r"shape \[1, length>0\]"):
    plots.cross_attention(
      translator.params,
      translator.model_config,
      np.ones((2, 3), np.int32),
      np.ones((2, 3), np.int32),
    )


@pytest.mark.parametrize("layer, head", [(None, None), (0, 1), ("mean", "mean"), (-1, 0)])
def test_attention_heatmap_writes_a_png_and_returns_the_translation(
  translator, tmp_path, layer, head
):
  path = tmp_path / "plots" / "attention.png"  # the missing directory is created
  text = plots.attention_heatmap(translator, SOURCE, path, layer=layer, head=head)
  data = path.read_bytes()
  assert data[:8] == PNG_MAGIC
  assert len(data) > 5_000
  # The same greedy decoding as the batched, padded translate().
  assert text == translator.translate([SOURCE])[0]


def test_heatmap_rows_follow_the_generated_pieces(translator, tmp_path, monkeypatch):
  """Teacher forcing feeds BOS + the translation minus its last token: one row per generated
  piece (EOS included when produced), one column per source piece."""
  seen = {}
  original = plots.cross_attention

  def spy(params, config, inputs, targets_in):
    seen["inputs"], seen["targets_in"] = inputs, targets_in
    return original(params, config, inputs, targets_in)

  monkeypatch.setattr(plots, "cross_attention", spy)
  text = plots.attention_heatmap(translator, SOURCE, tmp_path / "a.png", max_len=6)
  source = translator.tokenizer.encode([SOURCE])[0]
  generated = decode.greedy_decode(
    translator.params, jnp.array([source], jnp.int32), translator.model_config, 6
  )[0].tolist()
  if EOS_ID in generated:
    generated = generated[: generated.index(EOS_ID) + 1]
  assert seen["inputs"].tolist() == [source]
  assert seen["targets_in"].tolist() == [[BOS_ID] + generated[:-1]]
  assert text == translator.tokenizer.decode(generated)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"head": 2}, r"head=2 is out of range: the model has 2 attention heads.*\[0, 1\]"),
    ({"head": -3}, r"head=-3 is out of range"),
    ({"layer": 5}, r"layer=5 is out of range: the model has 2 decoder layers.*\[0, 1\]"),
    ({"layer": "last"}, r"layer='last'"),
  ],
)
def test_attention_heatmap_rejects_bad_indices(translator, tmp_path, kwargs, message):
  path = tmp_path / "never.png"
  with pytest.raises(ValueError, match=message):
    plots.attention_heatmap(translator, SOURCE, path, **kwargs)
  assert not path.exists()


def test_attention_heatmap_rejects_empty_source(translator, tmp_path):
  with pytest.raises(ValueError, match="empty"):
    plots.attention_heatmap(translator, "   ", tmp_path / "never.png")


def write_metrics(workdir, validation=False, bleu=False):
  records = []
  for step in range(1, 41):
    records.append(
      {
        "step": step,
        "loss": 8.0 / step**0.3,
        "accuracy": step / 50,
        "learning_rate": 1e-3 * min(step / 10, (10 / step) ** 0.5),
      }
    )
    if step % 10 == 0:
      records.append({"step": step, "data/pairs_seen": 100.0 * step})  # no plotted key
      if validation:
        records.append(
          {"step": step, "validation/loss": 7.0 / step**0.2, "validation/accuracy": step / 60}
        )
      if bleu:
        records.append({"step": step, "validation/bleu": step / 2})
  # A resumed run appends steps it had already logged: the later record wins.
  records.append({"step": 40, "loss": 1.5, "learning_rate": 1e-4})
  with open(workdir / "metrics.jsonl", "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")


@pytest.mark.parametrize(
  "validation, bleu, expected",
  [
    (False, False, ["loss", "learning_rate"]),
    (True, False, ["loss", "validation/loss", "learning_rate"]),
    (True, True, ["loss", "validation/loss", "learning_rate", "validation/bleu"]),
  ],
)
def test_training_curves(tmp_path, validation, bleu, expected):
  write_metrics(tmp_path, validation, bleu)
  path = tmp_path / "curves.png"
  assert plots.training_curves(str(tmp_path), str(path)) == expected
  data = path.read_bytes()
  assert data[:8] == PNG_MAGIC and len(data) > 5_000


def test_series_keeps_the_last_record_of_a_repeated_step():
  records = [
    {"step": 2, "loss": 3.0},
    {"step": 1, "loss": 4.0},
    {"step": 2, "loss": 2.5},
    {"step": 3, "other": 1.0},
  ]
  assert plots._series(records, "loss") == ([1, 2], [4.0, 2.5])


def test_training_minutes_add_each_steps_tokens_over_its_intervals_rate(tmp_path):
  """Two intervals of two steps: 100 tokens at 50 tokens/s (2 s a step), then 200 at 100/s
  (2 s a step); step 3 was logged twice (a resume) and its later record counts."""
  records = [
    {"step": 1, "num_tokens": 100.0, "tokens_per_second": 50.0},
    {"step": 2, "num_tokens": 100.0, "tokens_per_second": 50.0},
    {"step": 3, "num_tokens": 999.0, "tokens_per_second": 1.0},
    {"step": 3, "num_tokens": 200.0, "tokens_per_second": 100.0},
    {"step": 4, "num_tokens": 200.0, "tokens_per_second": 100.0},
    {"step": 4, "validation/bleu": 12.0},
  ]
  steps, minutes = plots.training_minutes(records)
  assert steps == [1, 2, 3, 4]
  np.testing.assert_allclose(minutes, [2 / 60, 4 / 60, 6 / 60, 8 / 60])
  assert plots.training_minutes([{"step": 1, "loss": 2.0}]) == ([], [])
  with open(tmp_path / "metrics.jsonl", "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(dict(record, loss=1.0)) + "\n")
  assert "validation/bleu" in plots.training_curves(tmp_path, tmp_path / "c.png")


def test_training_curves_without_metrics_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="No metrics.jsonl"):
    plots.training_curves(tmp_path, tmp_path / "curves.png")
  assert not (tmp_path / "curves.png").exists()


def test_training_curves_without_known_series(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "data/pairs_seen": 3.0}) + "\n")
  with pytest.raises(ValueError, match="none of the series"):
    plots.training_curves(tmp_path, tmp_path / "curves.png")


def test_minutes_axis_extends_past_the_last_step_instead_of_clamping():
  """The top axis maps steps to minutes (and back) along the run and at the same average rate
  beyond it: matplotlib places ticks past the last step, which np.interp alone would put all
  on the last minute, drawn over each other."""
  to_minutes = plots._linear_map([100, 200, 400], [1.0, 3.0, 5.0])  # 4 minutes per 300 steps
  np.testing.assert_allclose(to_minutes([100, 150, 300, 400]), [1.0, 2.0, 4.0, 5.0])
  np.testing.assert_allclose(to_minutes([25, 550]), [0.0, 7.0])
  to_steps = plots._linear_map([1.0, 3.0, 5.0], [100, 200, 400])
  np.testing.assert_allclose(to_steps(to_minutes([25, 250, 550])), [25, 250, 550])

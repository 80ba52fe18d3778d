"""Training-time estimates (transformer_mt/model/estimates.py) against hand counts, and where
`run.py list` and `reproduce --dry-run` show them."""

import math

import jax
import jax.numpy as jnp
import pytest

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.model import estimates
from transformer_mt.model.setup import model_config_for
from transformer_mt.model.transformer import Transformer

TINY = [
  "model.d_model=8",
  "model.d_ff=16",
  "model.num_heads=2",
  "model.num_encoder_layers=2",
  "model.num_decoder_layers=1",
  "tokenizer.vocab_size=50",
  "data.max_len=16",
  "train.batch_tokens=100",  # 6 packed rows of 16: 96 slots a side.
  "train.num_steps=10",
]
# A100 datasheet, dense: TF32 156 TFLOP/s (float32 matmuls under JAX's default precision),
# bf16 312 TFLOP/s; the module assumes 40% of it. The paper rows set model.dtype="auto",
# bfloat16 on a GPU, so their hours are at the bf16 peak (half the TF32 figures of before).
A100_TF32, A100_BF16, UTILIZATION = 156e12, 312e12, 0.4


def hand_parts(d, ff, n_enc, n_dec, vocab):
  """The paper rows' post-LN layers counted by hand: q, v and output projections biased, the
  key not (model.py's MultiHeadAttention); one LayerNorm (scale, bias) per sub-layer."""
  attention = 4 * d * d + 3 * d
  ffn = d * ff + ff + ff * d + d
  encoder = n_enc * (attention + ffn + 2 * 2 * d)
  decoder = n_dec * (2 * attention + ffn + 3 * 2 * d)
  return encoder, decoder, vocab * d  # The tied embedding is the output projection.


def test_tiny_model_flops_match_a_hand_count():
  config = registry.load_experiment("transformer_base_wmt14_ende", TINY)
  model_config = model_config_for(config).replace(deterministic=True)
  dummy = jnp.ones((1, 2), jnp.int32)
  params = Transformer(model_config).init(jax.random.key(0), dummy, dummy)["params"]
  counts = {
    part: sum(
      math.prod(x.shape)
      for k, v in params.items()
      if k.startswith(part)
      for x in jax.tree.leaves(v)
    )
    for part in ("encoder", "decoder", "source_embedder")
  }
  encoder, decoder, output = hand_parts(8, 16, 2, 1, 50)
  assert (counts["encoder"], counts["decoder"], counts["source_embedder"]) == (
    encoder,
    decoder,
    output,
  )
  assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == encoder + decoder + output

  e = estimates.estimate(config)
  assert (e.encoder_params, e.decoder_params, e.output_params, e.lookup_params) == (
    encoder,
    decoder,
    output,
    0,
  )
  assert e.source_tokens == e.target_tokens == 96
  flops = 6 * (encoder * 96 + (decoder + output) * 96)
  assert e.flops_per_step == flops
  assert e.total_flops == 10 * flops
  assert e.dtype == "bfloat16"  # model.dtype="auto" on the accelerator.
  assert e.hours == pytest.approx(10 * flops / (A100_BF16 * UTILIZATION) / 3600)
  # Scores and weighted sums, 2 x 2 x width x row FLOPs forward, x 3 with the backward:
  # 2 encoder self-attentions per source slot, 1 self + 1 cross per target slot.
  assert e.attention_flops_per_step == 12 * 8 * 16 * (2 * 96 + 2 * 96)


def test_untied_embeddings_count_the_output_projection_not_the_lookups():
  config = registry.load_experiment(
    "transformer_base_wmt14_ende", TINY + ["model.share_embeddings=False"]
  )
  e = estimates.estimate(config)
  assert e.output_params == 8 * 50 + 50  # kernel + bias
  assert e.lookup_params == 2 * 50 * 8  # source and target token tables


def test_hours_follow_the_rows_dtype():
  def row(dtype):
    overrides = TINY + ([f"model.dtype='{dtype}'"] if dtype else [])
    return estimates.estimate(registry.load_experiment("transformer_base_wmt14_ende", overrides))

  auto, f32, bf16 = row(None), row("float32"), row("bfloat16")
  # "auto" is costed as what it computes in on a GPU, even when the estimate runs on a CPU.
  assert (auto.dtype, auto.configured_dtype) == ("bfloat16", "auto")
  assert auto.hours == bf16.hours
  assert f32.dtype == "float32" and bf16.dtype == "bfloat16"
  assert f32.total_flops == bf16.total_flops
  assert f32.hours / bf16.hours == pytest.approx(A100_BF16 / A100_TF32)  # 2x


def _base_ende_by_hand():
  encoder, decoder, output = hand_parts(512, 2048, 6, 6, 37_000)
  slots = 24_576 // 256 * 256
  flops = 6 * (encoder * slots + (decoder + output) * slots)
  return flops, 100_000 * flops / (A100_BF16 * UTILIZATION) / 3600


def test_list_shows_the_estimate_and_imports_have_none(capsys):
  assert cli.main(["list"]) == 0
  rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
  _, hours = _base_ende_by_hand()
  assert float(rows["transformer_base_wmt14_ende"][2]) == pytest.approx(hours, rel=1e-2)
  assert rows["opus_mt_en_de_newstest2014"][1:3] == ["import", "-"]
  assert rows["mbart_cc25_wmt14_ende"][1:3] == ["import", "-"]  # Fine-tunes an import.


def test_reproduce_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
  workdir = tmp_path / "base_ende"
  argv = ["reproduce", "--experiment", "transformer_base_wmt14_ende"]
  assert cli.main(argv + ["--workdir", str(workdir), "--dry-run"]) == 0
  out = capsys.readouterr().out
  flops, hours = _base_ende_by_hand()
  assert "train 100,000 updates" in out and "average the last 5 checkpoints" in out
  assert f"= {flops:.3g};" in out and f"{hours:.3g} hours" in out
  assert "bfloat16: bf16 tensor cores" in out and "model.dtype=auto computes in bfloat16" in out
  assert not workdir.exists()
  assert cli.main(["reproduce", "--experiment", "nope", "--workdir", str(workdir), "--dry-run"])
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: Unknown experiment")
  assert not workdir.exists()

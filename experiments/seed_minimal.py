"""seed_minimal: the seeds' minimal Transformer on the synthetic task.

One head of width d_model, no residuals, no LayerNorm, no biases, d_ff = d_model,
sinusoidal positions and untied embeddings: exactly the equations of the worked
example (H~ = XW_E + P, A = softmax(QK^T/sqrt(d))V, H = ReLU(AW1)W2, ...), which
tests/test_model.py checks against a NumPy transcription. A teaching config: it
trains, but without residuals and normalization it learns slowly.

    python run.py train --experiment seed_minimal --workdir /tmp/seed_minimal
"""

from transformer_mt.config import registry

demo = registry.experiment_module("demo")


def get_config():
  config = demo.get_config()
  config.description = (
    "The seeds' minimal 1-head Transformer (no residual/LN/bias) on the synthetic task"
  )
  config.model.update(
    d_model=64,
    num_heads=1,
    head_dim=64,
    d_ff=64,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout_rate=0.0,
    use_residual=False,
    use_layer_norm=False,
    use_bias=False,
    attention_output_projection=False,
    scale_embeddings=False,
    share_embeddings=False,
    position_encoding="sinusoidal",
  )
  return config

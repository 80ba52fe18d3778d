"""bfloat16 compute (model.dtype="bfloat16", or "auto" on GPU/TPU) against float32.

bfloat16 keeps 8 significant bits (7 stored): one rounding is off by up to 2^-9 ~ 0.2%
relative. A forward and backward pass round each value a few dozen times in sequence, so
the tolerances are that error compounded: 1% on the loss (measured: 0.001%, its errors
average out over tokens) and 8% on the gradient as the relative norm of the difference
(measured: 3.9% on the 1+1-layer model; cosine > 0.99). Parameters, logits, softmax
statistics and the loss stay float32, which is what keeps the loss that close.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from transformer_mt.config import defaults as _defaults
from transformer_mt.config import registry
from transformer_mt.model.setup import model_config_for
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import sharding
from transformer_mt.training import losses, optimizer, train_step

LOSS_RTOL = 1e-2
GRAD_RTOL = 8e-2

# Each layer kind once: compilations are what these tests cost.
TINY = TransformerConfig(
  vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=1,
  num_decoder_layers=1, dropout_rate=0.0,
)  # fmt: skip


def _batch(seed=0, rows=8, length=12, vocab=64):
  """Right-padded rows, as the evaluation pipeline makes them."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, length + 1, size=(2, rows))
  positions = np.arange(length)
  inputs = rng.integers(4, vocab, size=(rows, length)).astype(np.int32)
  targets = rng.integers(4, vocab, size=(rows, length)).astype(np.int32)
  inputs[positions >= lengths[0][:, None]] = 0
  targets[positions >= lengths[1][:, None]] = 0
  targets_in = np.concatenate([np.full((rows, 1), 2, np.int32), targets[:, :-1]], -1)
  targets_in[targets == 0] = 0
  return {"inputs": inputs, "targets_in": targets_in, "targets": targets}


def _loss(params, config, batch):
  logits = Transformer(config.replace(deterministic=True)).apply(
    {"params": params}, batch["inputs"], batch["targets_in"]
  )
  sums = losses.cross_entropy_sums(
    logits, batch["targets"], (batch["targets"] > 0).astype(jnp.float32), 0.1
  )
  return sums["loss"] / sums["num_tokens"], logits


def _init(config):
  dummy = jnp.ones((1, 4), jnp.int32)
  return Transformer(config.replace(deterministic=True)).init(jax.random.key(0), dummy, dummy)[
    "params"
  ]


def test_bf16_loss_and_gradients_match_float32():
  bf16 = TINY.replace(dtype="bfloat16")
  params = _init(TINY)
  # Params stay float32 in bfloat16 mode: the same tree, the same dtypes.
  bf16_params = _init(bf16)
  assert jax.tree.structure(bf16_params) == jax.tree.structure(params)
  assert {x.dtype for x in jax.tree.leaves(bf16_params)} == {jnp.dtype(jnp.float32)}
  batch = _batch()
  grad = jax.value_and_grad(_loss, has_aux=True)
  (loss32, logits32), g32 = grad(params, TINY, batch)
  (loss16, logits16), g16 = grad(params, bf16, batch)
  assert logits16.dtype == jnp.float32 and loss16.dtype == jnp.float32
  assert {x.dtype for x in jax.tree.leaves(g16)} == {jnp.dtype(jnp.float32)}
  assert float(loss16) == pytest.approx(float(loss32), rel=LOSS_RTOL)
  assert float(loss16) != float(loss32)  # bfloat16 did run.
  flat32 = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g32)])
  flat16 = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g16)])
  relative = np.linalg.norm(flat16 - flat32) / np.linalg.norm(flat32)
  cosine = flat16 @ flat32 / np.linalg.norm(flat16) / np.linalg.norm(flat32)
  print(f"loss f32 {float(loss32):.6f} bf16 {float(loss16):.6f}; grad rel {relative:.4f}")
  assert relative < GRAD_RTOL and cosine > 0.99


def _equations(jaxpr):
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


STATISTICS = ("reduce_sum", "reduce_max", "reduce_min", "argmax", "exp", "log")


def test_forward_statistics_run_in_float32():
  """Every reduction and exp/log of the bf16 forward pass and loss (LayerNorm mean and
  variance, attention softmax, logsumexp of the loss) takes float32 operands."""
  params = _init(TINY)
  batch = _batch()
  jaxpr = jax.make_jaxpr(lambda p: _loss(p, TINY.replace(dtype="bfloat16"), batch))(params)
  seen = [
    (eqn.primitive.name, eqn.invars[0].aval.dtype)
    for eqn in _equations(jaxpr.jaxpr)
    if eqn.primitive.name in STATISTICS
  ]
  assert {"reduce_sum", "reduce_max", "exp"} <= {name for name, _ in seen}
  assert [s for s in seen if s[1] == jnp.bfloat16] == []
  # The check can fail: a softmax over bfloat16 logits (jnp.sum would upcast by itself,
  # exp and max do not) is caught.
  logits = jnp.ones((2, 5), jnp.bfloat16)
  bf16_softmax = jax.make_jaxpr(jax.nn.softmax)(logits)
  assert any(
    e.primitive.name in STATISTICS and e.invars[0].aval.dtype == jnp.bfloat16
    for e in _equations(bf16_softmax.jaxpr)
  )


def test_a_short_bf16_training_run_lowers_the_loss():
  """30 updates of the real (jitted, sharded) train step on one repeated batch."""
  config = TINY.replace(dtype="bfloat16")
  mesh = sharding.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}))
  model = Transformer(config)
  train_config = _defaults.base_config().train
  train_config.update(warmup_steps=10, lr_scale=1.0, grad_clip_norm=1.0)
  tx, schedule = optimizer.make_optimizer(train_config, config.d_model)
  state = train_step.create_sharded_state(0, model, tx, mesh)
  step = train_step.jit_train_step(
    model, tx, schedule, 0.1, mesh, train_step.state_shardings(model, tx, mesh)
  )
  batch = {k: v[None] for k, v in _batch(seed=1).items()}  # [accum=1, rows, length]
  batch = sharding.global_batch_from_local(batch, mesh, batch_dim=1)
  seen = []
  for _ in range(30):
    state, metrics = step(state, batch)
    seen.append(float(metrics["loss"]))
  print("bf16 losses", [round(x, 3) for x in seen[::5]], round(seen[-1], 3))
  assert all(np.isfinite(seen))
  assert seen[-1] < 0.7 * seen[0]
  assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}


def test_auto_is_float32_on_cpu_and_bfloat16_on_gpu_and_tpu(monkeypatch):
  for platform, expected in (("cpu", "float32"), ("gpu", "bfloat16"), ("tpu", "bfloat16")):
    monkeypatch.setattr(jax, "default_backend", lambda platform=platform: platform)
    assert TransformerConfig(dtype="auto").dtype == expected
    row = model_config_for(registry.load_experiment("transformer_base_wmt14_ende"))
    assert row.dtype == expected and row.param_dtype == "float32"
    # The command line still decides when it names a dtype.
    forced = registry.load_experiment("transformer_base_wmt14_ende", ["model.dtype='float32'"])
    assert model_config_for(forced).dtype == "float32"
  with pytest.raises(ValueError, match="must be one of"):
    TransformerConfig(dtype="bf16")

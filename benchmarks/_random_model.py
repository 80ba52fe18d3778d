"""A model of an experiment's shape at random initialization, with a SentencePiece vocabulary of
its size trained on its training text: what benchmarks decode when the speed, not the
translation, is measured (a random model emits no EOS, so every sentence runs to its limit)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from transformer_mt.data import sources as data_sources
from transformer_mt.data.tokenizer import Tokenizer, train_tokenizer
from transformer_mt.model import setup as run_setup

# Sentences the vocabulary is trained on (~10 s on 2 cores).
VOCABULARY_SAMPLE = 20_000


def random_model(
  config: ml_collections.ConfigDict, mesh
) -> tuple[run_setup.ModelSetup, dict, Tokenizer]:
  """(the model setup on `mesh`, parameters at seed 0, the tokenizer) for `config`, whose
  data section names the training text."""
  pairs = data_sources.load_pairs(config.data)["train"]
  tokenizer = train_tokenizer(
    pairs, config.tokenizer.vocab_size, config.tokenizer.model_type, sample_size=VOCABULARY_SAMPLE
  )
  setup = run_setup.model_setup(config, tokenizer, mesh)
  dummy = jnp.ones((1, 2), jnp.int32)
  params = nn.unbox(setup.model.init(jax.random.key(0), dummy, dummy)["params"])
  return setup, params, tokenizer

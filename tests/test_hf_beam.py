"""Beam search with candidate_pool "hf" and length_penalty "power" == transformers' generate.

The tiny models of tests/test_hf_models.py trained to translate these sources (its `trained`
fixture: one per supported model type, converted with `hf_convert`) decode one padded batch
of six random sources with beam 4 on both sides, after checking that transformers' outputs
vary (rows that differ, each of several distinct tokens) and that its greedy output differs
from its beam output on most rows: each source was trained on targets whose most likely first
token leads to a less likely sequence (`hf_fakes.greedy_misleading_targets`), so these tests
see search, and fail when beam search degenerates into greedy decoding (tests/mutants.py).
transformers runs with `early_stopping="never"`, which makes its search exact, as ours is
(it stops only when no live beam can beat the worst finished one, bounding with max_length
for a positive length_penalty).

Logits processors are matched, not just switched off: our decoder never emits PAD or a
decoder start token that is not EOS (`TransformerConfig.suppressed_ids`), so transformers
gets those as `suppress_tokens`; forcing EOS at the last step (`forced_eos_token_id`, set
by mbart's and fsmt's configs) and `min_length` are options we do not have, so they are
off. One difference remains and is matched with `renormalize_logits=True`: transformers
masks the suppressed tokens after its log_softmax, so by default its log-probs keep the
probability mass of PAD in the normalizer, whereas ours mask before the softmax. Without
renormalizing, its scores differ from ours by that mass (benchmarks/hf_generate_flags.py:
up to 3.0e-5 on these trained models, 8.1e-4 on random ones) and a near-tie could flip a
choice.

Select with `-m interop`; skipped when transformers (>= 5) or torch is not installed.
"""

from __future__ import annotations

import hf_fakes
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch, _ = hf_fakes.require_interop()

from hf_fakes import BEAM_LENGTHS, decoded_sources, special_ids, trained  # noqa: E402, F401

from transformer_mt.decoding import beam_decode  # noqa: E402

pytestmark = pytest.mark.interop

BEAM = 4
NEW_TOKENS = 12
# Our scores are log-prob / len ** alpha from float32 logits within ~1e-5 of PyTorch's.
SCORE_TOLERANCE = 1e-4


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_beam_search_matches_generate(trained, alpha):  # noqa: F811
  model_type, model, config, params = trained
  # Six rows of different lengths, padded; the fixture's models have no near-tied
  # candidates on them (checked: our scores match transformers' within ~1e-5).
  sources = decoded_sources(config, BEAM_LENGTHS)
  with torch.no_grad():
    expected = model.generate(
      input_ids=torch.tensor(sources),
      attention_mask=torch.tensor(sources != config.pad_id),
      num_beams=BEAM,
      length_penalty=alpha,
      early_stopping="never",
      max_new_tokens=NEW_TOKENS,
      do_sample=False,
      min_length=0,
      forced_eos_token_id=None,
      suppress_tokens=list(config.suppressed_ids),
      renormalize_logits=True,
      return_dict_in_generate=True,
      output_scores=True,
      generation_config=model.generation_config,
    )
  with jax.default_matmul_precision("highest"):
    out = beam_decode.beam_decode(
      params,
      jnp.asarray(sources, jnp.int32),
      config,
      beam_size=BEAM,
      max_len=NEW_TOKENS,
      alpha=alpha,
      length_penalty="power",
      candidate_pool="hf",
    )
  sequences = np.asarray(out.sequences)  # [batch, NEW_TOKENS]
  theirs = expected.sequences.numpy()  # [batch, 1 + generated]: the decoder start token first
  # Otherwise the comparison would prove little: rows that differ, each of several tokens...
  hf_fakes.assert_varied(theirs[:, 1:], special_ids(config), config.eos_id)
  # ... and a search that greedy decoding would fail: transformers' own greedy output differs
  # from its beam-4 output on most rows (the fixture's targets make the best first token a
  # trap, hf_fakes.greedy_misleading_targets).
  inputs = {
    "input_ids": torch.tensor(sources),
    "attention_mask": torch.tensor(sources != config.pad_id),
  }
  greedy = hf_fakes.generate(
    model,
    inputs,
    NEW_TOKENS,
    list(config.suppressed_ids),
    generation_config=model.generation_config,
  ).numpy()
  differ = sum(
    hf_fakes.until_eos(greedy[row, 1:], config.eos_id)
    != hf_fakes.until_eos(theirs[row, 1:], config.eos_id)
    for row in range(len(sources))
  )
  assert differ > len(sources) // 2, (model_type, differ)  # most rows
  for row in range(len(sources)):
    ours = hf_fakes.until_eos(sequences[row], config.eos_id)
    assert ours == hf_fakes.until_eos(theirs[row, 1:], config.eos_id), (model_type, alpha, row)
  np.testing.assert_allclose(
    np.asarray(out.scores), expected.sequences_scores.numpy(), atol=SCORE_TOLERANCE, rtol=0
  )


def test_a_cache_kept_in_place_decodes_the_trained_models_as_the_reordered_one(trained):  # noqa: F811
  """cache_reorder="ancestry" (the CPU default from 8 sentences: keys/values never moved, each
  beam attending to its ancestors' through a mask) on the trained models, whose translations
  depend on the source and on the tokens before: the hypotheses of the reordered cache, scores
  to float32 rounding, in a batch of 8 distinct sources that shrinks (to 2 sentences, each
  with its own per-sentence cache) and in one that does not."""
  model_type, _, config, params = trained
  sources = [
    [int(t) for t in row if t != config.pad_id]
    for lengths in (hf_fakes.GREEDY_LENGTHS, BEAM_LENGTHS[:4])
    for row in decoded_sources(config, lengths)
  ]
  inputs = np.full((8, max(map(len, sources))), config.pad_id, np.int32)
  for row, source in enumerate(sources):
    inputs[row, : len(source)] = source
  max_lengths = jnp.array([12, 3, 12, 5, 9, 12, 4, 11], jnp.int32)

  def search(**options):
    out = beam_decode.beam_decode(
      params,
      jnp.asarray(inputs),
      config,
      beam_size=BEAM,
      max_len=NEW_TOKENS,
      alpha=1.0,
      max_lengths=max_lengths,
      length_penalty="power",
      candidate_pool="hf",
      **options,
    )
    return jax.tree.map(np.asarray, out)

  reference = search(cache_reorder="chunked", shrink_batch=False)
  assert reference.num_reorders > 1, model_type
  # Outputs worth comparing: no two sentences translated alike.
  translations = {tuple(hf_fakes.until_eos(row, config.eos_id)) for row in reference.sequences}
  assert len(translations) == len(sources), (model_type, translations)
  for shrink_batch in (True, False):
    kept = search(cache_reorder="ancestry", shrink_batch=shrink_batch)
    np.testing.assert_array_equal(kept.all_sequences, reference.all_sequences, err_msg=model_type)
    np.testing.assert_allclose(
      kept.all_log_probs, reference.all_log_probs, rtol=1e-5, atol=1e-5, err_msg=model_type
    )

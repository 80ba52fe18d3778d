"""The mutant list of tests/mutants.py: each deliberate one-line bug, the line it replaces and the
tests that should catch it. The model, decoding, evaluation and training mutants are here;
those of the data stage and of a run's files and faults (preparation, resume, the writer
lock, preemption) are in tests/mutant_list_io.py; tests/mutants.py runs both lists. It is
the part that changes with the code (a moved line, a renamed test), so it lives apart from
the runner that copies the repository, applies each mutant and reads pytest's results. Not a
test module: pytest collects test_*.py only.

Each `original` must occur exactly once in its file, indentation included; mutants.py checks
that before running anything. List a mutant's existing tests before any in
test_mutant_guards.py, so the results table shows whether the older tests already catch it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mutant:
  """One deliberate bug: the line `original` of `file` (matched exactly, indentation
  included) replaced by `mutated`; `tests` are expected to fail on it."""

  id: str
  description: str
  file: str  # relative to the repository root
  original: str  # one line, exactly as in the file (without its newline)
  mutated: str
  tests: tuple[str, ...]  # pytest node ids, run in this order with -x


MUTANTS = (
  Mutant(
    "attention-scale-d-model",
    "fused attention scaled by 1/sqrt(d_model) instead of 1/sqrt(head_dim)",
    "transformer_mt/model/attention.py",
    "    **masking,",
    "    **masking, scale=1.0 / math.sqrt(query.shape[-2] * query.shape[-1]),",
    (
      "tests/test_model.py::test_fused_attention_matches_explicit_path",
      "tests/test_mutant_guards.py::test_multi_head_attention_matches_numpy",
    ),
  ),
  Mutant(
    "explicit-attention-scale-d-model",
    "attention that sows its weights (plots, attention dropout) scaled by 1/sqrt(d_model)",
    "transformer_mt/model/attention.py",
    "    query = query / jnp.sqrt(query.shape[-1]).astype(query.dtype)",
    "    query = query / jnp.sqrt(query.shape[-1] * query.shape[-2]).astype(query.dtype)",
    (
      "tests/test_model.py::test_fused_attention_matches_explicit_path",
      "tests/test_mutant_guards.py::test_multi_head_attention_matches_numpy",
    ),
  ),
  Mutant(
    "decode-attention-scale-d-model",
    "cached decoding attention scaled by 1/sqrt(d_model)",
    "transformer_mt/model/decode_cache.py",
    "  logits = logits * jnp.float32(1.0 / math.sqrt(depth))",
    "  logits = logits * jnp.float32(1.0 / math.sqrt(depth * heads))",
    (
      "tests/test_decode.py::test_decode_attention_equals_dot_product_attention",
      "tests/test_decode.py::test_cached_step_logits_equal_full_forward",
    ),
  ),
  Mutant(
    "causal-mask-off-by-one",
    "causal mask lets position i see position i+1",
    "transformer_mt/model/attention.py",
    "  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]",
    "  return jnp.tril(jnp.ones((length, length), dtype=bool), k=1)[None, None]",
    ("tests/test_model.py::test_causal_mask_hides_future_targets",),
  ),
  Mutant(
    "decode-step-mask-off-by-one",
    "a decoding step also sees the next, not yet written, cache slot",
    "transformer_mt/model/decode_cache.py",
    "  step_mask = (jnp.arange(total) <= index)[None, None, None, :]  # [1, 1, 1, cache_len]",
    "  step_mask = (jnp.arange(total) <= index + 1)[None, None, None, :]",
    ("tests/test_decode.py::test_cached_step_logits_equal_full_forward",),
  ),
  Mutant(
    "padding-mask-or",
    "padding mask ORs query and key validity (valid queries attend to padded keys)",
    "transformer_mt/model/attention.py",
    "  return query_valid[:, None, :, None] & key_valid[:, None, None, :]",
    "  return query_valid[:, None, :, None] | key_valid[:, None, None, :]",
    ("tests/test_model.py::test_padding_is_ignored",),
  ),
  Mutant(
    "segment-mask-ignores-ids",
    "segment mask only checks non-padding, not that query and key share a segment id",
    "transformer_mt/model/attention.py",
    "  return query_segments[:, None, :, None] == key_segments[:, None, None, :]",
    "  return (query_segments[:, None, :, None] > 0) & (key_segments[:, None, None, :] > 0)",
    ("tests/test_model.py::test_packed_sentences_match_unpacked",),
  ),
  Mutant(
    "sinusoid-sin-cos-swapped",
    "sinusoidal positions: cos in the even dims, sin in the odd ones",
    "transformer_mt/model/attention.py",
    "    encoding = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [b, l, ceil(d/2), 2]",
    "    encoding = jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=-1)",
    ("tests/test_model.py::test_seed_minimal_matches_numpy_equations",),
  ),
  Mutant(
    "embedding-not-scaled",
    "token embeddings not multiplied by sqrt(d_model)",
    "transformer_mt/model/transformer.py",
    "      x = x * jnp.sqrt(cfg.d_model).astype(x.dtype)",
    "      x = x * 1.0",
    ("tests/test_mutant_guards.py::test_embedder_scales_tokens_and_adds_sinusoids",),
  ),
  Mutant(
    "residual-dropped",
    "sub-layer output replaces its input instead of being added to it (no residual)",
    "transformer_mt/model/transformer.py",
    "      y = x + y",
    "      y = y",
    ("tests/test_mutant_guards.py::test_encoder_layer_matches_numpy",),
  ),
  Mutant(
    "label-smoothing-v-minus-1",
    "label smoothing spreads eps over the V-1 wrong classes (eps/(V-1)) instead of eps/V",
    "transformer_mt/training/losses.py",
    "    log_z - jnp.mean(logits, axis=-1)",
    "    log_z - (jnp.sum(logits, axis=-1) - target_logit) / (logits.shape[-1] - 1)",
    ("tests/test_training.py::test_label_smoothed_loss_matches_numpy",),
  ),
  Mutant(
    "warmup-exponent",
    "warm-up ramp step * warmup^-1 instead of step * warmup^-1.5",
    "transformer_mt/training/optimizer.py",
    "    rate = jnp.minimum(step**-0.5, step * warmup**-1.5)",
    "    rate = jnp.minimum(step**-0.5, step * warmup**-1.0)",
    ("tests/test_training.py::test_learning_rate_at_chosen_steps",),
  ),
  Mutant(
    "schedule-step-from-zero",
    "the schedule counts steps from 0 (first update gets learning rate 0)",
    "transformer_mt/training/optimizer.py",
    "    step = jnp.asarray(count, jnp.float32) + 1.0",
    "    step = jnp.asarray(count, jnp.float32) + 0.0",
    ("tests/test_training.py::test_learning_rate_at_chosen_steps",),
  ),
  Mutant(
    "adam-b2-from-b1",
    "Adam built with beta2 = the config's beta1",
    "transformer_mt/training/optimizer.py",
    "      schedule, b1=train_config.adam_b1, b2=train_config.adam_b2, eps=train_config.adam_eps",
    "      schedule, b1=train_config.adam_b1, b2=train_config.adam_b1, eps=train_config.adam_eps",
    ("tests/test_mutant_guards.py::test_optimizer_matches_numpy_adam_with_paper_schedule",),
  ),
  Mutant(
    "gnmt-penalty-on-len",
    "GNMT length penalty len^alpha instead of ((5 + len) / 6)^alpha",
    "transformer_mt/decoding/beam_search.py",
    "  return ((5.0 + length) / 6.0) ** alpha",
    "  return length**alpha",
    ("tests/test_beam_search.py::test_small_beam_scores_are_exact",),
  ),
  Mutant(
    "average-first-checkpoints",
    "checkpoint averaging takes the first k checkpoints instead of the last k",
    "transformer_mt/workdir/averaging.py",
    "  chosen = steps[-last_n:]",
    "  chosen = steps[:last_n]",
    ("tests/test_averaging.py::test_two_checkpoints_average_to_their_mean",),
  ),
  Mutant(
    "average-restores-newest-only",
    "checkpoint averaging restores the newest chosen checkpoint k times",
    "transformer_mt/workdir/averaging.py",
    "    params = checkpointing.restore_params(workdir, step, target)",
    "    params = checkpointing.restore_params(workdir, chosen[-1], target)",
    ("tests/test_averaging.py::test_two_checkpoints_average_to_their_mean",),
  ),
  Mutant(
    "average-running-mean-halves",
    "running mean m + (x - m) / k replaced by (m + x) / 2 (right for 2 checkpoints only)",
    "transformer_mt/workdir/averaging.py",
    "      params if mean is None else jax.tree.map(lambda m, x, k=count: m + (x - m) / k, "
    "mean, params)",
    "      params if mean is None else jax.tree.map(lambda m, x, k=count: (m + x) / 2, "
    "mean, params)",
    (
      "tests/test_averaging.py::test_two_checkpoints_average_to_their_mean",
      "tests/test_mutant_guards.py::test_three_distinct_checkpoints_average_to_their_mean",
    ),
  ),
  Mutant(
    "translate-drops-last-batch",
    "translation (translate, evaluate) drops the last partial batch of sentences",
    "transformer_mt/decoding/translator.py",
    "    return [todo[i : i + self.batch_size] for i in range(0, len(todo), self.batch_size)]",
    "    return [todo[i : i + self.batch_size] for i in range(0, len(todo) - self.batch_size "
    "+ 1, self.batch_size)]",
    (
      "tests/test_sampling.py::test_same_samples_on_1_and_8_devices_and_any_batch_size",
      "tests/test_mutant_guards.py::test_translation_batches_keep_a_partial_last_batch",
    ),
  ),
  Mutant(
    "scoring-drops-last-batch",
    "scoring (run.py score) drops the last partial batch of pairs",
    "transformer_mt/decoding/teacher_forcing.py",
    "  for start in range(0, len(order), translator.batch_size):",
    "  for start in range(0, len(order) - translator.batch_size + 1, translator.batch_size):",
    ("tests/test_scoring.py::test_score_equals_numpy_log_softmax_of_each_full_forward",),
  ),
  # The 1/N mutants: a global scale error is the same on 1 and on 8 devices, so comparing the two
  # cannot see it (nor can Adam, nearly scale-invariant); the SGD guard compares the update
  # with the gradient of the mean token loss written out by hand.
  Mutant(
    "loss-normalized-per-micro-batch",
    "1/N: each micro-batch's loss divided by its own token count (then by the batch's again)",
    "transformer_mt/training/train_step.py",
    '  return sums["loss"], sums',
    '  return sums["loss"] / sums["num_tokens"], sums',
    (
      "tests/test_training.py::test_gradient_accumulation_equals_large_batch",
      "tests/test_mutant_guards.py::test_sgd_step_moves_params_by_the_mean_token_gradient",
    ),
  ),
  Mutant(
    "loss-normalized-by-rows",
    "1/N: gradients divided by the number of rows (sentences) instead of target tokens",
    "transformer_mt/training/train_step.py",
    "  grads = jax.tree.map(lambda g: g / num_tokens, grads)",
    '  grads = jax.tree.map(lambda g: g / (num_micro * batch["targets"].shape[1]), grads)',
    (
      "tests/test_training.py::test_gradient_accumulation_equals_large_batch",
      "tests/test_mutant_guards.py::test_sgd_step_moves_params_by_the_mean_token_gradient",
    ),
  ),
  Mutant(
    "loss-normalized-per-device",
    "1/N: gradients divided by the per-device share of the tokens (global / device count)",
    "transformer_mt/training/train_step.py",
    '  num_tokens = jnp.maximum(sums["num_tokens"], 1.0)',
    '  num_tokens = jnp.maximum(sums["num_tokens"] / jax.device_count(), 1.0)',
    (
      "tests/test_training.py::test_sharded_steps_match_single_device",
      "tests/test_mutant_guards.py::test_sgd_step_moves_params_by_the_mean_token_gradient",
    ),
  ),
  Mutant(
    "paper-bleu-aggressive-hyphens",
    "paper BLEU tokenizes with Moses -a (aggressive hyphen splitting), unlike get_ende_bleu.sh",
    "transformer_mt/evaluation/corpus_scores.py",
    "    text, aggressive_dash_splits=False, return_str=True, escape=True",
    "    text, aggressive_dash_splits=True, return_str=True, escape=True",
    (
      "tests/test_evaluation.py::test_paper_tokenize_matches_the_perl_pipeline",
      "tests/test_evaluation.py::test_moses_tokenize_alone_gives_the_perl_row_without_compound_splitting",
    ),
  ),
  Mutant(
    "tokenized-bleu-tokenized-again",
    "BLEU on given tokens runs the detokenized text's pipeline (Moses again, compound split)",
    "transformer_mt/evaluation/corpus_scores.py",
    "  score, signature = multi_bleu(hypotheses, references)",
    '  score, signature = paper_bleu_score(hypotheses, references, "de")',
    ("tests/test_multi30k.py::test_tokenized_bleu_is_multi_bleu_perl_on_the_golden_file",),
  ),
  Mutant(
    "early-stopping-tie-improves",
    "early stopping counts an equal validation loss as an improvement (fairseq: strictly lower)",
    "transformer_mt/training/actions.py",
    "    if loss < self.best:",
    "    if loss <= self.best:",
    ("tests/test_early_stopping.py::test_early_stopping_stops_where_a_brute_force_count_does",),
  ),
  Mutant(
    "train-evaluates-last-not-average",
    "train's held-out evaluation ignores evaluate.average_last and decodes the last step",
    "transformer_mt/training/train.py",
    '      translator = result["translator"] = Translator(params=params, **settings)',
    "      pass",
    (
      "tests/test_averaging.py::test_train_evaluates_the_average_that_average_makes",
      "tests/test_averaging.py::test_train_then_evaluate_its_final_model_prints_the_same_bleu",
    ),
  ),
  Mutant(
    "qkv-init-gain-ignored",
    "the Q/K/V initialization ignores model.qkv_init_gain",
    "transformer_mt/model/attention.py",
    "      init_gain=cfg.qkv_init_gain,",
    "      init_gain=1.0,",
    ("tests/test_multi30k.py::test_qkv_init_gain_scales_only_the_query_key_value_kernels",),
  ),
  Mutant(
    "fuse-qkv-kernels-reordered",
    "model.fuse_qkv stacks the projection kernels in reverse order (values as queries, ...)",
    "transformer_mt/model/attention.py",
    "    kernel = jnp.stack([k for k, _ in weights], axis=1)  # [d_model, n, heads, head_dim]",
    "    kernel = jnp.stack([k for k, _ in weights][::-1], axis=1)",
    (
      "tests/test_fused_qkv.py::test_logits_and_gradients_equal_the_separate_projections",
      "tests/test_fused_qkv.py::test_cached_decoding_steps_equal_the_separate_projections",
    ),
  ),
  Mutant(
    "packed-layout-offsets-off-by-one",
    "cuDNN's packed layout starts each sentence one token late",
    "transformer_mt/model/fused_kernels.py",
    "  starts = jnp.argmax(member, axis=1).astype(jnp.int32)  # [batch, M], 0 where absent",
    "  starts = jnp.argmax(member, axis=1).astype(jnp.int32) + 1",
    (
      "tests/test_fused_kernels.py::test_packed_layout_matches_a_numpy_transcription",
      "tests/test_fused_kernels.py::test_cudnn_packed_self_attention_equals_the_default",
    ),
  ),
  Mutant(
    "cudnn-packed-keeps-padding-output",
    '"cudnn_packed" passes on what cuDNN leaves at padded queries (undefined) instead of zeros',
    "transformer_mt/model/fused_kernels.py",
    "  context = _zero_padding(context, query_real)",
    "  context = context",
    (
      "tests/test_fused_kernels.py::test_cudnn_packed_self_attention_equals_the_default",
      "tests/test_fused_kernels.py::test_cudnn_packed_model_loss_and_gradients_equal_the_default",
    ),
  ),
  Mutant(
    "cudnn-packed-keeps-padded-key-gradients",
    '"cudnn_packed" lets what cuDNN leaves in the padded keys\' gradients reach the projections',
    "transformer_mt/model/fused_kernels.py",
    "    _zero_padding(key, key_real),",
    "    key,",
    ("tests/test_fused_kernels.py::test_cudnn_packed_self_attention_equals_the_default",),
  ),
  Mutant(
    "pallas-not-causal",
    '"pallas" lets the decoder see later target tokens (causal flag dropped)',
    "transformer_mt/model/fused_kernels.py",
    "    causal=causal,",
    "    causal=False,",
    ("tests/test_fused_kernels.py::test_pallas_self_attention_equals_the_default",),
  ),
  Mutant(
    "auto-attention-ignores-its-constant",
    '"auto" picks cuDNN\'s packed kernel on a capable GPU before any device run confirmed it',
    "transformer_mt/model/fused_kernels.py",
    '  if implementation != "auto" or not AUTO_PICKS_CUDNN_PACKED_ON_GPU:',
    '  if implementation != "auto":',
    ("tests/test_fused_kernels.py::test_auto_stays_xla_until_the_constant_says_otherwise",),
  ),
  Mutant(
    "bleu-before-the-stopping-save",
    "a preempted BLEU step decodes the validation set before its checkpoint is saved",
    "transformer_mt/training/actions.py",
    "      self.deferred = step",
    "      self._evaluate(step)",
    ("tests/test_actions.py::test_a_stopping_steps_bleu_waits_until_its_checkpoint_is_saved",),
  ),
  Mutant(
    "beam-wrong-parent-gather",
    "beam search extends every candidate from the first beam's sequence (wrong parent gather)",
    "transformer_mt/decoding/beam_search.py",
    "    top_seqs = state.live_seqs[batch_index, parents]  # [batch, K, max_len]",
    "    top_seqs = state.live_seqs[batch_index, jnp.zeros_like(parents)]  # [batch, K, max_len]",
    (
      "tests/test_beam_search.py::test_small_beam_follows_a_plain_transcription",
      "tests/test_beam_search.py::test_large_beam_equals_brute_force",
    ),
  ),
  Mutant(
    "beam-top-k-not-normalized",
    "the two-stage top-k ranks each beam's logits but forgets the log-softmax's log-sum term",
    "transformer_mt/decoding/beam_search.py",
    "      beam_top = (beam_top - row_max) - log_sum  # [batch, beam, per_beam] log-probabilities",
    "      beam_top = beam_top - row_max",
    ("tests/test_beam_search.py::test_small_beam_scores_are_exact",),
  ),
  Mutant(
    "beam-top-k-parent-by-vocabulary",
    "the second top-k's index is split by the vocabulary size, not the candidates per beam",
    "transformer_mt/decoding/beam_search.py",
    "    parents = (top_index // per_beam).astype(jnp.int32)  # [batch, K]",
    "    parents = (top_index // vocab).astype(jnp.int32)  # [batch, K]",
    (
      "tests/test_beam_search.py::test_small_beam_follows_a_plain_transcription",
      "tests/test_beam_search.py::test_large_beam_equals_brute_force",
    ),
  ),
  Mutant(
    "beam-length-penalty-twice",
    "a finishing hypothesis' log-prob is divided by the length penalty twice",
    "transformer_mt/decoding/beam_search.py",
    "    new_scores = jnp.where(finishing, top_log_probs / lp(length), NEG_INF)  # [batch, K]",
    "    new_scores = jnp.where(finishing, top_log_probs / lp(length) / lp(length), NEG_INF)",
    ("tests/test_beam_search.py::test_small_beam_scores_are_exact",),
  ),
  Mutant(
    "beam-finished-not-kept",
    "beam search forgets the hypotheses finished at earlier steps",
    "transformer_mt/decoding/beam_search.py",
    "    all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)"
    "  # [batch, beam+K]",
    "    all_scores = jnp.concatenate([state.finished_scores * 0 + NEG_INF, new_scores], axis=1)",
    (
      "tests/test_beam_search.py::test_large_beam_equals_brute_force",
      "tests/test_beam_search.py::test_small_beam_follows_a_plain_transcription",
    ),
  ),
  Mutant(
    "encoder-output-zeroed",
    "the decoder attends to an encoder output of zeros",
    "transformer_mt/model/transformer.py",
    "    encoded = self.encode(inputs, inputs_positions, inputs_segmentation)",
    "    encoded = 0 * self.encode(inputs, inputs_positions, inputs_segmentation)",
    (
      "tests/test_hf_models.py::test_teacher_forced_logits_match_transformers",
      "tests/test_model.py",
    ),
  ),
  Mutant(
    "self-attention-cache-zeroed",
    "decoding's self-attention cache keeps zeros instead of the step's keys",
    "transformer_mt/model/decode_cache.py",
    "  cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, 0, index, 0))",
    "  cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, 0 * key,"
    " (0, 0, index, 0))",
    (
      "tests/test_decode.py::test_cached_step_logits_equal_full_forward",
      "tests/test_hf_models.py::test_greedy_decoding_matches_generate",
    ),
  ),
  Mutant(
    "fairseq-eos-first",
    '"fairseq" lets EOS end a hypothesis at the first step (min_len 0 instead of 1)',
    "transformer_mt/decoding/fairseq_rules.py",
    "  allowed = jnp.where(at_max, is_eos, ~is_eos | (step > 0))  # [batch, 1, vocab]",
    "  allowed = jnp.where(at_max, is_eos, True)  # [batch, 1, vocab]",
    (
      "tests/test_beam_search.py::test_fairseq_pool_never_ends_at_the_first_step",
      "tests/test_beam_search.py::test_fairseq_pool_follows_a_transcription_of_fairseq",
    ),
  ),
  Mutant(
    "fairseq-forced-finish-without-eos",
    '"fairseq" finishes a hypothesis at the length limit without EOS, as the other pools do',
    "transformer_mt/decoding/fairseq_rules.py",
    "  at_max = (step + 1 >= max_lengths)[:, None, None]  # [batch, 1, 1]",
    "  at_max = (step + 1 >= max_lengths + 1)[:, None, None]  # [batch, 1, 1]",
    (
      "tests/test_beam_search.py::test_fairseq_pool_ends_at_the_length_limit_with_eos",
      "tests/test_beam_search.py::test_fairseq_pool_follows_a_transcription_of_fairseq",
    ),
  ),
  Mutant(
    "fairseq-finished-set-by-score",
    '"fairseq" keeps the best beam_size finished hypotheses by score, not the first to finish',
    "transformer_mt/decoding/beam_search.py",
    "      keep = first_finished(all_flags, beam_size)  # [batch, beam]",
    "      keep = jax.lax.top_k(all_scores, beam_size)[1]  # [batch, beam]",
    (
      "tests/test_beam_search.py::test_fairseq_pool_keeps_the_first_finished_not_the_best",
      "tests/test_beam_search.py::test_fairseq_pool_follows_a_transcription_of_fairseq",
    ),
  ),
  Mutant(
    "fairseq-stop-by-bound",
    '"fairseq" stops a sentence by the score bound, not once beam_size have finished',
    "transformer_mt/decoding/beam_search.py",
    '    if candidate_pool == "fairseq":  # done once beam_size have finished, or none lives',
    "    if False:  # done once beam_size have finished, or none lives",
    ("tests/test_beam_search.py::test_fairseq_pool_keeps_the_first_finished_not_the_best",),
  ),
  Mutant(
    "fairseq-unsorted",
    '"fairseq" returns its finished hypotheses in finish order, not sorted by score',
    "transformer_mt/decoding/beam_search.py",
    "    final = sorted_by_score(final)",
    "    final = final",
    ("tests/test_beam_search.py::test_fairseq_pool_follows_a_transcription_of_fairseq",),
  ),
  Mutant(
    "beam-search-follows-the-best-beam-only",
    "beam search extends only its best live beam each step: greedy decoding in effect",
    "transformer_mt/decoding/beam_search.py",
    "    candidates = state.live_log_probs[:, :, None] + beam_top  # [batch, beam, per_beam]",
    "    candidates = jnp.where(jnp.arange(beam_top.shape[1])[None, :, None] == 0,"
    " state.live_log_probs[:, :, None], NEG_INF) + beam_top",
    ("tests/test_hf_beam.py::test_beam_search_matches_generate",),
  ),
  Mutant(
    "chunked-loss-drops-partial-chunk",
    "the chunked loss cuts rows into n chunks of floor(len / n): a partial chunk's tokens dropped",
    "transformer_mt/training/chunked_loss.py",
    "  return num_chunks, -(-length // num_chunks)  # the last chunk may be partial",
    "  return num_chunks, length // num_chunks  # the last chunk may be partial",
    ("tests/test_chunked_loss.py::test_chunked_loss_metrics_and_gradients_equal_the_full_logits",),
  ),
  Mutant(
    "chunked-loss-backward-ignores-smoothing",
    "the chunked loss's backward puts the target's whole mass on y (1 - eps dropped)",
    "transformer_mt/training/chunked_loss.py",
    "    [g_loss + g_nll, (1.0 - eps) * g_loss + g_nll, eps / vocab * g_loss, log_z], axis=-1",
    "    [g_loss + g_nll, g_loss + g_nll, eps / vocab * g_loss, log_z], axis=-1",
    ("tests/test_chunked_loss.py::test_chunked_loss_metrics_and_gradients_equal_the_full_logits",),
  ),
  Mutant(
    "chunked-loss-smoothing-mass-over-padded-ids",
    "the chunked loss spreads label smoothing's eps over the padded vocabulary (eps / padded size)",
    "transformer_mt/training/chunked_loss.py",
    "    mean_logit = jnp.sum(jnp.where(real, z, 0.0), axis=-1) / vocab",
    "    mean_logit = jnp.sum(jnp.where(real, z, 0.0), axis=-1) / z.shape[-1]",
    ("tests/test_chunked_loss.py::test_a_padded_vocabulary_trains_as_the_unpadded_model",),
  ),
  Mutant(
    "chunked-loss-backward-smoothing-on-padded-ids",
    "the chunked loss's backward gives the padded ids label smoothing's gradient",
    "transformer_mt/training/chunked_loss.py",
    "    dz = a * p - b * (ids == y[..., None]) - c * (ids < vocab)  # [batch, c, padded vocab]",
    "    dz = a * p - b * (ids == y[..., None]) - c  # [batch, c, padded vocab]",
    ("tests/test_chunked_loss.py::test_a_padded_vocabulary_trains_as_the_unpadded_model",),
  ),
  Mutant(
    "chunked-loss-told-the-padded-vocabulary",
    "the train step gives the chunked loss the padded vocabulary size: padded ids in the softmax",
    "transformer_mt/training/train_step.py",
    "      vocab_size=model.config.output_vocab_size,",
    "      vocab_size=model.config.padded_output_vocab_size,",
    ("tests/test_chunked_loss.py::test_a_padded_vocabulary_trains_as_the_unpadded_model",),
  ),
  Mutant(
    "padded-logits-not-cut",
    "the model returns the padded ids' logits: trained, and produced by decoding",
    "transformer_mt/model/transformer.py",
    "    return logits[..., : cfg.output_vocab_size].astype(jnp.float32)  # [..., vocab]",
    "    return logits.astype(jnp.float32)  # [..., vocab]",
    (
      "tests/test_chunked_loss.py::test_a_padded_vocabulary_trains_as_the_unpadded_model",
      "tests/test_chunked_loss.py::test_a_padded_vocabulary_decodes_as_the_unpadded_model",
    ),
  ),
  Mutant(
    "export-unscaled-embeddings",
    "the Marian export forgets the sqrt(d_model) embedding scale (scale_embedding=False)",
    "transformer_mt/interop/hf_export.py",
    "    scale_embedding=config.scale_embeddings,",
    "    scale_embedding=False,",
    ("tests/test_export.py::test_transformers_logits_equal_ours[demo]",),
  ),
  Mutant(
    "export-transposed-output-projection",
    "the attention output projection exported as the transpose of its [d_model, heads x dim]",
    "transformer_mt/interop/hf_names.py",
    "    lambda x: x.reshape(-1, x.shape[-1]).T,",
    "    lambda x: x.reshape(x.shape[-1], -1),",
    ("tests/test_export.py::test_transformers_logits_equal_ours[demo]",),
  ),
  Mutant(
    "export-interleaved-sinusoid-as-halves",
    "the paper's interleaved sinusoid exported without reordering d_model into Marian's halves",
    "transformer_mt/interop/hf_export.py",
    '  if config.position_encoding == "sinusoidal_halves":',
    "  if True:",
    ("tests/test_export.py::test_transformers_logits_equal_ours[demo]",),
  ),
  Mutant(
    "export-position-offset-allowed",
    "a position offset (positions from 2, not 0) no longer refused by the Marian export",
    "transformer_mt/interop/hf_export.py",
    "  if config.position_offset:",
    "  if False:",
    ("tests/test_export.py::test_what_marian_does_not_compute_is_named[offset]",),
  ),
  Mutant(
    "ctranslate2-decoder-starts-from-zeros",
    "the CTranslate2 export keeps OPUS-MT's zero start embedding instead of BOS's",
    "transformer_mt/interop/ct2_export.py",
    "      converters.BartLoader.set_decoder(self, spec, decoder)",
    "      super().set_decoder(spec, decoder)",
    ("tests/test_export.py::test_ctranslate2_scores_equal_ours[demo]",),
  ),
  Mutant(
    "ctranslate2-default-epsilon",
    "the CTranslate2 export leaves CTranslate2's LayerNorm epsilon (1e-5), not the model's",
    "transformer_mt/interop/ct2_export.py",
    "      config.layer_norm_epsilon = layer_norm_epsilon",
    "      config.layer_norm_epsilon = None",
    ("tests/test_export.py::test_ctranslate2_scores_equal_ours[epsilon_1e-6]",),
  ),
  Mutant(
    "dropout-params-from-prng-impl-key",
    "with train.prng_impl=rbg the parameters come from an rbg key, not the seed's threefry one",
    "transformer_mt/training/train_step.py",
    "    return init(jax.random.key(seed))",
    "    return init(jax.random.key(seed, impl=prng_impl))",
    ("tests/test_dropout_rng.py::test_without_dropout_every_prng_trains_as_threefry[rbg]",),
  ),
  Mutant(
    "dropout-key-ignores-step",
    "the dropout key of every step is the run's key: the same masks at every step",
    "transformer_mt/training/dropout_rng.py",
    "  return jax.random.fold_in(jax.random.wrap_key_data(key_data, impl=impl), step)",
    "  return jax.random.wrap_key_data(key_data, impl=impl)",
    ("tests/test_dropout_rng.py::test_masks_keep_one_minus_the_rate_independently[rbg]",),
  ),
  Mutant(
    "prng-change-not-refused",
    "a resume with another train.prng_impl than the checkpoints' goes on",
    "transformer_mt/training/auto_settings.py",
    "    elif saved_impl != dropout_rng.AUTO and prng_impl != saved_impl:",
    "    elif False:",
    ("tests/test_auto_settings.py::test_a_resume_with_another_prng_is_refused[unsafe_rbg]",),
  ),
  Mutant(
    "auto-prng-ignores-the-checkpoints",
    'a resume with train.prng_impl="auto" takes this host\'s PRNG, not the recorded one',
    "transformer_mt/training/auto_settings.py",
    "      prng_impl = saved_impl",
    "      pass",
    ("tests/test_auto_settings.py::test_a_resume_with_auto_takes_the_recorded_settings",),
  ),
  Mutant(
    "auto-workers-ignore-the-checkpoints",
    'a resume with data.num_workers="auto" takes this host\'s count, not the recorded one',
    "transformer_mt/training/auto_settings.py",
    "      num_workers = recorded.data.num_workers",
    "      pass",
    ("tests/test_auto_settings.py::test_a_resume_with_auto_takes_the_recorded_settings",),
  ),
  Mutant(
    "auto-workers-leave-no-core",
    'data.num_workers="auto" leaves no core for the training process',
    "transformer_mt/data/worker_count.py",
    "  return max(0, min(cores - 1, wanted))",
    "  return max(0, min(cores, wanted))",
    ("tests/test_auto_settings.py::test_auto_workers_by_platform_cores_and_devices",),
  ),
  Mutant(
    "auto-workers-ignore-local-processes",
    "usable cores not shared among the job's processes on the host",
    "transformer_mt/data/worker_count.py",
    "  return max(1, cores // local_processes(environ))",
    "  return max(1, cores)",
    (
      "tests/test_auto_settings.py::test_usable_cores_are_the_affinity_shared_by_the_local_processes",
    ),
  ),
  Mutant(
    "gather-reorder-copies-nothing",
    'cache_reorder="gather" leaves the cache rows where they were',
    "transformer_mt/decoding/incremental.py",
    '    lambda x: x if x.ndim == 0 else x.at[rows].get(mode="promise_in_bounds"), cache',
    "    lambda x: x, cache",
    ("tests/test_beam_decode.py::test_accelerator_options_give_the_default_outputs[beam]",),
  ),
  Mutant(
    "unconditional-reorder-skipped",
    "conditional_reorder=False counts a reorder at every step but copies nothing",
    "transformer_mt/decoding/beam_search.py",
    "      return jnp.array(True), gather_cache(cache, beam_rows.parent_rows(parents))",
    "      return jnp.array(True), cache",
    (
      "tests/test_beam_search.py::test_accelerator_loop_options_change_nothing[beam-gnmt-0.6-True]",
    ),
  ),
  Mutant(
    "ancestry-marks-slot-zero",
    "a cache kept in place records every row's new entry as written by slot 0",
    "transformer_mt/model/decode_cache.py",
    "  slots = (jnp.arange(rows, dtype=jnp.int32) % beam)[:, None]  # [rows, 1]",
    "  slots = jnp.zeros((rows, 1), jnp.int32)",
    (
      "tests/test_beam_decode.py::test_a_cache_kept_in_place_gives_the_reordered_outputs[beam]",
      "tests/test_hf_beam.py::test_a_cache_kept_in_place_decodes_the_trained_models_as_the_reordered_one",
    ),
  ),
  Mutant(
    "blocked-top-k-candidate-blocks-by-rank",
    "the blocked top-k keeps its candidate blocks in rank order, not index order (ties)",
    "transformer_mt/decoding/vocab_top_k.py",
    "  best_blocks = jnp.sort(best_blocks, axis=-1)  # index order, so ties resolve as in x",
    "  best_blocks = best_blocks",
    ("tests/test_vocab_top_k.py::test_rows_built_to_trap_the_two_stages",),
  ),
  Mutant(
    "blocked-top-k-nan-blocks-unmarked",
    "the blocked top-k ranks blocks by a float maximum, which may skip NaN",
    "transformer_mt/decoding/vocab_top_k.py",
    "  block_max = _from_keys(jnp.max(padded, axis=-1), x.dtype)  # [..., blocks]",
    "  block_max = jnp.max(_from_keys(padded, x.dtype), axis=-1)",
    ("tests/test_vocab_top_k.py::test_blocked_top_k_is_lax_top_k[True-4-9712]",),
  ),
  Mutant(
    "grown-cache-ancestry-padded-with-slot-zero",
    "a cache that grows marks its new positions as written by slot 0 instead of by none",
    "transformer_mt/decoding/incremental.py",
    "      out[path] = jnp.pad(x, ((0, 0), (0, positions - x.shape[1])), constant_values=-1)",
    "      out[path] = jnp.pad(x, ((0, 0), (0, positions - x.shape[1])), constant_values=0)",
    ("tests/test_beam_decode.py::test_a_cache_kept_in_place_gives_the_reordered_outputs[beam]",),
  ),
  Mutant(
    "grown-cache-loop-runs-past-its-positions",
    "a loop of a cache that grows goes on after the step leaves the positions it holds",
    "transformer_mt/decoding/beam_search.py",
    "        return searching_here & (state.step < positions)",
    "        return searching_here",
    ("tests/test_beam_decode.py::test_a_cache_kept_in_place_gives_the_reordered_outputs[beam]",),
  ),
  Mutant(
    "ancestry-not-reordered",
    "a cache kept in place keeps each row's ancestry when its beam changes parent",
    "transformer_mt/decoding/incremental.py",
    '      path: x.at[rows].get(mode="promise_in_bounds") if path[-1] == ANCESTRY else x',
    "      path: x",
    (
      "tests/test_beam_decode.py::test_a_cache_kept_in_place_gives_the_reordered_outputs[beam]",
      "tests/test_hf_beam.py::test_a_cache_kept_in_place_decodes_the_trained_models_as_the_reordered_one",
    ),
  ),
  Mutant(
    "shrink-moves-per-sentence-cache-of-other-sentences",
    "a shrinking batch gives the kept sentences each other's per-sentence cache leaves",
    "transformer_mt/decoding/beam_rows.py",
    "    cache=_leafwise(state.cache, per_sentence, by_beam, take),",
    "    cache=_leafwise(state.cache, per_sentence, by_beam, lambda x: take(x)[::-1]),",
    (
      "tests/test_beam_decode.py::test_a_cache_kept_in_place_gives_the_reordered_outputs[beam]",
      "tests/test_hf_beam.py::test_a_cache_kept_in_place_decodes_the_trained_models_as_the_reordered_one",
    ),
  ),
  Mutant(
    "shrink-moves-the-wrong-cache-rows",
    "a shrinking batch moves cache rows by sentence index, not by sentence x beam",
    "transformer_mt/decoding/beam_rows.py",
    "  return (sentences[:, None] * beam_size + beams[None, :]).reshape(-1)",
    "  return (sentences[:, None] + beams[None, :]).reshape(-1)",
    ("tests/test_beam_search.py::test_shrinking_batch_changes_nothing[1-beam]",),
  ),
  Mutant(
    "shrink-keeps-the-done-sentences",
    "a shrinking batch keeps the sentences that are done and drops those still searching",
    "transformer_mt/decoding/beam_rows.py",
    "  return jax.lax.top_k(searching.astype(jnp.int32), size)[1].astype(jnp.int32)",
    "  return jax.lax.top_k((~searching).astype(jnp.int32), size)[1].astype(jnp.int32)",
    ("tests/test_beam_search.py::test_shrinking_batch_changes_nothing[1-beam]",),
  ),
  Mutant(
    "steps-after-the-end-kept",
    "with stop_check_every > 1 the steps taken after the search ended are kept",
    "transformer_mt/decoding/beam_search.py",
    "      keep = searching(state)  # bool []",
    "      keep = jnp.array(True)",
    (
      "tests/test_beam_search.py::test_accelerator_loop_options_change_nothing[beam-gnmt-0.6-True]",
    ),
  ),
  Mutant(
    "schedule-folded-into-the-step",
    "the train step folds lr_scale and warmup_steps in as constants: every sweep trial compiles",
    "transformer_mt/training/train_step.py",
    "    tx, schedule = optimizer_for(schedule_inputs)",
    "    pass",
    (
      "tests/test_training.py::"
      "test_a_sweeps_learning_rate_settings_are_inputs_of_one_compiled_step",
    ),
  ),
  Mutant(
    "schedule-inputs-ignored",
    "the schedule reads lr_scale and warmup_steps from the config even when given inputs",
    "transformer_mt/training/optimizer.py",
    "  inputs = schedule_inputs(train_config) if inputs is None else inputs",
    "  inputs = schedule_inputs(train_config)",
    (
      "tests/test_training.py::"
      "test_a_sweeps_learning_rate_settings_are_inputs_of_one_compiled_step",
    ),
  ),
  Mutant(
    "sweep-pruning-ignored",
    "the training loop hears the pruner's decision and trains on to the last step",
    "transformer_mt/training/actions.py",
    "    if distributed.any_process(prune):",
    "    if distributed.any_process(prune) and False:",
    ("tests/test_sweep.py::test_a_diverging_trial_is_pruned_and_keeps_its_checkpoint",),
  ),
  Mutant(
    "sweep-stale-trial-restarted",
    "a running trial whose worker is gone is taken over but trained again from scratch",
    "transformer_mt/training/sweep.py",
    "  holding.enter_context(lock)",
    "  holding.enter_context(lock); shutil.rmtree(workdir + '/checkpoints', ignore_errors=True)",
    ("tests/test_sweep.py::test_a_killed_workers_trial_is_finished_from_its_checkpoint[journal]",),
  ),
  Mutant(
    "sweep-trial-run-twice",
    "a worker takes over running trials without taking their lock: a live worker's trial too",
    "transformer_mt/training/sweep.py",
    "    lock.enter_context(workdir_lock.held(workdir, force_unlock))",
    "    pass",
    ("tests/test_sweep.py::test_two_workers_share_one_study_and_never_run_one_trial_twice",),
  ),
  Mutant(
    "sweep-pruning-decided-per-process",
    "each process of a multi-process trial follows its own pruner: process 1 never stops",
    "transformer_mt/training/actions.py",
    "    if distributed.any_process(prune):",
    "    if prune:",
    ("tests/test_multihost.py::test_a_sweep_worker_of_two_processes_prunes_on_both_at_one_step",),
  ),
  Mutant(
    "blocked-top-k-nan-blocks-first",
    "the blocked top-k ranks a block holding NaN first, whatever the NaN's sign (x86's inf - inf"
    " ranked above every number, where lax.top_k ranks it below -inf)",
    "transformer_mt/decoding/vocab_top_k.py",
    "  block_max = _from_keys(jnp.max(padded, axis=-1), x.dtype)  # [..., blocks]",
    "  block_max = (lambda f: jnp.where(jnp.isnan(f).any(-1), jnp.nan, f.max(-1)))"
    "(_from_keys(padded, x.dtype))",
    (
      "tests/test_vocab_top_k.py::test_blocked_top_k_is_lax_top_k[True-4-9712]",
      "tests/test_vocab_top_k.py::test_nan_of_either_sign_and_signed_zeros_rank_as_in_lax_top_k",
    ),
  ),
  Mutant(
    "blocked-top-k-padded-with-minus-inf",
    "the blocked top-k pads rows to whole blocks with -inf, which ranks above a sign-bit NaN",
    "transformer_mt/decoding/vocab_top_k.py",
    "  lowest = jnp.iinfo(keys.dtype).min",
    "  lowest = _total_order_keys(jnp.array(-jnp.inf, x.dtype))",
    ("tests/test_vocab_top_k.py::test_nan_of_either_sign_and_signed_zeros_rank_as_in_lax_top_k",),
  ),
  Mutant(
    "fused-qkv-biases-reversed",
    "the fused Q/K/V matmul stacks the projections' biases in reverse order (the value's bias"
    " added to the queries, the query's to the values)",
    "transformer_mt/model/attention.py",
    "      bias = jnp.stack([jnp.zeros_like(kernel[0, 0]) if b is None else b for _, b in"
    " weights])",
    "      bias = jnp.stack([jnp.zeros_like(kernel[0, 0]) if b is None else b for _, b in"
    " weights[::-1]])",
    (
      "tests/test_fused_qkv.py::test_logits_and_gradients_equal_the_separate_projections",
      "tests/test_hf_reference.py::test_fused_qkv_gives_marians_logits",
    ),
  ),
  Mutant(
    "loss-chunk-tokens-over-global-rows",
    "train.loss_chunk_tokens cut over the global batch's rows: on k data-parallel devices each"
    " device's chunk is 1/k of the tokens asked",
    "transformer_mt/training/train_step.py",
    "      row_shards=sharding.batch_shards(),  # the chunk's tokens are each device's",
    "      row_shards=1,",
    (
      "tests/test_chunked_loss.py::"
      "test_a_chunk_holds_the_asked_tokens_on_each_device[data2-fsdp2-tensor2]",
    ),
  ),
  Mutant(
    "ahead-of-time-drops-eval-steps",
    "a run's eval steps left off the programs compiled ahead: the first validation compiles them",
    "transformer_mt/training/run_programs.py",
    "    run.validate.list_programs(programs, run.layout.abstract_params)",
    "    pass",
    (
      "tests/test_ahead_of_time.py::test_no_program_compiles_on_the_loop_path_after_the_first_step",
    ),
  ),
  Mutant(
    "ahead-of-time-drops-decodes",
    "the BLEU and test decodes left off the programs compiled ahead",
    "transformer_mt/training/run_programs.py",
    "    translator.list_programs(lines, programs)",
    "    pass",
    (
      "tests/test_ahead_of_time.py::test_no_program_compiles_on_the_loop_path_after_the_first_step",
    ),
  ),
  Mutant(
    "gpu-kernel-checkpoint-refused-here",
    "a model trained with a GPU kernel refuses to translate on a CPU (no 'auto' fallback)",
    "transformer_mt/model/setup.py",
    "  if problem is None:",
    "  if True:",
    (
      "tests/test_end_to_end.py::test_a_model_trained_on_a_gpu_kernel_translates_here"
      "[cudnn_packed]",
    ),
  ),
  Mutant(
    "training-kernel-refused-at-first-validation",
    "training does not check its attention kernel runs here: with attention dropout it trains, "
    "and refuses at the first validation",
    "transformer_mt/training/setup.py",
    "  fused_kernels.require(config.model.attention_implementation)",
    "  pass",
    (
      "tests/test_fused_kernels.py::test_training_refuses_a_kernel_this_process_lacks_before_tracing",
    ),
  ),
  Mutant(
    "attention-dropout-skips-kernel-silently",
    "attention dropout keeps training off the asked kernel without the warning line",
    "transformer_mt/training/setup.py",
    "  if note:",
    "  if False:",
    (
      "tests/test_fused_kernels.py::"
      "test_attention_dropout_keeping_training_off_the_kernel_is_one_warning[0.1]",
    ),
  ),
  Mutant(
    "cudnn-packed-fits-ignores-unpaired-sentences",
    '"cudnn_packed" trusts rows whose query and key sentences fill different slots, which JAX\'s '
    "compaction across the batch pairs with other rows' sentences",
    "transformer_mt/model/fused_kernels.py",
    "  fits &= jnp.all((q_seqlen > 0) == (kv_seqlen > 0))",
    "  fits &= True",
    ("tests/test_fused_kernels.py::test_cudnn_packed_refuses_rows_whose_sentences_do_not_fit",),
  ),
  Mutant(
    "pallas-backward-block-past-the-row",
    '"pallas" takes backward blocks of 32 tokens on rows that only blocks of 16 divide',
    "transformer_mt/model/fused_kernels.py",
    "  return block, min(_PALLAS_BACKWARD_BLOCK, block)",
    "  return block, _PALLAS_BACKWARD_BLOCK",
    (
      "tests/test_fused_kernels.py::test_pallas_tiles_rows_of_several_blocks_as_the_default"
      "[48_tokens]",
      "tests/test_fused_kernels.py::test_pallas_blocks_divide_the_row_and_fit_the_backward_kernels",
    ),
  ),
  Mutant(
    "pallas-backward-block-as-forward",
    '"pallas" runs its backward kernels on the forward block (128 tokens: past JAX\'s 32)',
    "transformer_mt/model/fused_kernels.py",
    "  return block, min(_PALLAS_BACKWARD_BLOCK, block)",
    "  return block, block",
    (
      "tests/test_fused_kernels.py::test_pallas_blocks_divide_the_row_and_fit_the_backward_kernels",
    ),
  ),
  Mutant(
    "torch-reference-q-v-swapped",
    "the PyTorch reference takes our value projection as its query and our query as its value",
    "benchmarks/torch_reference.py",
    '    for name, short in (("query", "q"), ("key", "k"), ("value", "v")):',
    '    for name, short in (("query", "v"), ("key", "k"), ("value", "q")):',
    ("tests/test_torch_reference.py::test_the_reference_computes_our_loss_on_our_weights",),
  ),
  Mutant(
    "cross-keys-transposed-whatever-the-switch",
    "the cross-attention keys are cached transposed even with cross_keys_transposed off",
    "transformer_mt/model/attention.py",
    "      keys = index == 0 and self.config.cross_keys_transposed",
    "      keys = index == 0",
    ("tests/test_beam_decode.py::test_cross_keys_kept_untransposed_give_the_default_outputs",),
  ),
  Mutant(
    "model-card-every-step",
    "the model card lists the reports of every checkpoint in WORKDIR/eval, not the exported one's",
    "transformer_mt/interop/model_card.py",
    '    if report.get("step") == step and not report.get("ensemble"):',
    '    if not report.get("ensemble"):',
    ("tests/test_export_use.py::test_the_model_card_lists_only_the_exported_checkpoints_reports",),
  ),
  Mutant(
    "model-card-ensemble-reports",
    "the model card lists an ensemble's report (one led by the workdir) as the model's own",
    "transformer_mt/interop/model_card.py",
    '    if report.get("step") == step and not report.get("ensemble"):',
    '    if report.get("step") == step:',
    ("tests/test_export_use.py::test_the_model_card_lists_only_the_exported_checkpoints_reports",),
  ),
  Mutant(
    "generation-config-greedy",
    "generation_config.json decodes greedily (num_beams 1), whatever the run's beam",
    "transformer_mt/interop/hf_export.py",
    "    num_beams=beam,",
    "    num_beams=1,",
    ("tests/test_export_use.py::test_a_plain_generate_translates_as_ours",),
  ),
  Mutant(
    "generation-config-default-length-penalty",
    "generation_config.json leaves transformers' length_penalty 1.0, not the run's alpha",
    "transformer_mt/interop/hf_export.py",
    "  search = dict(length_penalty=float(decode.alpha), "
    'early_stopping="never") if beam > 1 else {}',
    '  search = dict(early_stopping="never") if beam > 1 else {}',
    ("tests/test_export_use.py::test_a_plain_generate_translates_as_ours",),
  ),
  Mutant(
    "ctranslate2-snippet-no-suppression",
    "the card's CTranslate2 snippet lets CTranslate2 emit PAD and BOS, which ours never emits",
    "transformer_mt/interop/model_card.py",
    '    f"  suppress_sequences={json.dumps(suppressed, ensure_ascii=False)},",',
    '    "",',
    ("tests/test_export_use.py::test_the_cards_ctranslate2_snippet_translates_as_ours",),
  ),
  Mutant(
    "ctranslate2-snippet-default-length-penalty",
    "the card's CTranslate2 snippet leaves CTranslate2's length_penalty 1, not the run's alpha",
    "transformer_mt/interop/model_card.py",
    '    f"  length_penalty={float(decode.alpha)},",',
    '    "",',
    ("tests/test_export_use.py::test_the_cards_ctranslate2_snippet_translates_as_ours",),
  ),
  Mutant(
    "ctranslate2-card-shows-hf-snippet",
    "the CTranslate2 export's card shows the transformers snippet (target shadowed)",
    "transformer_mt/interop/model_card.py",
    '  if target == "ctranslate2":',
    "  if False:",
    ("tests/test_export_use.py::test_the_cards_ctranslate2_snippet_translates_as_ours",),
  ),
)

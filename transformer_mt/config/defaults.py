"""Defaults shared by every experiment; an experiment file overrides what differs."""

import ml_collections

from transformer_mt.model.transformer_config import TransformerConfig


def model_defaults() -> ml_collections.ConfigDict:
  """The model section: every field of `TransformerConfig` except the vocabulary sizes,
  which come from the tokenizer section. Defaults are the paper's Base model."""
  fields = TransformerConfig().to_dict()
  for derived in ("vocab_size", "target_vocab_size", *TransformerConfig.USE_FIELDS):
    fields.pop(derived)
  return ml_collections.ConfigDict(fields)


def base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # One line shown by `run.py list`.
  config.description = ""
  # The published BLEU this experiment reproduces, if any (shown by `run.py report`).
  config.paper_bleu = None
  # Where that figure comes from and what it measures (shown under `run.py report`'s table).
  config.paper_bleu_source = ""
  config.model = model_defaults()

  config.init = ml_collections.ConfigDict()
  # Fine-tune from a workdir written by `run.py import` (set as init.from=DIR; "" = train from
  # scratch): its params, tokenizer and model section (the dropout rates stay this config's).
  config.init["from"] = ""

  config.data = ml_collections.ConfigDict()
  # Where pairs come from: "synthetic" (generated offline), "tfds" (WMT via TFDS) or "local"
  # (text files).
  config.data.source = "synthetic"
  # Translation direction, as language codes (file suffixes for "local"; TFDS feature names for
  # "tfds").
  config.data.source_lang = "en"
  config.data.target_lang = "de"
  # A multilingual pretrained model's language tags (mBART en_XX, NLLB eng_Latn; "" for
  # models without): the source tag and the target language the decoder starts from.
  config.data.source_code = ""
  config.data.target_code = ""
  # Synthetic corpus: number of training / held-out test / validation pairs and the generator's
  # seed.
  config.data.num_train = 50_000
  config.data.num_eval = 500
  config.data.num_validation = 0
  config.data.seed = 0
  # TFDS builder: wmt14_translate, wmt17_translate or wmt_t2t_translate.
  config.data.tfds_name = "wmt14_translate"
  # An already-prepared TFDS data directory ("" = TFDS's default, ~/tensorflow_datasets).
  config.data.tfds_data_dir = ""
  # Where manually downloaded WMT archives are, for builders that need them ("" = none).
  config.data.tfds_manual_dir = ""
  # Local text: the folder prefixes are relative to ("" = ../shared/data beside the repository).
  config.data.root = ""
  # Local text: where the experiment's files come from, added to the error when they (or
  # data.root) are missing ("" = nothing to add; e.g. data/sources.py's HOW_TO_GET_NEWS).
  config.data.how_to_get = ""
  # Local text: file prefixes (globs allowed) of each split, read as
  # PREFIX.<source_lang>/<target_lang>.
  config.data.train_prefixes = []
  config.data.validation_prefixes = []
  config.data.test_prefixes = []
  # Local text: instead of the three lists above, one corpus (prefixes, globs allowed) cut into
  # test_size + validation_size held-out pairs and the rest for training, deterministically
  # (a split_seed-keyed hash of each source sentence) and with no held-out source sentence in
  # training; see data/sources.py, split_indices.
  config.data.split_prefixes = []
  # Local text, with split_prefixes only: more files (globs allowed) whose pairs are added to
  # the training split alone, e.g. another domain. A pair sharing a sentence, on either side,
  # with a held-out (test or validation) pair is dropped and counted. Read as
  # PREFIX.<a> / PREFIX.<b> of extra_train_langs="a,b" ("" = source_lang,target_lang).
  config.data.extra_train_prefixes = []
  config.data.extra_train_langs = ""
  # Local text: the cache folder of the train split's line indexes, made once per file content
  # (keyed by its digest; hosts sharing the folder share them, and nothing is deleted but by
  # `run.py prepare --remove_unused_days`) ("" = $XDG_CACHE_HOME/transformer_mt/prepared, else
  # ~/.cache/transformer_mt/prepared); see docs/data.md.
  config.data.prepared_dir = ""
  config.data.test_size = 1000
  config.data.validation_size = 1000
  config.data.split_seed = 0
  # Training pairs with a side longer than this many tokens are dropped (and counted); also the
  # packed row length.
  config.data.max_len = 64
  # Worker processes that tokenize, filter and pack (0: in the training process). 1 gives the
  # same batches as 0; 2 or more a different (still deterministic) order, so a run resumes
  # only with the number it started with. "auto": 0 on CPU, on GPU/TPU a count from the host's
  # cores (data/worker_count.py), recorded in the run's checkpoints and kept by a resume
  # (training/auto_settings.py). A field of any type: an int or "auto".
  config.data.num_workers = ml_collections.FieldReference("auto", field_type=object)
  # Resume over training data that changed since the checkpoint (other files, pair count or
  # tokenizer): False stops with one error naming the change; True warns and goes on, the
  # saved position now in a different shuffle.
  config.data.allow_changed_corpus = False

  config.tokenizer = ml_collections.ConfigDict()
  # SentencePiece vocabulary shared by source and target (pad=0, eos=1, bos=2, unk=3).
  config.tokenizer.vocab_size = 37_000
  # "unigram" or "bpe".
  config.tokenizer.model_type = "unigram"
  # Sentences sampled from the training pairs to train the tokenizer.
  config.tokenizer.sample_size = 1_000_000

  config.train = ml_collections.ConfigDict()
  config.train.seed = 0
  # Optimizer updates.
  config.train.num_steps = 100_000
  # Target-token capacity per optimizer update, over all devices and accumulation steps:
  # batch_tokens / data.max_len packed rows (the paper: ~25000 source + ~25000 target tokens).
  config.train.batch_tokens = 4096
  # Split each update into this many sequential micro-batches (gradient accumulation).
  config.train.grad_accum_steps = 1
  # LR = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).
  config.train.lr_scale = 1.0
  config.train.warmup_steps = 4000
  # "rsqrt" (the LR above throughout) or "cosine": the same linear warm-up to the same peak,
  # then a half cosine to 0 at num_steps (training/optimizer.py), for short runs.
  config.train.schedule = "rsqrt"
  # "adam" (the paper's) or "sgd": plain gradient descent, params -= LR * gradient, with the
  # same schedule (its LR wants a far larger lr_scale). The equivalence tests train with SGD:
  # its update is linear in the gradient, so a wrong gradient scale shows.
  config.train.optimizer = "adam"
  # Adam hyperparameters of the paper.
  config.train.adam_b1 = 0.9
  config.train.adam_b2 = 0.98
  config.train.adam_eps = 1e-9
  # Global gradient-norm clip; 0 disables clipping.
  config.train.grad_clip_norm = 0.0
  # Label smoothing epsilon: q(k) = (1 - eps) 1[k = y] + eps / |V|.
  config.train.label_smoothing = 0.1
  # The loss from the full float32 logits [tokens, vocab] (0), or from the decoder's states a
  # chunk of about this many target tokens per device at a time (e.g. 8192; each device's own
  # rows, whatever the data-parallel degree), the logits recomputed in the backward pass: the
  # same loss, gradients and metrics without the step's largest buffers, for one more
  # vocabulary matmul (training/chunked_loss.py). Validation follows it too.
  config.train.loss_chunk_tokens = 0
  # On a NaN/Inf loss or gradient: "stop" (exit naming the step) or "skip" (drop the update,
  # count it). Either way the update is never applied and the checkpoints stay clean. A
  # skipped step is optax.apply_if_finite's: params, Adam state and the schedule's count
  # stay as they were (the logged learning_rate is the schedule at that count); only the
  # step number, the data and the dropout key move on.
  config.train.nonfinite = "stop"
  # The PRNG of the dropout masks: "threefry2x32" (JAX's default), "rbg" or "unsafe_rbg" (XLA's
  # RngBitGenerator, MaxText's choice on accelerators; other masks at the same rate), or "auto"
  # (unsafe_rbg on GPU/TPU, threefry2x32 on CPU: the proposed GPU default, not yet measured).
  # Recorded in the checkpoints; a resume with another one stops (training/dropout_rng.py).
  config.train.prng_impl = "threefry2x32"
  # Fault injection for tests and drills: poison this step's loss with NaN (0: never).
  config.train.inject_nonfinite_at = 0
  # Steps between metric log lines.
  config.train.log_every = 50
  # Steps between validation-loss evaluations (0: never).
  config.train.eval_every = 1000
  # Steps between validation BLEU and chrF evaluations (0: never); the best checkpoint by
  # BLEU is kept in WORKDIR/best beside the latest ones.
  config.train.bleu_every = 5000
  # Validation sentences translated for that BLEU (0: all of them).
  config.train.bleu_sentences = 0
  # Stop once this many validation-loss evaluations (every eval_every steps) in a row have not
  # beaten the best validation loss so far, as fairseq's --patience (0: never stop early).
  config.train.patience = 0
  # Steps between checkpoints (a checkpoint is always written at the end).
  config.train.checkpoint_every = 1000
  # Checkpoints kept on disk.
  config.train.keep_checkpoints = 3
  # [first, last]: write a JAX profiler trace of those steps into WORKDIR/tensorboard (open
  # TensorBoard's profile tab); [] traces nothing.
  config.train.profile_steps = []

  config.mesh = ml_collections.ConfigDict()
  # Device mesh shape; -1 takes all remaining devices. data x fsdp x tensor = #devices.
  config.mesh.data = -1
  config.mesh.fsdp = 1
  config.mesh.tensor = 1
  # Replicate a parameter dimension its mesh axis does not divide (e.g. 6 heads on tensor=4)
  # instead of stopping at startup with an error that names it.
  config.mesh.allow_replicated_fallback = False

  config.evaluate = ml_collections.ConfigDict()
  # Final models average the last N checkpoints (`run.py average --last N`; 0: no averaging).
  config.evaluate.average_last = 0
  # Whether `run.py train` ends with the held-out test BLEU. Off for the runs of a recipe
  # search, so that validation decides and the test split is read once, by the final run.
  config.evaluate.test_after_training = True
  # The BLEU that `train`'s held-out line, validation BLEU, `evaluate` and `report` lead with:
  # "sacrebleu" (sacreBLEU's own 13a tokenization of detokenized text) or "tokenized"
  # (multi-bleu.perl on the text as it is, split at spaces: for data that is already
  # tokenized, such as Multi30k's lc.norm.tok files, where published results use it).
  config.evaluate.bleu = "sacrebleu"

  config.decode = ml_collections.ConfigDict()
  # Beam size (1 = greedy) and the GNMT length penalty ((5 + len) / 6)^alpha (paper: 4, 0.6).
  config.decode.beam_size = 4
  config.decode.alpha = 0.6
  # How a hypothesis is scored: "gnmt" (log-prob / ((5 + len) / 6)^alpha) or "power"
  # (log-prob / len^alpha, transformers' length_penalty).
  config.decode.length_penalty = "gnmt"
  # Candidates kept per step: "beam" (the beam_size best extensions), "2beam" (2 x beam_size,
  # as tensor2tensor / t5x), "hf" (2 x beam_size, as transformers' generate) or "fairseq"
  # (as "hf", with fairseq-generate's length rules and first-finished set). See
  # transformer_mt/decoding/beam_search.py.
  config.decode.candidate_pool = "beam"
  # A sentence's translation may grow to its source length + extra_len tokens (paper: 50) ...
  config.decode.extra_len = 50
  # ... and never beyond max_len.
  config.decode.max_len = 128
  # Sentences translated per decode batch.
  config.decode.batch_size = 64
  # How beam search reorders the beams' KV cache: "chunked" (only the positions written, and
  # only at steps where a beam changed parent), "gather" (every position at every step, no
  # lax.cond or inner loop: for GPUs, where each may be a host round trip), "ancestry" (never:
  # the keys/values stay where they were written and each beam attends to its ancestors'
  # through a mask; the faster CPU path from 8 sentences a batch) or "auto" (ancestry on CPU,
  # chunked there below 8 sentences, gather on GPU/TPU: the proposed GPU default, not yet
  # measured). The same translations either way; ancestry's
  # scores may differ in the last float32 bits (decoding/beam_search.py).
  config.decode.cache_reorder = "auto"
  # Beam search reads its stopping condition once every this many decoder steps (1: after
  # each); more means fewer host round trips on a GPU, at most this - 1 wasted steps per
  # batch, the same translations.
  config.decode.stop_check_every = 1
  # Beam search goes on in a quarter of the batch each time at most a quarter of its sentences
  # still search (as CTranslate2 drops finished ones), down to the device count: the same
  # translations, fewer sentences decoded per step; each batch size is one more compiled copy
  # of the step.
  config.decode.shrink_batch = True
  return config


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills in, in place, every key of `base_config()` that `config` lacks, section by section;
  a key that is present is never changed. Returns `config`.

  Code reads every key as `config.section.key`, and this is where a config that lacks some
  gets them: one saved before a key was declared (an older checkpoint), or one partial by
  design (`run.py import` writes no `train` section and a short `data` one). Imports stay
  recognisable: the defaults add neither `init.source` nor `model.vocab_size`.
  """
  with config.unlocked():
    _fill(config, base_config())
  return config


def _fill(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict) -> None:
  for key, default in defaults.items():
    if key not in config:
      config[key] = default
    elif isinstance(default, ml_collections.ConfigDict) and isinstance(
      config[key], ml_collections.ConfigDict
    ):
      _fill(config[key], default)

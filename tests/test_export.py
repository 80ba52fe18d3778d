"""`run.py export`: our trained models as transformers' MarianMTModel, and as CTranslate2 models
converted from it, computing what ours compute.

Two models are trained by the project's own packed training (train.train on the synthetic pair,
tiny sizes, 100 and 150 steps on 32 pairs, which they memorize: what they write depends on the
source, and beam search and greedy decoding part ways on the held-out sentences; built once per
session by tests/trained_runs.py, which test_export_use.py shares):
  * "demo": the demo experiment's switches (the paper's interleaved sinusoid, which the export
    writes with d_model reordered into Marian's halves; ReLU; scaled embeddings; no logits
    bias), with Marian's LayerNorm epsilon 1e-5;
  * "halves": every other branch: Marian's own sinusoid (no reordering), swish, unscaled
    embeddings and a trained logits bias.
Each is exported with the CLI and compared with what transformers loads from the directory
alone: the same token ids; logits within 1e-5 of transformers' float64 ones beyond float32's
rounding noise on the model (up to 1e-5 on these, as transformers' own float32 shows); the
same greedy and beam-4 outputs with our length penalty "power" (transformers' length_penalty)
and candidate pool "hf"; and, imported back with `run.py import`, the same parameters and
translations. An imported Marian model exports back to itself. The CTranslate2 tests (skipped
without the ctranslate2 extra, with the reason) compare token log-probs with ours and BLEU on
64 sentences at the same beam, length penalty and search
(CTranslate2's, our candidate pool "fairseq"). Refused and failed exports leave nothing.
What a user of the export runs as it is (the model card, a plain `generate()`, the card's
CTranslate2 snippet) is tested in test_export_use.py.

Select with `-m interop`; skipped without transformers or torch (under CI a skip fails:
tests/conftest.py).
"""

from __future__ import annotations

import copy
import functools
import pathlib

import helpers
import hf_fakes
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece
import trained_runs
from trained_runs import MODELS, SEEN, TRAINING

torch, transformers = hf_fakes.require_interop()

from transformer_mt import cli  # noqa: E402
from transformer_mt.config import registry  # noqa: E402
from transformer_mt.data import sources as data_sources  # noqa: E402
from transformer_mt.data.tokenizer import train_tokenizer  # noqa: E402
from transformer_mt.decoding import beam_decode, loading  # noqa: E402
from transformer_mt.decoding import incremental as decode  # noqa: E402
from transformer_mt.evaluation import corpus_scores  # noqa: E402
from transformer_mt.interop import hf_export  # noqa: E402
from transformer_mt.model import setup as run_setup  # noqa: E402
from transformer_mt.model.transformer import Transformer  # noqa: E402
from transformer_mt.model.transformer_config import TransformerConfig  # noqa: E402
from transformer_mt.workdir import checkpointing  # noqa: E402

pytestmark = pytest.mark.interop

# Logits of one float32 computation run by XLA and by PyTorch, op order aside (beyond
# transformers' own float32 error: test_transformers_logits_equal_ours).
LOGITS_TOLERANCE = 1e-5
# float32 logits (ours or transformers') from transformers' float64 ones: rounding only.
FLOAT32_ROUNDING = 2e-4
BEAM = 4
ALPHA = 0.6
NEW_TOKENS = 24
# CTranslate2's log-probs of the same float32 computation (log-softmax included).
LOG_PROB_TOLERANCE = 1e-5


def _cli(*argv: str) -> None:
  assert cli.main(list(argv)) == 0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  return trained_runs.ExportModels(tmp_path_factory)


@functools.partial(jax.jit, static_argnums=0)
def _logits(config, params, inputs, targets) -> jax.Array:
  """float32 [rows, target_len, vocab]: our teacher-forced logits of int32 `inputs` and
  `targets` (the decoder's inputs), one compiled program per config and shape (an eager
  `apply` compiles each of its ops on its own, ~10x the time here)."""
  return Transformer(config).apply({"params": params}, inputs, targets)


def _batch(ids: list[list[int]], pad_id: int) -> np.ndarray:
  """int64 [rows, longest] of `ids`, padded."""
  rows = np.full((len(ids), max(map(len, ids))), pad_id, np.int64)
  for row, tokens in enumerate(ids):
    rows[row, : len(tokens)] = tokens
  return rows


def _hf(directory):
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
  return model, transformers.AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("name", MODELS)
def test_transformers_logits_equal_ours(exported, name):
  workdir, output, config, params, pairs = exported[name]
  model, hf_tokenizer = _hf(output)
  assert type(model).__name__ == "MarianMTModel"
  ours = checkpointing.read_config(workdir)[1]
  sources = [source for source, _ in pairs[:16]]
  references = [reference for _, reference in pairs[:16]]
  assert hf_tokenizer(sources).input_ids == ours.encode(sources)
  assert hf_tokenizer(text_target=references).input_ids == ours.encode(references)
  inputs = _batch(ours.encode(sources), config.pad_id)  # [16, source_len]
  # The reference after the decoder start token: what teacher forcing reads.
  targets = _batch([[config.decoder_start_id, *t] for t in ours.encode(references)], 0)

  def run(hf_model) -> np.ndarray:  # float64 [16, target_len, vocab]
    with torch.no_grad():
      return (
        hf_model(
          input_ids=torch.tensor(inputs),
          attention_mask=torch.tensor(inputs != config.pad_id),
          decoder_input_ids=torch.tensor(targets),
        )
        .logits.double()
        .numpy()
      )

  theirs, exact = run(model), run(copy.deepcopy(model).double())
  valid = targets != config.pad_id  # the positions of a real target token (and the start)
  valid[:, 0] = True
  # Both are float32 roundings of transformers' float64 logits (`exact`). Measured on these
  # trained models (AMD EPYC): transformers' own float32 logits are up to 1.0e-5 from them, ours
  # up to 1.4e-5 (other op orders; softmax statistics, sinusoids and the tied output projection
  # in float32, which amplifies the last layer's rounding; 3.3e-5 and 8.1e-5 on the
  # ill-conditioned models TRAINING's comment names). A float32 implementation need not be within
  # 1e-5 of transformers' float32; a mapping error (a transposed kernel, a position off by one,
  # a missing scale) moves logits by ~1.
  with jax.default_matmul_precision("highest"):
    logits = _logits(
      config, params, jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32)
    )
  ours_error = np.abs(np.asarray(logits, np.float64) - exact)[valid].max()
  noise = np.abs(theirs - exact)[valid].max()
  assert max(ours_error, noise) <= FLOAT32_ROUNDING, (ours_error, noise)


def _ours(params, config, inputs, beam: int) -> list[list[int]]:
  """Our greedy (beam 1) or beam-`beam` outputs of `inputs`, cut after EOS."""
  with jax.default_matmul_precision("highest"):
    if beam == 1:
      out = decode.greedy_decode(params, jnp.asarray(inputs, jnp.int32), config, NEW_TOKENS)
    else:
      out = beam_decode.beam_decode(
        params,
        jnp.asarray(inputs, jnp.int32),
        config,
        beam_size=beam,
        max_len=NEW_TOKENS,
        alpha=ALPHA,
        length_penalty="power",
        candidate_pool="hf",
      ).sequences
  return [hf_fakes.until_eos(row, config.eos_id) for row in np.asarray(out)]


@pytest.mark.parametrize("name", MODELS)
def test_generate_equals_our_greedy_and_beam_search(exported, name):
  workdir, output, config, params, pairs = exported[name]
  model, hf_tokenizer = _hf(output)
  batch = hf_tokenizer([source for source, _ in pairs[:16]], return_tensors="pt", padding=True)
  outputs = {}
  for beam in (1, BEAM):
    # The export's generation_config.json: suppressed PAD and BOS, renormalized, no forced EOS.
    with torch.no_grad():
      theirs = model.generate(
        **batch,
        num_beams=beam,
        length_penalty=ALPHA,
        early_stopping="never",
        max_new_tokens=NEW_TOKENS,
      ).numpy()
    theirs = [hf_fakes.until_eos(row[1:], config.eos_id) for row in theirs]  # start dropped
    ours = _ours(params, config, batch["input_ids"].numpy(), beam)
    assert ours == theirs, beam
    outputs[beam] = ours
  # Otherwise the comparison would prove little: outputs that depend on the source, and a
  # search that finds what greedy decoding does not on some rows.
  # (Three in four distinct: both models give 8 of 8, TRAINING's comment.)
  greedy = [tuple(row) for row in outputs[1][:SEEN]]
  assert len(set(greedy)) >= 3 * len(greedy) // 4, greedy
  for row in greedy:
    assert len(set(row) - {config.pad_id, config.eos_id}) >= hf_fakes.MIN_DISTINCT, greedy
  assert sum(g != b for g, b in zip(outputs[1], outputs[BEAM])) >= 2, outputs


def _marian_order(params, config) -> dict:
  """Our params ("/"-joined path -> array) with every d_model axis in Marian's order, as an
  import of the export has them: the paper's interleaved encoding has the sine of frequency i
  at dim 2i and its cosine at 2i + 1, Marian's all sines first."""
  d = config.d_model
  order = np.r_[0:d:2, 1:d:2] if config.position_encoding == "sinusoidal" else np.arange(d)
  axes = hf_export.embed_axes(config)
  flat = {}
  for path, value in _flat(params).items():
    for axis in axes[path]:
      value = np.take(value, order, axis=axis)
    flat[path] = value
  return flat


def _flat(params) -> dict:
  return {
    "/".join(k.key for k in path): np.asarray(value)
    for path, value in jax.tree_util.tree_flatten_with_path(params)[0]
  }


@pytest.mark.parametrize("name", MODELS)
def test_import_of_the_export_gives_back_the_model(exported, name, tmp_path):
  workdir, output, config, params, pairs = exported[name]
  imported = str(tmp_path / "imported")
  _cli("import", "--from", f"hf:{output}", "--workdir", imported)
  saved, tokenizer, step = checkpointing.read_config(imported)
  back = _flat(hf_export.read_params(imported, step, saved, tokenizer))
  expected = _marian_order(params, config)
  # Marian always has a logits bias: zero when ours has none.
  if "logits_bias" not in expected:
    np.testing.assert_array_equal(back.pop("logits_bias"), 0.0)
  assert sorted(back) == sorted(expected)
  for path in expected:
    np.testing.assert_array_equal(back[path], expected[path], err_msg=path)
  # The same translations, decoded alike (the import's own settings are generate's).
  lines = [source for source, _ in pairs[:16]]
  settings = ["decode.length_penalty='power'", "decode.candidate_pool='hf'", "decode.max_len=24"]
  for beam in (1, BEAM):
    texts = [
      loading.load_translator(w, beam_size=beam, alpha=ALPHA, decode_overrides=settings).translate(
        lines
      )
      for w in (workdir, imported)
    ]
    assert texts[0] == texts[1], beam


marian_dir = hf_fakes.marian_dir  # the fixture: a tiny trained Marian model and tokenizer


def test_an_imported_marian_model_exports_back_to_itself(marian_dir, tmp_path):
  imported, back = str(tmp_path / "imported"), str(tmp_path / "export")
  _cli("import", "--from", f"hf:{marian_dir}", "--workdir", imported)
  _cli("export", "--workdir", imported, "--to", "hf", back)
  (original, tokenizer), (again, again_tokenizer) = _hf(marian_dir), _hf(back)
  lines = hf_fakes.news_lines("en", *hf_fakes.MARIAN_TRANSLATED)
  assert again_tokenizer(lines).input_ids == tokenizer(lines).input_ids
  # Every weight as it was, but the key biases: softmax cancels them, we keep none, and the
  # export writes zeros.
  theirs, ours = original.state_dict(), again.state_dict()
  assert sorted(theirs) == sorted(ours)
  for name in theirs:
    expected = 0.0 if name.endswith("k_proj.bias") else theirs[name].numpy()
    np.testing.assert_array_equal(ours[name].numpy(), expected, err_msg=name)
  batch = tokenizer(lines, return_tensors="pt", padding=True)
  with torch.no_grad():
    outputs = [
      # One generation config for both (the export's says how ours decodes, not the original's).
      model.generate(
        **batch,
        generation_config=original.generation_config,
        num_beams=BEAM,
        max_new_tokens=NEW_TOKENS,
      ).numpy()
      for model in (original, again)
    ]
    logits = [
      model(**batch, decoder_input_ids=torch.tensor(outputs[0])).logits.numpy()
      for model in (original, again)
    ]
  np.testing.assert_array_equal(outputs[0], outputs[1])
  assert np.abs(logits[0] - logits[1]).max() <= LOGITS_TOLERANCE


def _error_line(capsys) -> str:
  lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
  assert len(lines) == 1, lines
  return lines[0]


def _random_workdir(directory: str, **model) -> tuple[str, list]:
  """(A workdir holding one checkpoint of random params of the tiny demo model changed by
  `model` (TransformerConfig fields), 16 held-out pairs): a model that need not be trained to
  be refused, or to be compared teacher-forced. Its tokenizer is trained on the pairs (~1 s)."""
  config = registry.load_experiment("demo", TRAINING)
  config.model.update(model)
  splits = data_sources.load_pairs(config.data)
  tokenizer = train_tokenizer(
    splits["train"], config.tokenizer.vocab_size, config.tokenizer.model_type, 2000
  )
  model_config = run_setup.model_config_for(config, tokenizer)
  params = jax.device_get(helpers.init_params(model_config))
  checkpointing.save_inference(directory, 0, params, config, tokenizer)
  return directory, list(splits["test"][:16])


@pytest.mark.parametrize(
  "change, named",
  [
    pytest.param(dict(layer_norm_position="pre"), "pre-LN", id="pre_ln"),
    pytest.param(dict(position_encoding="learned"), "'learned'", id="learned"),
    pytest.param(
      dict(position_encoding="sinusoidal_fairseq", position_offset=2), "fairseq", id="fairseq"
    ),
    pytest.param(dict(position_offset=2), "position_offset=2", id="offset"),
    pytest.param(dict(share_embeddings=False), "share_embeddings=False", id="untied"),
    pytest.param(dict(embedding_layer_norm=True), "embedding_layer_norm", id="embedding_norm"),
    pytest.param(dict(head_dim=8), "head_dim=8", id="head_dim"),
    pytest.param(dict(use_bias=False), "use_bias=False", id="no_bias"),
    pytest.param(dict(layer_norm_epsilon=1e-6), "layer_norm_epsilon=1e-06", id="epsilon"),
  ],
)
def test_what_marian_does_not_compute_is_named(change, named):
  exact = TransformerConfig(layer_norm_epsilon=1e-5)
  assert hf_export.marian_differences(exact) == []
  assert hf_export.marian_differences(exact.replace(position_encoding="sinusoidal_halves")) == []
  differences = hf_export.marian_differences(exact.replace(**change))
  assert named in differences[0], differences
  # CTranslate2's models carry their own epsilon: only that difference is not one there.
  rest = hf_export.marian_differences(exact.replace(**change), fixed_epsilon=False)
  assert rest == ([] if "layer_norm_epsilon" in change else differences)


def test_refused_export_writes_nothing(tmp_path, capsys):
  pre_ln, _ = _random_workdir(str(tmp_path / "pre_ln"), layer_norm_position="pre")
  out = tmp_path / "exports"
  out.mkdir()
  for target in ("hf", "ctranslate2"):
    assert cli.main(["export", "--workdir", pre_ln, "--to", target, str(out / "x")]) == 2
    line = _error_line(capsys)
    assert "pre-LN" in line and "not exported" in line, line
  assert cli.main(["export", "--workdir", pre_ln, "--to", "onnx", str(out / "x")]) == 2
  assert "--to onnx" in _error_line(capsys)
  assert not list(out.iterdir())  # no export, no temporary folder


def test_a_failed_export_leaves_no_directory(tmp_path, monkeypatch, capsys):
  def fail_half_way(directory, *args):
    pathlib.Path(directory, "config.json").write_text("{")
    raise OSError("No space left on device")

  monkeypatch.setattr(hf_export, "write_marian", fail_half_way)
  out = tmp_path / "exports"
  out.mkdir()
  workdir, _ = _random_workdir(str(tmp_path / "w"))
  argv = ["export", "--workdir", workdir, "--to", "hf", str(out / "x")]
  assert cli.main(argv) == 1  # not a user error: a traceback
  assert not list(out.iterdir())
  capsys.readouterr()
  existing = out / "taken"
  existing.mkdir()
  monkeypatch.undo()
  assert cli.main(["export", "--workdir", workdir, "--to", "hf", str(existing)]) == 2
  assert "already exists" in _error_line(capsys)


# CTranslate2 (the ctranslate2 extra).


def _ctranslate2():
  return pytest.importorskip(
    "ctranslate2", reason="needs the ctranslate2 extra: pip install -e '.[ctranslate2]'"
  )


def _ctranslate2_export(workdir: str, directory: str, quantization: str | None = None):
  ctranslate2 = _ctranslate2()
  argv = ["export", "--workdir", workdir, "--to", "ctranslate2", directory]
  _cli(*argv, *(["--quantization", quantization] if quantization else []))
  return ctranslate2.Translator(directory, device="cpu", compute_type="float32")


def _our_log_probs(params, config, sources, targets) -> list[np.ndarray]:
  """Our teacher-forced log-probs of each target token (EOS included)."""
  inputs = _batch(sources, config.pad_id)
  decoder_in = _batch([[config.decoder_start_id, *t[:-1]] for t in targets], config.pad_id)
  with jax.default_matmul_precision("highest"):
    logits = _logits(
      config, params, jnp.asarray(inputs, jnp.int32), jnp.asarray(decoder_in, jnp.int32)
    )
  log_probs = np.asarray(jax.nn.log_softmax(logits))  # [rows, target_len, vocab]
  return [log_probs[row, np.arange(len(t)), t] for row, t in enumerate(targets)]


def _hf_log_probs(directory, sources, targets, exact: bool = True) -> list[np.ndarray]:
  """transformers' teacher-forced log-probs of each target token (EOS included) by the Marian
  export in `directory`: in float64 (`exact`), the model's exact values as far as float32
  goes; else in float32, as the export computes them in PyTorch."""
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
  model = model.double() if exact else model
  inputs = _batch(sources, 0)
  decoder_in = _batch([[model.config.decoder_start_token_id, *t[:-1]] for t in targets], 0)
  with torch.no_grad():
    logits = model(
      input_ids=torch.tensor(inputs),
      attention_mask=torch.tensor(inputs != model.config.pad_token_id),
      decoder_input_ids=torch.tensor(decoder_in),
    ).logits
  log_probs = torch.log_softmax(logits.double(), -1).numpy()
  return [log_probs[row, np.arange(len(t)), t] for row, t in enumerate(targets)]


@pytest.mark.parametrize("name", [*MODELS, "epsilon_1e-6"])
def test_ctranslate2_scores_equal_ours(exported, name, tmp_path):
  _ctranslate2()
  if name in MODELS:
    workdir, hf_directory, config, params, pairs = exported[name]
  else:  # any epsilon converts: CTranslate2's model carries it (transformers' Marian cannot)
    workdir, pairs = _random_workdir(str(tmp_path / "w"), layer_norm_epsilon=1e-6)
    saved, tokenizer, _ = checkpointing.read_config(workdir)
    config = run_setup.model_config_for(saved, tokenizer).replace(deterministic=True)
    params, hf_directory = hf_export.read_params(workdir, 0, saved, tokenizer), None
  translator = _ctranslate2_export(workdir, str(tmp_path / "ct2"))
  tokenizer = checkpointing.read_config(workdir)[1]
  sources = tokenizer.encode([s for s, _ in pairs[:16]])
  targets = tokenizer.encode([t for _, t in pairs[:16]])
  results = translator.score_batch(
    [tokenizer.pieces(s) for s in sources], [tokenizer.pieces(t[:-1]) for t in targets]
  )  # CTranslate2 appends EOS to each target itself
  theirs = [np.asarray(r.log_probs, np.float64) for r in results]
  ours = _our_log_probs(params, config, sources, targets)
  if hf_directory is None:  # a random model: no ill-conditioned positions
    excess = [np.abs(t - o) for t, o in zip(theirs, ours)]
  else:  # CTranslate2 no further from the exact values than our float32 (+ the tolerance)
    exact = _hf_log_probs(hf_directory, sources, targets)
    excess = [np.abs(t - e) - np.abs(o - e) for t, o, e in zip(theirs, ours, exact)]
    # What the comparison rests on: the model's float32 rounding, here transformers' own
    # float32 (the op order CTranslate2 follows), well inside the tolerance at every position.
    # An ill-conditioned model (attention logits ~1e4: TRAINING's comment) puts every float32
    # implementation ~2e-5 off at a near-tie, ours or CTranslate2's by luck of the op order.
    torch32 = _hf_log_probs(hf_directory, sources, targets, exact=False)
    noise = max(np.abs(f - e).max() for f, e in zip(torch32, exact))
    assert noise <= LOG_PROB_TOLERANCE, f"the fixture model is ill-conditioned: {noise}"
  assert max(e.max() for e in excess) <= LOG_PROB_TOLERANCE


def test_ctranslate2_bleu_is_ours(exported, tmp_path):
  _ctranslate2()
  workdir, _, config, params, pairs = exported["demo"]
  translator = _ctranslate2_export(workdir, str(tmp_path / "ct2"))
  tokenizer = checkpointing.read_config(workdir)[1]
  # What a user of the export reads pieces with: the SentencePiece model copied beside it.
  target_spm = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "ct2" / "target.spm"))
  sources = [s for s, _ in pairs]
  references = [t for _, t in pairs]
  # CTranslate2's search (patience 1: a sentence is done once BEAM hypotheses have finished) is
  # our candidate pool "fairseq" (benchmarks/ctranslate2_decode.py), not generate's "hf", which
  # searches on: on the memorized rows CTranslate2 stops with 4 short hypotheses finished (one
  # token skipped at -5 nats) while a live beam still leads by its own length-normalized score.
  # They part only at the length limit (fairseq ends a repetition with EOS, CTranslate2 cuts).
  settings = [
    "decode.length_penalty='power'",
    "decode.candidate_pool='fairseq'",
    "decode.max_len=64",
  ]
  ours = loading.load_translator(
    workdir, beam_size=BEAM, alpha=ALPHA, decode_overrides=settings
  ).translate(sources)
  results = translator.translate_batch(
    [tokenizer.pieces(ids) for ids in tokenizer.encode(sources)],
    beam_size=BEAM,
    length_penalty=ALPHA,
    max_decoding_length=64,
    suppress_sequences=[["<pad>"], ["<s>"]],
  )
  theirs = [target_spm.decode(r.hypotheses[0]) for r in results]
  bleu = [corpus_scores.corpus_bleu(h, references)[0] for h in (ours, theirs)]
  differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
  assert abs(bleu[0] - bleu[1]) <= 0.1, (bleu, differ)

"""`run.py import` of mBART-cc25, mBART-50 and NLLB-200: same ids, same text, same translations
as transformers, language tags included.

For each kind a tiny real tokenizer is built (tests/hf_kinds.py's `build_and_import`) the way
the published ones are: a SentencePiece model trained on 3000 lines of news text (unigram for
mBART, BPE for NLLB), turned into the transformers tokenizer (fairseq id layout, language codes
after the pieces) and saved with `save_pretrained` beside a tiny model (tests/hf_fakes.py's
sizes) trained (hf_fakes.train_to_translate) to translate the sentences the translation test
decodes into random targets, after its target code as generate feeds it. The directory is
imported with the CLI, then compared with transformers on 300 unseen sentences (ids and decoded
text) and on greedy and beam translations, whose target language comes in as the decoder's first
input (mBART-cc25) or as a forced first token (mBART-50, NLLB).

Select with `-m interop`; skipped without transformers (>= 5), torch, or the shared news data
(under CI a skip fails: tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import types

import hf_fakes
import jax.numpy as jnp
import numpy as np
import pytest

torch, transformers = hf_fakes.require_interop()
import hf_kinds  # noqa: E402
from hf_kinds import KINDS, MAX_NEW_TOKENS, build_and_import, translated_lines  # noqa: E402

from transformer_mt import cli  # noqa: E402
from transformer_mt.data import multilingual_tokenizers as hf_tokenizers  # noqa: E402
from transformer_mt.decoding import beam_decode, loading  # noqa: E402
from transformer_mt.decoding import incremental as decode  # noqa: E402
from transformer_mt.workdir import checkpointing  # noqa: E402

pytestmark = pytest.mark.interop

# The fixture: model type -> a SentencePiece model trained on English and German news lines.
sentencepiece_models = hf_kinds.sentencepiece_models
_hf_tokenizer = hf_kinds.hf_tokenizer


@pytest.fixture(scope="module", params=list(KINDS))
def imported(request, sentencepiece_models, tmp_path_factory):
  """(kind, save_pretrained directory, imported workdir) of a tiny model of each kind."""
  kind = request.param
  return kind, *build_and_import(kind, sentencepiece_models, tmp_path_factory)


def test_tokenizer_matches_transformers(imported):
  kind, directory, workdir = imported
  _, _, _, source, target, _ = KINDS[kind]
  theirs = _hf_tokenizer(kind, directory, src_lang=source, tgt_lang=target)
  # Through the checkpoint: what translate restores (tokenizer.json and the kind marker).
  _, ours, _ = checkpointing.read_config(str(workdir))
  assert isinstance(ours, hf_tokenizers.LanguageTagTokenizer) and ours.kind == kind
  ours = ours.with_languages(source, target)
  english = hf_fakes.news_lines("en", 2000, 2300)  # none of them trained the SentencePiece model
  expected = theirs(english).input_ids
  assert ours.encode(english) == expected
  tag = theirs.convert_tokens_to_ids(source)
  assert expected[0][0 if kind != "mbart" else -1] == tag  # the placement really differs
  assert (ours.pad_id, ours.eos_id, ours.vocab_size) == (
    theirs.pad_token_id,
    theirs.eos_token_id,
    len(theirs),
  )

  german = theirs(text_target=hf_fakes.news_lines("de", 2000, 2100)).input_ids  # target code tagged
  rng = np.random.default_rng(0)
  # What a model may write: any ids (language codes, <mask>, <unk>, pad) before EOS.
  ordinary = np.array([i for i in range(ours.vocab_size) if i != ours.eos_id])
  random_ids = [list(rng.choice(ordinary, 20)) + [ours.eos_id] for _ in range(20)]
  for ids in expected + german + random_ids:
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids


def _generate(kind: str, directory, lines: list[str], suppressed: list[int], num_beams: int = 1):
  """(texts, ids [batch, steps]) of transformers' translations, the target language as the
  published models take it:
  decoder_start_token_id (mBART-cc25) or forced_bos_token_id (mBART-50, NLLB). Beam search
  runs to completion (early_stopping="never"), as ours does; length_penalty is the model's
  (1.0 here), which the import saved as decode.alpha."""
  _, _, _, source, target, _ = KINDS[kind]
  tokenizer = _hf_tokenizer(kind, directory, src_lang=source)
  target_id = tokenizer.convert_tokens_to_ids(target)
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
  inputs = tokenizer(lines, return_tensors="pt", padding=True)
  language = (
    dict(decoder_start_token_id=target_id, forced_bos_token_id=None)
    if kind == "mbart"
    else dict(decoder_start_token_id=tokenizer.eos_token_id, forced_bos_token_id=target_id)
  )
  outputs = hf_fakes.generate(
    model,
    inputs,
    MAX_NEW_TOKENS,
    suppressed,
    num_beams,
    **language,
    early_stopping="never",
    length_penalty=1.0,
  )
  return tokenizer.batch_decode(outputs, skip_special_tokens=True), outputs.numpy()


@pytest.mark.parametrize("beam", [1, 4])
def test_imported_workdir_translates_like_generate(imported, beam, tmp_path, capsys):
  kind, directory, workdir = imported
  lines = translated_lines()
  (tmp_path / "input.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  output = tmp_path / "output.txt"
  argv = ["translate", "--workdir", str(workdir), "--beam", str(beam)]
  rc = cli.main(argv + ["--input", str(tmp_path / "input.txt"), "--output", str(output)])
  assert rc == 0, capsys.readouterr().err
  ours = output.read_text(encoding="utf-8").splitlines()

  translator = loading.load_translator(str(workdir))
  config = translator.model_config
  target_id = translator.tokenizer.language_id(KINDS[kind][4])
  if kind == "mbart":
    assert (config.decoder_start_id, translator.forced_first_id) == (target_id, None)
  else:
    assert (config.decoder_start_id, translator.forced_first_id) == (config.eos_id, target_id)
  # Beam search as generate does it: the import saved transformers' pool and penalty.
  assert (translator.candidate_pool, translator.length_penalty, translator.alpha) == (
    "hf",
    "power",
    1.0,
  )
  theirs, ids = _generate(kind, directory, lines, list(config.suppressed_ids), beam)
  # Otherwise the comparison would prove little: rows that differ, each of several tokens
  # (ids[:, 0]: the decoder start; the target code is special).
  special = (config.pad_id, config.eos_id, config.decoder_start_id, target_id)
  hf_fakes.assert_varied(ids[:, 1:], special, config.eos_id)
  assert ours == theirs
  assert not any(KINDS[kind][4] in line for line in ours)  # the code is not part of the text


# Not mBART-cc25: it starts from the target code, nothing is forced.
@pytest.mark.parametrize("imported", ["mbart50", "nllb"], indirect=True)
def test_forced_first_token_beam_one_equals_greedy(imported):
  """beam_decode forces the same first token as greedy decoding, at no cost: beam 1 == greedy."""
  _, _, workdir = imported
  translator = loading.load_translator(str(workdir))
  forced = translator.forced_first_id
  inputs = jnp.asarray(
    translator.padded_batch(translator.tokenizer.encode(hf_fakes.news_lines("en", 2600, 2604)))[0]
  )
  greedy = decode.greedy_decode(
    translator.params, inputs, translator.model_config, MAX_NEW_TOKENS, forced_first_id=forced
  )
  beam = beam_decode.beam_decode(
    translator.params,
    inputs,
    translator.model_config,
    1,
    MAX_NEW_TOKENS,
    forced_first_id=forced,
  )
  greedy, sequences = np.asarray(greedy), np.asarray(beam.sequences)
  assert (greedy[:4, 0] == forced).all()
  np.testing.assert_array_equal(sequences[:4], greedy[:4])
  # Unforced, the random model starts otherwise: the forcing is what put the code there.
  unforced = np.asarray(
    decode.greedy_decode(translator.params, inputs, translator.model_config, MAX_NEW_TOKENS)
  )
  assert (unforced[:4, 0] != forced).any()


def _error_line(capsys) -> str:
  lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
  assert len(lines) == 1, lines
  return lines[0]


def test_language_errors_are_one_line(imported, tmp_path, capsys):
  kind, directory, workdir = imported
  _, _, _, source, target, _ = KINDS[kind]
  (tmp_path / "input.txt").write_text("Hello.\n", encoding="utf-8")
  argv = ["translate", "--workdir", str(workdir), "--input", str(tmp_path / "input.txt")]
  misspelt = target[:-1] + ("x" if target[-1] != "x" else "y")
  assert cli.main(argv + ["--tgt_lang", misspelt]) == 2
  line = _error_line(capsys)
  assert f"--tgt_lang {misspelt!r}" in line and target in line  # the closest code is named

  # Imported without languages: translate asks for them.
  bare = tmp_path / "bare"
  assert cli.main(["import", "--from", f"hf:{directory}", "--workdir", str(bare)]) == 0
  capsys.readouterr()
  bare_argv = ["translate", "--workdir", str(bare), "--input", str(tmp_path / "input.txt")]
  assert cli.main(bare_argv) == 2
  assert "pass --src_lang and --tgt_lang" in _error_line(capsys)
  assert cli.main(bare_argv + ["--src_lang", source, "--tgt_lang", target]) == 0
  capsys.readouterr()

  # An unknown code at import: nothing written.
  target_dir = tmp_path / "bad_import"
  bad = ["import", "--from", f"hf:{directory}", "--workdir", str(target_dir)]
  assert cli.main(bad + ["--src_lang", "xx_YY"]) == 2
  assert "--src_lang 'xx_YY' is not a language code" in _error_line(capsys)
  assert not target_dir.exists()


def test_models_without_tags_take_no_languages():
  plain = types.SimpleNamespace()  # our tokenizers and Marian's have no `languages`
  assert loading.with_languages(plain, None, None, None, "w") == (plain, None, None)
  with pytest.raises(ValueError, match="--tgt_lang: the model in w has no language tags"):
    loading.with_languages(plain, None, None, "de", "w")


@pytest.mark.parametrize("imported", ["nllb"], indirect=True)  # an m2m_100 model only
def test_m2m100_tokenizer_is_refused(imported, tmp_path, capsys):
  _, directory, _ = imported
  copy = tmp_path / "m2m100"
  shutil.copytree(directory, copy)
  config = json.loads((copy / "tokenizer_config.json").read_text())
  (copy / "tokenizer_config.json").write_text(
    json.dumps(dict(config, tokenizer_class="M2M100Tokenizer"))
  )
  target = tmp_path / "from_m2m100"
  assert cli.main(["import", "--from", f"hf:{copy}", "--workdir", str(target)]) == 2
  assert "only NLLB-200" in _error_line(capsys)
  assert not target.exists()

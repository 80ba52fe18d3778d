"""`run.py import` of a Hugging Face Marian model: same tokens, same translations as transformers.

A tiny MarianMTModel (tests/hf_fakes.py's sizes) gets a real, tiny MarianTokenizer: two
SentencePiece models trained here on 200 lines of newstest2013 (English source, German target)
and a vocab.json numbering their pieces, as OPUS-MT's do. The model is trained
(hf_fakes.train_to_translate) to translate the sentences the CLI test translates into random
targets, so that what it writes depends on the source. Both are saved with `save_pretrained`
into one directory, imported with the CLI, and compared on real sentences.

Select with `-m interop`; skipped without transformers (>= 5), torch, or the shared news data
(under CI a skip fails: tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import pathlib

import hf_fakes
import numpy as np
import pytest

torch, transformers = hf_fakes.require_interop()

from transformer_mt import cli  # noqa: E402
from transformer_mt.commands import paths  # noqa: E402
from transformer_mt.data.tokenizer import VocabTokenizer  # noqa: E402
from transformer_mt.decoding import loading  # noqa: E402
from transformer_mt.interop import hf_import  # noqa: E402
from transformer_mt.workdir import checkpointing  # noqa: E402

pytestmark = pytest.mark.interop

marian_dir = hf_fakes.marian_dir  # the fixture: a tiny trained Marian model and tokenizer

# Target tokens both decoders generate at most: our decode.max_len, their max_new_tokens.
MAX_NEW_TOKENS = 16


def test_tokenizer_matches_marian_tokenizer(marian_dir):
  theirs = transformers.MarianTokenizer.from_pretrained(marian_dir)
  ours, _ = hf_import.read_marian_tokenizer(str(marian_dir))
  english = hf_fakes.news_lines("en", 1000, 1300)  # none of them trained the SentencePiece models
  assert ours.encode(english) == theirs(english).input_ids
  assert (ours.pad_id, ours.eos_id, ours.vocab_size) == (
    theirs.pad_token_id,
    theirs.eos_token_id,
    len(theirs),
  )

  german = theirs(text_target=hf_fakes.news_lines("de", 1000, 1010)).input_ids
  rng = np.random.default_rng(0)
  # What a random model writes: any ids (pieces only the source model has, unk, pad) before EOS;
  # transformers does not stop at EOS, ours does (test_hf_models.py compares ids up to it).
  ordinary = np.array([i for i in range(ours.vocab_size) if i != ours.eos_id])
  random_ids = [list(rng.choice(ordinary, 20)) + [ours.eos_id] for _ in range(10)]
  for ids in german + random_ids:
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids

  restored = VocabTokenizer.from_files(ours.files())
  assert restored.encode(english[:5]) == ours.encode(english[:5])


def _generate(directory, lines: list[str]):
  """(texts, ids [batch, 1 + steps]) of transformers' greedy translations, with the generation
  switches we do not have turned off as in test_hf_models.py."""
  tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
  model = transformers.MarianMTModel.from_pretrained(directory).eval()
  inputs = tokenizer(lines, return_tensors="pt", padding=True)
  outputs = hf_fakes.generate(model, inputs, MAX_NEW_TOKENS, [tokenizer.pad_token_id])
  return tokenizer.batch_decode(outputs, skip_special_tokens=True), outputs.numpy()


def test_imported_workdir_translates_like_generate(marian_dir, tmp_path, capsys):
  workdir = tmp_path / "imported"
  source = f"hf:{marian_dir}"
  rc = cli.main(
    ["import", "--from", source, "--workdir", str(workdir), f"decode.max_len={MAX_NEW_TOKENS}"]
  )
  assert rc == 0, capsys.readouterr().err
  lines = hf_fakes.news_lines("en", *hf_fakes.MARIAN_TRANSLATED)
  (tmp_path / "input.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  output = tmp_path / "output.txt"
  argv = ["translate", "--workdir", str(workdir), "--beam", "1"]
  rc = cli.main(argv + ["--input", str(tmp_path / "input.txt"), "--output", str(output)])
  assert rc == 0, capsys.readouterr().err
  ours = output.read_text(encoding="utf-8").splitlines()
  theirs, ids = _generate(marian_dir, lines)
  # Otherwise the comparison would prove little: translations that differ, each of several
  # tokens, some ended by EOS, some cut at MAX_NEW_TOKENS. ids[:, 0]: the decoder start.
  config = checkpointing.read_config(str(workdir))[0].model
  hf_fakes.assert_varied(ids[:, 1:], (config.pad_id, config.eos_id), config.eos_id)
  ended = [config.eos_id in row[1:] for row in ids]
  assert any(ended) and not all(ended), ids
  assert ours == theirs

  # Params, config and tokenizer only: no optimizer state is saved, restored or built.
  step_dir = pathlib.Path(checkpointing.checkpoint_dir(str(workdir))) / "0"
  assert sorted(p.name for p in step_dir.iterdir() if p.is_dir()) == [
    "config",
    "params",
    "tokenizer",
  ]
  translator = loading.load_translator(str(workdir))
  assert isinstance(translator.tokenizer, VocabTokenizer)
  assert "encoder_layers_0" in translator.params
  assert not {"opt_state", "mu", "nu", "step"} & set(translator.params)
  config, _, _ = checkpointing.read_config(str(workdir))
  assert (config.init.source, config.init.name, config.init.from_hub) == (
    "hf",
    marian_dir.name,
    False,
  )
  assert str(tmp_path) not in json.dumps(config.to_dict())  # workdirs hold no absolute paths


def _error_line(capsys) -> str:
  lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
  assert len(lines) == 1, lines
  return lines[0]


def test_import_errors_are_one_line_and_write_nothing(marian_dir, tmp_path, capsys):
  workdir = tmp_path / "imported"
  assert cli.main(["import", "--from", f"hf:{marian_dir}", "--workdir", str(workdir)]) == 0
  capsys.readouterr()
  assert cli.main(["import", "--from", f"hf:{marian_dir}", "--workdir", str(workdir)]) == 2
  assert "already holds checkpoints" in _error_line(capsys)

  # An unsupported model type, and an importable one (FSMT) saved without its tokenizer.
  refused = {
    "bart": "Cannot import Hugging Face model_type 'bart'",
    "fsmt": "lacks the FSMT tokenizer files",
  }
  for model_type, message in refused.items():
    directory = tmp_path / model_type
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    target = tmp_path / f"from_{model_type}"
    assert cli.main(["import", "--from", f"hf:{directory}", "--workdir", str(target)]) == 2
    assert message in _error_line(capsys)
    assert not target.exists()

  no_tokenizer = tmp_path / "no_tokenizer"
  no_tokenizer.mkdir()
  for name in os.listdir(marian_dir):
    if not name.endswith((".spm", "vocab.json")):
      (no_tokenizer / name).write_bytes((marian_dir / name).read_bytes())
  target = tmp_path / "from_no_tokenizer"
  assert cli.main(["import", "--from", f"hf:{no_tokenizer}", "--workdir", str(target)]) == 2
  assert "lacks the Marian tokenizer files" in _error_line(capsys)
  assert cli.main(["import", "--from", f"hf:{tmp_path}/missing", "--workdir", str(target)]) == 2
  assert "no such directory" in _error_line(capsys)
  assert not target.exists()
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_relative_sources_become_absolute_and_hub_names_stay(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "models" / "opus").mkdir(parents=True)
  assert paths.absolute_source("hf:models/opus") == f"hf:{tmp_path}/models/opus"
  assert paths.absolute_source("hf:Helsinki-NLP/opus-mt-en-de") == "hf:Helsinki-NLP/opus-mt-en-de"


def test_hub_downloads_one_weight_format():
  with_safetensors = ["config.json", "model.safetensors", "pytorch_model.bin", "source.spm"]
  patterns = hf_import.hub_patterns(with_safetensors)
  assert "model.safetensors" in patterns and "source.spm" in patterns
  assert not [p for p in patterns if p.startswith("pytorch_model")]
  # NLLB-200 3.3B: three .bin shards and their index, no safetensors.
  sharded_bin = ["config.json", "pytorch_model-00001-of-00003.bin", "pytorch_model.bin.index.json"]
  patterns = hf_import.hub_patterns(sharded_bin)
  assert {"pytorch_model-*.bin", "pytorch_model.bin.index.json"} <= set(patterns)


def test_registry_row_of_a_published_model_imports_evaluates_and_reports(
  marian_dir, tmp_path, capsys
):
  """`reproduce opus_mt_en_de_newstest2014` with a local copy of the model (init.from=hf:DIR)
  and a 12-line test set: import into WORKDIR/pretrained, evaluate it as it is (no training),
  results.json with the published figure's source, shown by `report`."""
  root = tmp_path / "data"
  (root / "news" / "en-de").mkdir(parents=True)
  for lang in ("en", "de"):
    text = "".join(line + "\n" for line in hf_fakes.news_lines(lang, 300, 312))
    (root / "news" / "en-de" / f"newstest2014.{lang}").write_text(text, encoding="utf-8")
  workdir = tmp_path / "opus_row"
  argv = [
    "reproduce",
    "--experiment",
    "opus_mt_en_de_newstest2014",
    "--workdir",
    str(workdir),
    f"init.from=hf:{marian_dir}",
    f"data.root={root}",
    f"decode.max_len={MAX_NEW_TOKENS}",
  ]
  assert cli.main(argv) == 0, capsys.readouterr().err
  results = json.loads((workdir / "results.json").read_text())
  assert results["steps"] == 0 and results["test_sentences"] == 12
  assert results["paper_bleu"] is None and "no newstest2014 score" in results["paper_bleu_source"]
  assert checkpointing.all_steps(str(workdir / "pretrained")) == [0]
  assert not (workdir / "checkpoints").exists()  # nothing trained
  # The import's saved config evaluates the row's test set; its languages are the row's.
  saved, _, _ = checkpointing.read_config(str(workdir / "pretrained"))
  assert saved.data.test_prefixes == ["news/en-de/newstest2014"] and saved.data.source == "local"
  capsys.readouterr()
  assert cli.main(["report", str(workdir)]) == 0
  report = capsys.readouterr().out
  assert "| opus_mt_en_de_newstest2014 | – |" in report
  assert "Published figures:" in report and "newstest2013 26.9" in report
  # Rerunning reuses the import rather than importing again.
  mtime = (workdir / "pretrained" / "checkpoints").stat().st_mtime_ns
  assert cli.main(argv) == 0
  assert (workdir / "pretrained" / "checkpoints").stat().st_mtime_ns == mtime

"""Every importable kind, end to end: an FSMT import translates as transformers does, and the
imports of FSMT, mBART-cc25 and NLLB fine-tune (Marian: test_finetune_import.py).

The FSMT model is tiny (tests/hf_fakes.py's sizes), over the real tokenizer that
tests/hf_kinds.py builds from news text (test_fsmt_tokenizer.py tests it), and trained
(hf_fakes.train_to_translate) to translate the sentences it is tested on into random targets;
`run.py import` then `run.py translate --beam 1` must write what transformers' greedy `generate`
decodes. mBART-cc25 and NLLB are the tiny models of test_hf_languages.py (built by hf_kinds).
Each import is fine-tuned with `run.py train init.from=` on ~200 short newstest2013 pairs
(hf_kinds.data_root, as test_finetune_import.py does): the loss falls. For NLLB, stopping at
step k and resuming is bit-identical to an uninterrupted run (one kind only: each run costs
~20 s on 2 cores; Marian's test covers the same for its kind). The packed batches hold what
transformers' tokenizers and `shift_tokens_right` make of the same pairs: NLLB's targets start
with the target code, mBART-cc25's decoder inputs do.

Select with `-m interop`; skipped without transformers (>= 5), torch, or the shared news data.
"""

from __future__ import annotations

import shutil

import hf_fakes
import jax
import numpy as np
import pytest

torch, transformers = hf_fakes.require_interop()
import hf_kinds  # noqa: E402
from helpers import losses_by_step  # noqa: E402

from transformer_mt import cli  # noqa: E402
from transformer_mt.config import registry  # noqa: E402
from transformer_mt.data import input_pipeline  # noqa: E402
from transformer_mt.data.fsmt_tokenizer import FsmtTokenizer  # noqa: E402
from transformer_mt.decoding import loading  # noqa: E402
from transformer_mt.model import setup as run_setup  # noqa: E402
from transformer_mt.training import finetune  # noqa: E402
from transformer_mt.workdir import checkpointing  # noqa: E402

pytestmark = pytest.mark.interop

# The fixtures these tests build on: FSMT tokenizer directories (en->de, de->en), SentencePiece
# models for mBART and NLLB, and the local training files.
hf_dirs = hf_kinds.hf_dirs
sentencepiece_models = hf_kinds.sentencepiece_models
data_root = hf_kinds.data_root
# fairseq's special ids, which the FSMT tokenizer's vocabularies share.
SPECIALS = hf_kinds.SPECIALS

# Target tokens both decoders generate at most: our decode.max_len, their max_new_tokens.
MAX_NEW_TOKENS = 16
# The lengths (EOS excluded) of the targets the FSMT model learns for the sentences it
# translates: some longer than MAX_NEW_TOKENS, so cut there.
FSMT_TARGET_LENGTHS = (6, 12, 19, 4, 9, 17, 7, 13)
# Fine-tuning steps, and where the interrupted run stops: few, as compiling the train step
# (~10 s on 2 cores) costs as much as all of them.
STEPS = 10
RESUME_AT = 5


@pytest.fixture(scope="module")
def fsmt_dir(hf_dirs, tmp_path_factory):
  """A save_pretrained directory: a tiny FSMT en->de model trained to translate the sentences
  of test_fsmt_import_translates_like_generate into random targets, and the real tokenizer."""
  directory = tmp_path_factory.mktemp("fsmt-tiny")
  shutil.copytree(hf_dirs["en", "de"], directory, dirs_exist_ok=True)
  tokenizer = transformers.FSMTTokenizer.from_pretrained(directory)
  config = transformers.FSMTConfig(
    **dict(hf_fakes.SIZES, max_position_embeddings=128),
    langs=["en", "de"],
    src_vocab_size=tokenizer.src_vocab_size,
    tgt_vocab_size=tokenizer.tgt_vocab_size,
    activation_function="relu",
    # The tokenizer's special ids (FSMTTokenizer names no eos_token: it ends sentences with
    # its sep_token, </s>, so its eos_token_id is None).
    pad_token_id=SPECIALS["<pad>"],
    bos_token_id=SPECIALS["<s>"],
    eos_token_id=SPECIALS["</s>"],
    decoder_start_token_id=SPECIALS["</s>"],
  )
  torch.manual_seed(0)
  model = transformers.FSMTForConditionalGeneration(config)
  sources = tokenizer(_fsmt_lines()).input_ids  # EOS-terminated, unpadded
  ordinary = range(len(SPECIALS), tokenizer.tgt_vocab_size)  # fairseq's specials are 0-3
  targets = hf_fakes.random_targets(np.random.default_rng(0), ordinary, FSMT_TARGET_LENGTHS)
  hf_fakes.train_to_translate(model, sources, targets)
  model.save_pretrained(directory)
  return directory


@pytest.fixture(scope="module")
def fsmt_import(fsmt_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("fsmt-imported") / "workdir"
  argv = ["import", "--from", f"hf:{fsmt_dir}", "--workdir", str(workdir)]
  assert cli.main(argv + [f"decode.max_len={MAX_NEW_TOKENS}"]) == 0
  return workdir


def _generate_fsmt(directory, lines: list[str], suppressed: list[int]):
  """(texts, ids [batch, 1 + steps]) of transformers' greedy translations, the generation
  switches we do not have turned off as in test_hf_models.py."""
  tokenizer = transformers.FSMTTokenizer.from_pretrained(directory)
  model = transformers.FSMTForConditionalGeneration.from_pretrained(directory).eval()
  inputs = tokenizer(lines, return_tensors="pt", padding=True)
  outputs = hf_fakes.generate(model, inputs, MAX_NEW_TOKENS, suppressed)
  return tokenizer.batch_decode(outputs, skip_special_tokens=True), outputs.numpy()


def _fsmt_lines() -> list[str]:
  """The 8 sentences test_fsmt_import_translates_like_generate translates: none of them trained
  the BPE merges (hf_kinds.TRAIN)."""
  lines = hf_kinds.news2014_lines("en", slice(2500, 2700))
  return [line for line in lines if len(line) < 80][:8]


def test_fsmt_import_translates_like_generate(fsmt_dir, fsmt_import, tmp_path, capsys):
  lines = _fsmt_lines()
  (tmp_path / "input.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  output = tmp_path / "output.txt"
  argv = ["translate", "--workdir", str(fsmt_import), "--beam", "1"]
  rc = cli.main(argv + ["--input", str(tmp_path / "input.txt"), "--output", str(output)])
  assert rc == 0, capsys.readouterr().err
  ours = output.read_text(encoding="utf-8").splitlines()

  # The checkpoint restores the FSMT tokenizer, and the model's two vocabularies are its.
  translator = loading.load_translator(str(fsmt_import))
  assert isinstance(translator.tokenizer, FsmtTokenizer)
  assert (translator.tokenizer.source_lang, translator.tokenizer.target_lang) == ("en", "de")
  config = translator.model_config
  assert (config.vocab_size, config.output_vocab_size) == (
    translator.tokenizer.vocab_size,
    translator.tokenizer.target_vocab_size,
  )
  assert config.vocab_size != config.output_vocab_size  # the sides really differ

  theirs, ids = _generate_fsmt(fsmt_dir, lines, list(config.suppressed_ids))
  # Otherwise the comparison would prove little: translations that differ, each of several
  # tokens, some ended by EOS, some cut at MAX_NEW_TOKENS. ids[:, 0]: the decoder start.
  eos = SPECIALS["</s>"]
  hf_fakes.assert_varied(ids[:, 1:], tuple(SPECIALS.values()), eos)
  ended = [eos in row[1:] for row in ids]
  assert any(ended) and not all(ended), ids
  assert ours == theirs


# Fine-tuning: kind -> (source code, target code) of the multilingual imports; FSMT has none.
LANGUAGES = {kind: hf_kinds.KINDS[kind][3:5] for kind in ("mbart", "nllb")}
FINETUNED_KINDS = ("fsmt", *LANGUAGES)


@pytest.fixture(scope="module")
def imports(request, tmp_path_factory):
  """kind -> (save_pretrained directory, imported workdir), each built when first asked for."""
  built = {}

  def get(kind: str):
    if kind not in built:
      if kind == "fsmt":
        built[kind] = request.getfixturevalue("fsmt_dir"), request.getfixturevalue("fsmt_import")
      else:
        models = request.getfixturevalue("sentencepiece_models")
        built[kind] = hf_kinds.build_and_import(kind, models, tmp_path_factory)
    return built[kind]

  return get


def _overrides(kind: str, imported, data_root, num_steps: int) -> list[str]:
  """hf_kinds.finetune_overrides' run (a checkpoint every RESUME_AT steps), with the language
  codes of a multilingual import."""
  overrides = [
    o
    for o in hf_kinds.finetune_overrides(imported, data_root, num_steps)
    if not o.startswith("train.checkpoint_every=")
  ]
  overrides.append(f"train.checkpoint_every={RESUME_AT}")
  if kind in LANGUAGES:
    source, target = LANGUAGES[kind]
    overrides += [f"data.source_code={source}", f"data.target_code={target}"]
  return overrides


def _train(workdir, overrides) -> None:
  argv = ["train", "--experiment", "demo", "--workdir", str(workdir)]
  assert cli.main(argv + overrides) == 0


@pytest.fixture(scope="module")
def finetuned(imports, data_root, tmp_path_factory):
  """kind -> the workdir of an uninterrupted STEPS-step fine-tuning of its import."""
  built = {}

  def get(kind: str):
    if kind not in built:
      workdir = tmp_path_factory.mktemp(f"{kind}-finetuned") / "full"
      _train(workdir, _overrides(kind, imports(kind)[1], data_root, STEPS))
      built[kind] = workdir
    return built[kind]

  return get


@pytest.mark.parametrize("kind", FINETUNED_KINDS)
def test_finetuning_lowers_the_loss(kind, imports, finetuned):
  workdir = finetuned(kind)
  losses = losses_by_step(workdir)
  assert sorted(losses) == list(range(1, STEPS + 1))
  first, last = range(1, 4), range(STEPS - 2, STEPS + 1)
  assert np.mean([losses[s] for s in last]) < 0.8 * np.mean([losses[s] for s in first]), losses
  # The run's checkpoints hold the import's tokenizer (its languages are the run's data section).
  config, tokenizer, step = checkpointing.read_config(str(workdir))
  imported_config, imported_tokenizer, _ = checkpointing.read_config(str(imports(kind)[1]))
  assert step == STEPS and type(tokenizer) is type(imported_tokenizer)
  assert config.model.vocab_size == imported_config.model.vocab_size
  if kind in LANGUAGES:
    assert (config.data.source_code, config.data.target_code) == LANGUAGES[kind]


def test_finetuning_resumes_bit_identically(imports, finetuned, data_root, tmp_path):
  """NLLB's run stopped at RESUME_AT and resumed == the uninterrupted run: losses and params."""
  kind = "nllb"
  imported = imports(kind)[1]
  split = tmp_path / "split"
  _train(split, _overrides(kind, imported, data_root, RESUME_AT))
  assert checkpointing.all_steps(str(split)) == [RESUME_AT]
  _train(split, _overrides(kind, imported, data_root, STEPS))
  full = finetuned(kind)
  assert losses_by_step(split) == losses_by_step(full)
  full_params = loading.load_translator(str(full)).params
  split_params = loading.load_translator(str(split)).params
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(full_params), split_params)


def _segments(batch: dict[str, np.ndarray]):
  """(inputs, targets, targets_in) id lists of each sentence packed into `batch`."""
  for row in range(batch["inputs"].shape[0]):
    for segment in range(1, batch["inputs_segment_ids"][row].max() + 1):
      source = batch["inputs_segment_ids"][row] == segment
      target = batch["targets_segment_ids"][row] == segment
      yield tuple(
        batch[name][row][mask].tolist()
        for name, mask in (("inputs", source), ("targets", target), ("targets_in", target))
      )


@pytest.mark.parametrize("kind", list(LANGUAGES))
def test_training_batches_hold_what_transformers_trains_on(kind, imports, data_root):
  """Each packed sentence: the source as transformers' tokenizer encodes it, the target and
  decoder input as its labels and `shift_tokens_right(labels)` (what the model computes its
  decoder input from in training), up to the last label for mBART-cc25, whose labels end
  with the target code that it wraps around to the decoder's first input."""
  directory, imported_dir = imports(kind)
  source, target = LANGUAGES[kind]
  config = registry.load_experiment(
    "demo",
    hf_kinds.cli_overrides(_overrides(kind, imported_dir, data_root, STEPS)),
  )
  imported = finetune.read_import(str(imported_dir))
  config = finetune.merged_config(config, imported)
  imported, _ = finetune.with_languages(imported, config)
  model_config = run_setup.model_config_for(config)
  english = (data_root / "train.en").read_text(encoding="utf-8").splitlines()
  german = (data_root / "train.de").read_text(encoding="utf-8").splitlines()
  batches, _ = input_pipeline.training_batches(
    list(zip(english, german)),
    imported.tokenizer,
    batch_rows=8,
    grad_accum_steps=1,
    max_len=config.data.max_len,
    seed=0,
    pad_id=model_config.pad_id,
    start_id=model_config.decoder_start_id,
  )
  batch = {name: array[0] for name, array in next(batches).items()}  # [rows, max_len]

  theirs = hf_kinds.hf_tokenizer(kind, directory, src_lang=source, tgt_lang=target)
  encoded = theirs(english, text_target=german)
  labels_of = {tuple(i): labels for i, labels in zip(encoded.input_ids, encoded.labels)}
  target_id = theirs.convert_tokens_to_ids(target)
  segments = list(_segments(batch))
  assert len(segments) >= 8
  for inputs, targets, targets_in in segments:
    labels = labels_of[tuple(inputs)]  # a KeyError: a source encoded otherwise
    if kind == "mbart":
      from transformers.models.mbart.modeling_mbart import shift_tokens_right

      shifted = shift_tokens_right(torch.tensor([labels]), theirs.pad_token_id)[0].tolist()
      assert labels[-1] == target_id and targets_in[0] == target_id
      labels, shifted = labels[:-1], shifted[:-1]
    else:
      from transformers.models.m2m_100.modeling_m2m_100 import shift_tokens_right

      shifted = shift_tokens_right(
        torch.tensor([labels]), theirs.pad_token_id, theirs.eos_token_id
      )[0].tolist()
      assert targets[0] == target_id and targets_in[:2] == [theirs.eos_token_id, target_id]
    assert (targets, targets_in) == (labels, shifted)

"""What a user of `run.py export` runs as it is: the model card's scores, a plain `generate()`
that reads only the exported generation_config.json, and the card's CTranslate2 snippet.

The model is test_export.py's "demo" (tests/trained_runs.py ExportModels: trained once per
session, beam 4, alpha 0.6, decode.max_len 24), decoding 16 sentences (8 memorized training
pairs, 8 held out). The translations are compared with our Translator's, at the settings the export
says the target's search reproduces: our beam and alpha from the checkpoint, with
decode.length_penalty="power" and decode.candidate_pool "hf" (generate) or "fairseq"
(CTranslate2). The run's own GNMT penalty ((5 + len) / 6) ** alpha has no counterpart in
either (generation_config.json holds no formula; the card says so): measured on the fixture's
64 sentences, a plain generate() differs from our default decoding on 2 (ours shorter, its
penalty being weaker), from ours with "power" and "hf" on none.

Select with `-m interop`; skipped without transformers or torch, the CTranslate2 test without
the ctranslate2 extra.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import pathlib
import re

import hf_fakes
import pytest
import trained_runs
from trained_runs import SEEN, STEPS

torch, transformers = hf_fakes.require_interop()

from transformer_mt import cli  # noqa: E402
from transformer_mt.decoding import loading  # noqa: E402

pytestmark = pytest.mark.interop

ROWS = 2 * SEEN  # the memorized rows and as many held out
# The search the target reproduces (the module docstring), decoding the ROWS sentences in one
# batch (the demo's 128 rows would be mostly padding; no batch size changes a translation).
SETTINGS = ["decode.length_penalty='power'", f"decode.batch_size={ROWS}"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  return trained_runs.ExportModels(tmp_path_factory)


def _cli(*argv: str) -> None:
  assert cli.main(list(argv)) == 0


def _card(directory: str) -> str:
  return (pathlib.Path(directory) / "README.md").read_text(encoding="utf-8")


def test_the_model_card_lists_only_the_exported_checkpoints_reports(exported, tmp_path):
  workdir, _, _, _, _ = exported["demo"]
  workdir = str(trained_runs.copy_of(pathlib.Path(workdir), tmp_path / "run"))
  _cli("evaluate", "--workdir", workdir, "--beam", "1")
  evals = pathlib.Path(workdir) / "eval"
  (path,) = evals.glob("*.json")
  report = json.loads(path.read_text())
  assert report["step"] == STEPS["demo"]
  # Beside it, as evaluate writes them: an earlier checkpoint's report (evaluate --step) and
  # an ensemble led by this workdir, with scores no evaluation of this checkpoint gave.
  earlier = dict(report, step=STEPS["demo"] // 2, sacrebleu=12.34, chrf=23.45)
  (evals / f"test-step{STEPS['demo'] // 2}-beam1-alpha0.6.json").write_text(json.dumps(earlier))
  ensemble = dict(report, sacrebleu=56.78, chrf=67.89, ensemble=[workdir, workdir])
  (evals / path.name.replace(".json", "-ensemble2.json")).write_text(json.dumps(ensemble))
  output = str(tmp_path / "export")
  _cli("export", "--workdir", workdir, "--step", str(STEPS["demo"]), "--to", "hf", output)
  card = _card(output)
  front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
  for line in ("language:\n- de\n- en", "tags:\n- translation", "license: unknown", "- bleu"):
    assert line in front
  assert f"value: {report['sacrebleu']:.2f}" in front
  assert f"{report['sacrebleu']:.2f}" in body and "`demo`" in body
  assert f"steps | {STEPS['demo']}" in body
  assert "--to hf" in body
  assert front.count("- type: bleu") == 1, front
  for other in ("12.34", "23.45", "56.78", "67.89"):
    assert other not in card, other


def _generate(model, batch, **settings) -> list[list[int]]:
  with torch.no_grad():
    return model.generate(**batch, **settings).tolist()


def test_a_plain_generate_translates_as_ours(exported):
  workdir, output, _, _, pairs = exported["demo"]
  lines = [source for source, _ in pairs[:ROWS]]
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(output).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(output)
  batch = tokenizer(lines, return_tensors="pt", padding=True)
  # No settings but the inputs: beam, alpha, length limit, suppressed tokens and stopping rule
  # come from generation_config.json alone.
  plain = _generate(model, batch)
  theirs = tokenizer.batch_decode(plain, skip_special_tokens=True)
  settings = [*SETTINGS, "decode.candidate_pool='hf'"]
  ours = loading.load_translator(workdir, decode_overrides=settings).translate(lines)
  assert theirs == ours
  # The file's settings are what made them equal: greedy decoding parts ways on some rows.
  greedy = _generate(model, batch, num_beams=1)
  assert sum(a != b for a, b in zip(plain, greedy)) >= 2


def _snippet(card: str) -> str:
  """The card's one Python code block."""
  (code,) = re.findall(r"```python\n(.*?)```", card, re.DOTALL)
  return code


def _run(code: str) -> tuple[list[str], list]:
  """(What `code` prints, a list literal; its `results`), run in this process."""
  namespace, printed = {}, io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(code, namespace)
  return ast.literal_eval(printed.getvalue().strip()), namespace["results"]


def test_the_cards_ctranslate2_snippet_translates_as_ours(exported, tmp_path):
  pytest.importorskip(
    "ctranslate2", reason="needs the ctranslate2 extra: pip install -e '.[ctranslate2]'"
  )
  workdir, _, _, _, pairs = exported["demo"]
  lines = [source for source, _ in pairs[:ROWS]]
  directory = str(tmp_path / "ct2")
  _cli("export", "--workdir", workdir, "--to", "ctranslate2", directory)
  card = _card(directory)
  assert "--to ctranslate2" in card
  code = _snippet(card).replace("PATH", directory).replace('["..."]', repr(lines))
  theirs, results = _run(code)
  settings = [*SETTINGS, "decode.candidate_pool='fairseq'"]
  ours = loading.load_translator(workdir, decode_overrides=settings).translate(lines)
  # The card's one exception: a translation CTranslate2 cut at max_decoding_length.
  limit = int(re.search(r"max_decoding_length=(\d+)", code).group(1))
  ended = [i for i, r in enumerate(results) if len(r.hypotheses[0]) < limit]
  assert len(ended) >= SEEN, ended
  assert [theirs[i] for i in ended] == [ours[i] for i in ended]
  # The snippet's settings are what made them equal: at beam 1 some of those rows change.
  greedy, _ = _run(re.sub(r"beam_size=\d+", "beam_size=1", code))
  assert sum(theirs[i] != greedy[i] for i in ended) >= 1

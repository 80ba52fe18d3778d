"""Every benchmark entry script runs at its --tiny size and prints the figures it promises
(benchmarks/README.md lists them): nothing is asserted about speed, which depends on the
machine, only that each script still measures what it says.

The scripts' main() runs in this process (a subprocess would pay JAX's start-up again);
corpus_scale.py starts its own `run.py` processes, since what it measures is theirs. The
scripts that compare with torch, transformers or CTranslate2 skip without their extra.
"""

import dataclasses
import inspect
import json
import subprocess

import pytest
from helpers import ROOT

from transformer_mt.decoding import beam_decode
from transformer_mt.model.transformer_config import TransformerConfig

INTEROP = "needs the interop extra: pip install -e '.[test,interop]'"
CT2 = "needs the ctranslate2 extra: pip install -e '.[test,ctranslate2]'"

# Every entry script (benchmarks/*.py and *.sh; benchmarks/harness/ holds what they share) and
# the test below that runs it.
ENTRIES = {
  "accelerator.py": "test_accelerator",
  "corpus_scale.py": "test_corpus_scale",
  "ctranslate2_decode.py": "test_ctranslate2_decode",
  "decode.py": "test_decode",
  "device_run.sh": "test_device_run_names_only_what_exists",
  "input_pipeline.py": "test_input_pipeline",
  "memory.py": "test_memory",
  "sweep_savings.py": "test_sweep_savings",
  "torch_reference.py": "test_torch_reference",
  "train_step.py": "test_train_step",
}


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
  monkeypatch.syspath_prepend(str(ROOT))


def _run(capsys, module, *argv) -> list[str]:
  """The lines `module.main(argv)` prints; a nonzero return is a failure."""
  assert not module.main(list(argv))
  return capsys.readouterr().out.splitlines()


def _json(lines) -> dict:
  return json.loads(lines[-1])


def test_every_entry_script_has_its_test_and_there_are_at_most_ten():
  scripts = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
  assert scripts == set(ENTRIES), scripts ^ set(ENTRIES)
  assert len(ENTRIES) <= 10
  assert all(callable(globals().get(name)) for name in ENTRIES.values())


def test_accelerator(capsys):
  """Every section but "generate" (test_generate_comparisons, with the extra), at --tiny:
  "levers" and "decode_levers" run one lever each and "combined" one batch size per model."""
  from benchmarks import accelerator

  sections = [name for name in accelerator.SECTIONS if name != "generate"]
  lines = _run(capsys, accelerator, "--tiny", "--sections", ",".join(sections))
  assert lines[0].startswith("device: ")
  for name in ("Base", "Big"):
    (line,) = [line for line in lines if line.startswith(f"{name} train step, ")]
    assert "tokens/s" in line and "MFU" in line and "XLA's peak for the step" in line
  # "decode" and "decode_levers": the defaults users run (cache_reorder "auto" resolved), then
  # at --tiny one lever beside them; every lever names switches that exist.
  decodes = [line for line in lines if line.startswith("Base beam-4 decode")]
  assert len(decodes) == 2, decodes
  assert all("defaults (cache_reorder auto = " in line for line in decodes)
  assert all("target tokens/s" in line for line in decodes)
  (lever,) = [line for line in lines if line.startswith(f"  {accelerator.TINY_DECODE_LEVER}: ")]
  assert "x the defaults" in lever and "best hypothesis for 100% of sentences" in lever, lever
  arguments = inspect.signature(beam_decode.beam_decode).parameters
  fields = {field.name for field in dataclasses.fields(TransformerConfig)}
  for options, model_changes in accelerator.DECODE_LEVERS.values():
    assert set(options) <= set(arguments) and set(model_changes) <= fields
  assert any(line.startswith("attention: ") for line in lines)
  (check,) = [line for line in lines if line.startswith("bf16 loss ")]
  assert "within the tolerance" in check, check
  assert any(line.startswith("packed attention, Base") for line in lines)
  assert any(line.startswith("  auto: ") and "vs auto" in line for line in lines)
  assert any(line.startswith("XLA GPU flags: GPU-only") for line in lines)
  levers = [line for line in lines if line.startswith("Base train step (")]
  (lever,) = [line for line in levers if "(all levers)" not in line]
  assert "tokens/s" in lever
  for name in ("Base", "Big"):
    assert len([line for line in lines if line.startswith(f"{name} train step (all levers)")]) == 1
  # The combined section turns every single lever's changes on.
  for model_changes, train_changes in accelerator.LEVERS.values():
    assert model_changes.items() <= accelerator.LEVERS["all levers"][0].items()
    assert train_changes.items() <= accelerator.LEVERS["all levers"][1].items()
  assert lines[-1].startswith("total ") and "FAILED" not in lines[-1]


def test_an_unknown_accelerator_section_is_one_usage_error_before_anything_runs(capsys):
  from benchmarks import accelerator

  with pytest.raises(SystemExit) as exit_info:
    accelerator.main(["--tiny", "--sections", "base,nope"])
  captured = capsys.readouterr()
  assert exit_info.value.code == 2 and captured.out == ""
  assert "error: --sections: no section nope; choose from base, " in captured.err.splitlines()[-1]


def test_generate_comparisons(capsys):
  """accelerator.py's "generate" section and decode.py's issue regime: ours against
  transformers' generate on the same weights (float32 on a CPU: the same best hypotheses)."""
  pytest.importorskip("transformers", minversion="5.18", reason=INTEROP)
  pytest.importorskip("torch", reason=INTEROP)
  from benchmarks import accelerator, decode

  lines = _run(capsys, accelerator, "--tiny", "--sections", "generate")
  (ours, theirs) = [line for line in lines if "generate" in line and "sentences/s" in line]
  assert ours.startswith("beam-4 vs generate") and "ours / generate" in theirs
  assert "same best hypothesis for 100% of sentences" in theirs, theirs

  lines = _run(capsys, decode, "--tiny", "--regime", "issue", "--reps", "1")
  assert any(line.startswith("compute floor: ") for line in lines)
  assert any(line.startswith("ratio ours / generate") for line in lines)
  result = _json(lines)
  assert result["same_sequences"] == 1.0 and result["ratio"] > 0 and result["share_of_floor"] > 0


def test_train_step(capsys):
  from benchmarks import train_step

  lines = _run(capsys, train_step, "--tiny")
  assert any(line.startswith("machine: ") for line in lines)
  assert any(line.startswith("ours packed / reference padded") for line in lines)
  assert any(line.startswith("ours / reference on the same full rows") for line in lines)
  record = _json(lines)
  assert record["full_rows"]["ours_over_reference"] > 0 and record["packed"]["ours"]

  lines = _run(capsys, train_step, "--tiny", "--mode", "scaling")
  assert any(line.startswith("  step time ~ length^") for line in lines)
  assert any(line.startswith("  step time ~ tokens^") for line in lines)
  record = _json(lines)
  assert len(record["length"]["points"]) == len(record["tokens"]["points"]) == 2


def test_decode(capsys):
  from benchmarks import decode

  lines = _run(capsys, decode, "--tiny")
  assert any(line.startswith("Beam sizes: 8 sentences") for line in lines)
  assert any(line.startswith("Source length: beam 4") for line in lines)
  record = _json(lines)
  assert set(record["beam_sizes"]) == {"1", "4"}
  assert all(r["sentences_per_s"] > 0 for r in record["beam_sizes"].values())
  assert record["source_length"] and record["source_length"][0]["ms_per_step"] > 0


def test_ctranslate2_decode(capsys):
  pytest.importorskip("ctranslate2", reason=CT2)
  pytest.importorskip("transformers", reason=CT2)
  from benchmarks import ctranslate2_decode

  ctranslate2_decode.main(["--tiny"])
  lines = capsys.readouterr().out.splitlines()
  rows = [line for line in lines if line.startswith("| base_shape (random) | 4 | 4 |")]
  assert [row.split(" | ")[3] for row in rows] == list(ctranslate2_decode.ENGINES)
  assert all(row.split(" | ")[6].endswith("x") for row in rows[1:])  # ours / this
  assert lines[-1].startswith("load average after ")


def test_torch_reference(capsys):
  pytest.importorskip("torch", reason=INTEROP)
  from benchmarks import torch_reference

  lines = _run(capsys, torch_reference, "--tiny", "--no-compile", "--reps", "1")
  checks = [line for line in lines if " on our initial weights, " in line]
  assert len(checks) == 2 and all("within the tolerance" in line for line in checks), checks
  steps = [line for line in lines if line.startswith("PyTorch ") and " train step" in line]
  assert [line.split(" train step")[0] for line in steps] == ["PyTorch Base", "PyTorch Big"]
  assert all("tokens/s" in line and "MFU" in line and "eager" in line for line in steps)


def test_memory(capsys):
  from benchmarks import memory

  memory.main(["--tiny"])
  lines = capsys.readouterr().out.splitlines()
  assert any(line.startswith("  remat: XLA ") for line in lines)
  record = _json(lines)["results"]
  assert len(record) == 2 and all(m["peak"] > 0 and m["residuals"] > 0 for m in record.values())

  memory.main(["--tiny", "--inference"])
  lines = capsys.readouterr().out.splitlines()
  record = _json(lines)["results"]
  assert set(record) == {"float32", "bfloat16"}
  assert record["bfloat16"]["param_bytes"] * 2 == record["float32"]["param_bytes"]


def test_input_pipeline(capsys):
  """The rates against the demand and the fed / fixed check ("auto" workers: none on a CPU)."""
  from benchmarks import input_pipeline

  lines = _run(capsys, input_pipeline, "--tiny", "--fed", "--fed_workers", "auto")
  assert lines[1].startswith("demand: ")
  assert any(line.startswith("num_workers=0: ") and "x the demand" in line for line in lines)
  (fed,) = [line for line in lines if line.startswith("input-bound check, ")]
  assert "fed/fixed" in fed
  (figures,) = _json(lines)["fed"]
  assert figures["fed_step_ms"] > 0 and figures["fixed_step_ms"] > 0
  assert 0.0 <= figures["waiting_share"] <= 1.0


def test_corpus_scale(capsys):
  """The training command (`run.py prepare`, then `run.py train`, its own processes) on 300
  generated pairs, and the pipeline rates in this process."""
  from benchmarks import corpus_scale

  corpus_scale.main(["--tiny"])
  record = _json(capsys.readouterr().out.splitlines())
  assert record["pairs"] == 300 and record["prepare_s"] > 0
  assert record["first_step_s"] > 0 and record["rss_gb_main"] > 0
  assert record["target_tokens_per_s_w0"] > 0 and record["in_memory_tokens_per_s_w0"] > 0
  assert record["random_pairs_per_s_warm"] > 0


def test_sweep_savings(capsys):
  """Random search and TPE+ASHA over the same space at --tiny (the demo's synthetic pair, 3
  trials of 20 steps, one seed): a table row per search and seed and their means, the ratio
  and the goal lines."""
  from benchmarks import sweep_savings

  lines = _run(capsys, sweep_savings, "--tiny")
  assert lines[0].startswith("machine: ")
  rows = [line for line in lines if line.startswith("| ")]
  for label in sweep_savings.SEARCHES.values():
    assert any(line.startswith(f"| {label} | 0 | ") for line in rows), rows
    assert any(line.startswith(f"| {label} | mean | ") for line in rows), rows
  assert any(line.startswith("ratio steps(TPE+ASHA) / steps(random) ") for line in lines)
  assert any(line.startswith("goal (TPE+ASHA reaches random's best") for line in lines)
  record = _json(lines)
  assert set(record["results"]) == set(sweep_savings.SEARCHES)
  assert all(sum(r["0"]["trials"].values()) == 3 for r in record["results"].values())


def test_device_run_names_only_what_exists():
  """benchmarks/device_run.sh (a GPU's script, not run here): valid bash, and the sections it
  runs by default are accelerator.py's, every one of them."""
  from benchmarks import accelerator

  script = ROOT / "benchmarks" / "device_run.sh"
  subprocess.run(["bash", "-n", str(script)], check=True)
  text = script.read_text()
  named = []
  for variable in ("ACCELERATOR_SECTIONS", "ACCELERATOR_LATER"):
    default = text.split("${" + variable + ":-", 1)[1].split("}", 1)[0]
    named += default.split(",")
  assert sorted(named) == sorted(accelerator.SECTIONS)
  for path in ("benchmarks/accelerator.py", "benchmarks/torch_reference.py", "run.py"):
    assert path in text and (ROOT / path).is_file()

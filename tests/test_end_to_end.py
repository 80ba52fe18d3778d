"""Train a tiny model on the synthetic task, resume it, translate with the CLI, check metrics."""

import json
import os

import jax
import numpy as np
import pytest
from helpers import end_to_end_overrides

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.training import train, validation
from transformer_mt.workdir import metrics_log as metrics

pytestmark = pytest.mark.slow

# No validation BLEU at the last step: no test here reads it but the one that sets
# train.bleu_every itself (the held-out BLEU after training is still computed and checked).
TINY = end_to_end_overrides() + ["train.bleu_every=0"]


def tiny_config(num_steps, *extra):
  return registry.load_experiment("demo", TINY + [f"train.num_steps={num_steps}", *extra])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """One uninterrupted 20-step run, and one stopped at 10 and resumed to 20. The first leg of
  the resumed run, as a recipe search's runs, skips the held-out test, and is profiled at
  steps 3 and 4 (test_profile_steps_write_a_trace_and_change_nothing)."""
  straight = str(tmp_path_factory.mktemp("straight"))
  resumed = str(tmp_path_factory.mktemp("resumed"))
  full = train.train(tiny_config(20), straight, progress=False)
  first_leg = train.train(
    tiny_config(10, "evaluate.test_after_training=False", "train.profile_steps=[3,4]"),
    resumed,
    progress=False,
  )
  assert first_leg["step"] == 10 and first_leg["bleu"] is None
  again = train.train(tiny_config(20), resumed, progress=False)
  return straight, resumed, full, again


def test_resumed_run_equals_uninterrupted_run(trained):
  straight, resumed, full, again = trained
  assert full["step"] == again["step"] == 20
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
    jax.device_get(again["state"].params),
    jax.device_get(full["state"].params),
  )
  straight_log = {r["step"]: r["loss"] for r in metrics.read_metrics(straight) if "loss" in r}
  resumed_log = {r["step"]: r["loss"] for r in metrics.read_metrics(resumed) if "loss" in r}
  assert sorted(resumed_log) == list(range(1, 21))
  for step in range(11, 21):  # the steps after the restart saw the same batches
    assert resumed_log[step] == straight_log[step]


def test_metrics_are_logged_every_step(trained):
  straight = trained[0]
  all_records = metrics.read_metrics(straight)
  records = [r for r in all_records if "loss" in r]  # the per-step training records
  assert [r["step"] for r in records] == list(range(1, 21))
  data_records = [r for r in all_records if "data/pairs_seen" in r]
  assert data_records and data_records[-1]["data/pairs_seen"] > 0
  for key in ("loss", "accuracy", "learning_rate", "grad_norm", "tokens_per_second", "num_tokens"):
    assert all(np.isfinite(r[key]) for r in records), key
  assert os.listdir(os.path.join(straight, "tensorboard"))
  for result in trained[2:]:  # both ends evaluate the test split
    assert result["bleu"] is not None and 0.0 <= result["bleu"] <= 100.0


def test_checkpoint_is_self_contained(trained):
  step_dir = os.path.join(trained[0], "checkpoints", "20")
  assert {"config", "data_iter", "params", "train_state", "tokenizer"} <= set(os.listdir(step_dir))
  assert "state" not in os.listdir(step_dir)
  with open(os.path.join(step_dir, "config", "metadata")) as f:
    assert json.load(f)["model"]["d_model"] == 32


def test_translate_cli_keeps_every_line(trained, tmp_path, capsys):
  source = tmp_path / "source.txt"
  source.write_bytes(
    b"the old dog watched these big red apples\n\nmy cats saw a bird\n"
    b"\xff\xfe broken bytes\n"
    + ("word " * 2000).encode()
    + b"\n"
    + "日本語の文です\nПривет, мир\nمرحبا بالعالم\n\n".encode()
  )
  output = tmp_path / "out.txt"
  for beam in ("1", "3"):
    assert (
      cli.main(
        [
          "translate",
          "--workdir",
          trained[0],
          "--input",
          str(source),
          "--output",
          str(output),
          "--beam",
          beam,
        ]
      )
      == 0
    )
    lines = output.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 10 and lines[-1] == ""  # 9 lines, each newline-terminated
    assert lines[1] == "" and lines[8] == "" and lines[0]
    assert all(lines[i] for i in (2, 3, 4, 5, 6, 7))  # nothing dropped, the 2000 words included


def test_cli_errors_are_one_line(tmp_path, capsys):
  assert cli.main(["translate", "--workdir", str(tmp_path / "missing")]) == 2
  assert cli.main(["train", "--experiment", "nope", "--workdir", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_run_py_list_prints_parameter_counts(capsys):
  assert cli.main(["list"]) == 0
  out = capsys.readouterr().out
  rows = {
    line.split()[0]: float(line.split()[1].rstrip("M"))
    for line in out.splitlines()[1:]
    if "M " in line
  }
  assert abs(rows["transformer_base_wmt14_ende"] - 65) / 65 < 0.05  # paper: 65M
  assert abs(rows["transformer_big_wmt14_ende"] - 213) / 213 < 0.02  # paper: 213M
  assert {"transformer_base_wmt14_enfr", "transformer_big_wmt14_enfr"} <= set(rows)
  assert "counted once" in out


def test_evaluate_writes_a_labelled_report(trained, capsys):
  assert cli.main(["evaluate", "--workdir", trained[0], "--limit", "8", "--beam", "2"]) == 0
  out = capsys.readouterr().out
  assert "sacreBLEU" in out and "paper-comparable BLEU" in out
  assert "  chrF " in out and "  chrF++ " in out and "nw:2" in out
  report_path = os.path.join(trained[0], "eval", "test-step20-beam2-alpha0.6-first8.json")
  with open(report_path) as f:
    report = json.load(f)
  # Another length penalty writes its own report; the first stays as it was.
  assert (
    cli.main(["evaluate", "--workdir", trained[0], "--limit", "8", "--beam", "2", "--alpha", "1.5"])
    == 0
  )
  with open(report_path.replace("alpha0.6", "alpha1.5")) as f:
    assert json.load(f)["alpha"] == 1.5
  with open(report_path) as f:
    assert json.load(f) == report
  assert (
    report["num_sentences"] == 8 and report["beam_size"] == 2 and report["limited_to_first"] == 8
  )
  assert {"sacrebleu", "sacrebleu_signature", "paper_bleu", "paper_bleu_method"} <= set(report)
  assert {"chrf", "chrf_signature", "chrf_plus_plus", "chrf_plus_plus_signature"} <= set(report)
  with open(report_path.replace(".json", ".txt")) as f:
    assert len(f.read().split("\n")) == 9


def test_evaluate_takes_decode_overrides(trained, capsys):
  """`evaluate ... decode.candidate_pool=fairseq` decodes with that rule (the translations of a
  Translator given it directly), writes a report of its own, named by the override, and
  leaves the checkpoint's decode settings as they were; any other key is one error line."""
  import dataclasses

  from transformer_mt.data import sources as data_sources
  from transformer_mt.decoding.loading import load_translator
  from transformer_mt.workdir import checkpointing

  argv = ["evaluate", "--workdir", trained[0], "--limit", "8", "--beam", "3"]
  assert cli.main([*argv, "decode.candidate_pool=fairseq", "decode.length_penalty=power"]) == 0
  capsys.readouterr()
  stem = "test-step20-beam3-alpha0.6-candidate_pool_fairseq-length_penalty_power-first8"
  with open(os.path.join(trained[0], "eval", stem + ".json")) as f:
    report = json.load(f)
  assert report["decode_overrides"] == [
    "decode.candidate_pool=fairseq",
    "decode.length_penalty=power",
  ]
  translator = dataclasses.replace(
    load_translator(trained[0], beam_size=3), candidate_pool="fairseq", length_penalty="power"
  )
  assert load_translator(trained[0]).candidate_pool == "beam"  # the checkpoint is unchanged
  config = checkpointing.read_config(trained[0])[0]
  test_pairs = data_sources.load_pairs(config.data, require_train=False)["test"]
  sources = [source for source, _ in list(test_pairs)[:8]]
  with open(os.path.join(trained[0], "eval", stem + ".txt")) as f:
    assert f.read().splitlines() == translator.translate(sources)
  assert cli.main([*argv, "train.num_steps=3"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: train.num_steps=3: only decode.KEY=VALUE") and err.count("\n") == 1


def test_translate_takes_decode_overrides(trained, tmp_path, capsys):
  """`translate ... decode.max_len=3 decode.candidate_pool=fairseq` writes what a Translator
  given those settings translates (shorter than the checkpoint's: the override took), and
  leaves the checkpoint as it was; a setting outside `decode`, a bare word (a file meant for
  --input) and a setting without its value are one error line each."""
  import dataclasses

  from transformer_mt.decoding.loading import load_translator

  lines = ["the old dog watched these big red apples", "my cats saw a bird", ""]
  source = tmp_path / "source.txt"
  source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  output = tmp_path / "out.txt"
  argv = ["translate", "--workdir", trained[0], "--input", str(source), "--output", str(output)]
  overrides = ["decode.max_len=3", "decode.candidate_pool=fairseq"]
  assert cli.main([*argv, "--beam", "2", *overrides]) == 0
  written = output.read_text(encoding="utf-8").splitlines()
  default = load_translator(trained[0], beam_size=2)
  expected = dataclasses.replace(default, max_target_len=3, candidate_pool="fairseq")
  assert written == expected.translate(lines)
  assert written != default.translate(lines)
  assert load_translator(trained[0]).candidate_pool == "beam"  # the checkpoint is unchanged
  capsys.readouterr()
  assert cli.main([*argv, "train.num_steps=3"]) == 2
  assert cli.main(["translate", "--workdir", trained[0], str(source)]) == 2
  assert cli.main([*argv, "decode.max_len"]) == 2
  err = capsys.readouterr().err.splitlines()
  assert err[0].startswith("error: train.num_steps=3: only decode.KEY=VALUE") and len(err) == 3
  assert err[1].startswith("error: ") and f"--input {source}" in err[1]
  assert err[2] == (
    "error: Override 'decode.max_len' is not of the form key=value (e.g. train.num_steps=100)."
  )


def test_average_then_translate(trained, tmp_path, capsys):
  output = str(tmp_path / "avg")
  assert cli.main(["average", "--workdir", trained[0], "--last", "2", "--output", output]) == 0
  assert cli.main(["average", "--workdir", trained[0], "--last", "2", "--output", output]) == 2
  assert cli.main(["average", "--workdir", trained[0], "--last", "9"]) == 2
  err = capsys.readouterr().err
  assert "already holds checkpoints" in err and "cannot average the last 9" in err
  source = tmp_path / "in.txt"
  source.write_text("my cats saw a bird\n", encoding="utf-8")
  assert (
    cli.main(
      [
        "translate",
        "--workdir",
        output,
        "--input",
        str(source),
        "--output",
        str(tmp_path / "out.txt"),
      ]
    )
    == 0
  )
  assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 1


@pytest.mark.parametrize("implementation", ["cudnn_packed", "pallas"])
def test_a_model_trained_on_a_gpu_kernel_translates_here(trained, tmp_path, caplog, implementation):
  """A checkpoint whose model asks for a kernel this CPU lacks (a GPU run's config, dtype
  "auto": bfloat16 there, float32 here) translates with JAX's default attention: the tokens
  of the same parameters under "auto", and one log line that says so."""
  import logging
  import shutil

  from transformer_mt.data import sources as data_sources
  from transformer_mt.decoding.loading import load_translator
  from transformer_mt.workdir import checkpointing

  step_dir = tmp_path / "gpu_run" / "checkpoints" / "20"
  shutil.copytree(os.path.join(trained[0], "checkpoints", "20"), step_dir)
  saved = json.loads((step_dir / "config" / "metadata").read_text())
  saved["model"].update(attention_implementation=implementation, dtype="auto")
  (step_dir / "config" / "metadata").write_text(json.dumps(saved))
  config = checkpointing.read_config(trained[0])[0]
  test_pairs = data_sources.load_pairs(config.data, require_train=False)["test"]
  sources = [source for source, _ in list(test_pairs)[:8]]
  with caplog.at_level(logging.INFO):
    translated = load_translator(str(tmp_path / "gpu_run"), beam_size=2).translate(sources)
  notes = [r.getMessage() for r in caplog.records if "running 'auto'" in r.getMessage()]
  assert len(notes) == 1 and f"attention_implementation='{implementation}'" in notes[0], notes
  assert translated == load_translator(trained[0], beam_size=2).translate(sources)


def test_attention_and_plot_commands_write_pngs(trained, tmp_path):
  png = tmp_path / "attention.png"
  assert (
    cli.main(
      [
        "attention",
        "--workdir",
        trained[0],
        "--src",
        "my cats saw a bird",
        "--output",
        str(png),
        "--layer",
        "mean",
      ]
    )
    == 0
  )
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  curves = tmp_path / "curves.png"
  assert cli.main(["plot", trained[0], "--output", str(curves)]) == 0
  assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validation_bleu_keeps_the_best_checkpoint(tmp_path, monkeypatch):
  """With a validation split, BLEU (and chrF) is logged every train.bleu_every steps and
  WORKDIR/best holds exactly one checkpoint: the step with the highest validation BLEU.

  A tiny model scores 0 BLEU at every step, so the real BLEU is checked once and then
  replaced by a scripted sequence in which the middle evaluation is the best."""
  data = tmp_path / "data"
  data.mkdir()
  from transformer_mt.data import synthetic

  splits = synthetic.generate_splits(2000, 8, seed=1)  # 8 validation pairs: one decode batch
  train_pairs, held_out = splits["train"], splits["test"]
  for name, pairs in (("train", train_pairs), ("valid", held_out)):
    (data / f"{name}.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (data / f"{name}.xx").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
  workdir = str(tmp_path / "run")
  config = registry.load_experiment(
    "demo",
    TINY
    + [
      "train.num_steps=12",
      "train.bleu_every=4",
      "train.eval_every=4",
      "data.source='local'",
      f"data.root='{data}'",
      "data.source_lang='en'",
      "data.target_lang='xx'",
      "data.train_prefixes=['train']",
      "data.validation_prefixes=['valid']",
      "decode.beam_size=1",
    ],
  )
  real_scores = validation.validation_scores
  scripted = iter([3.0, 7.0, 5.0])

  def fake_scores(*args):
    scores = real_scores(*args)
    assert set(scores) == {"validation/bleu", "validation/chrf"}
    assert all(0.0 <= value <= 100.0 for value in scores.values())
    return dict(scores, **{"validation/bleu": next(scripted)})

  monkeypatch.setattr(validation, "validation_scores", fake_scores)
  train.train(config, workdir, progress=False)
  records = metrics.read_metrics(workdir)
  bleu = {r["step"]: r["validation/bleu"] for r in records if "validation/bleu" in r}
  assert bleu == {4: 3.0, 8: 7.0, 12: 5.0}
  # chrF of the same hypotheses is logged beside BLEU (the sweep ranks by either).
  assert sorted(r["step"] for r in records if "validation/chrf" in r) == [4, 8, 12]
  assert any("validation/loss" in r for r in records)
  best_steps = os.listdir(os.path.join(workdir, "best", "checkpoints"))
  assert [int(s) for s in best_steps if s.isdigit()] == [8]
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "12"))  # the latest is kept too


def test_reproduce_then_report(tmp_path, capsys):
  """One command per row: train -> average the last 2 -> evaluate -> results.json; then the
  report puts the row in a markdown table and draws the chart."""
  workdir = str(tmp_path / "row")
  assert (
    cli.main(
      [
        "reproduce",
        "--experiment",
        "demo",
        "--workdir",
        workdir,
        *TINY,
        "train.num_steps=20",
        "evaluate.average_last=2",
        "data.num_eval=8",
      ]
    )
    == 0
  )
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["experiment"] == "demo" and results["steps"] == 20
  assert results["averaged_steps"] == [10, 20] and results["test_sentences"] == 8
  assert 0.0 <= results["sacrebleu"] <= 100.0 and 0.0 <= results["paper_comparable_bleu"] <= 100.0
  assert 0.0 <= results["chrf"] <= 100.0 and 0.0 <= results["chrf_plus_plus"] <= 100.0
  capsys.readouterr()
  chart = tmp_path / "report.png"
  assert cli.main(["report", workdir, "--chart", str(chart)]) == 0
  out = capsys.readouterr().out
  assert "| demo | – |" in out and "sacreBLEU signature" in out and "chrF++ signature" in out
  assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert cli.main(["report", str(tmp_path / "nothing")]) == 2


def test_profile_steps_write_a_trace_and_change_nothing(trained):
  """train.profile_steps=[3,4] (the resumed run's first leg) leaves a JAX trace (an XPlane
  protobuf naming the compiled train step) in WORKDIR/tensorboard, and the run's parameters
  equal the unprofiled run's; the unprofiled one writes no trace."""
  straight, resumed, full, again = trained
  traces = {}
  for workdir in (straight, resumed):
    traces[workdir] = []
    for root, _, files in os.walk(os.path.join(workdir, "tensorboard", "plugins", "profile")):
      traces[workdir] += [os.path.join(root, f) for f in files if f.endswith(".xplane.pb")]
  assert len(traces[resumed]) == 1 and not traces[straight]
  with open(traces[resumed][0], "rb") as f:
    assert b"train_step" in f.read()
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
    jax.device_get(again["state"].params),
    jax.device_get(full["state"].params),
  )


@pytest.mark.parametrize("steps", ["[4]", "[5,3]", "[0,2]"])
def test_bad_profile_steps_are_refused_before_writing(tmp_path, steps):
  config = registry.load_experiment("demo", TINY + [f"train.profile_steps={steps}"])
  with pytest.raises(ValueError, match="train.profile_steps"):
    train.train(config, str(tmp_path / "w"), progress=False)
  assert not (tmp_path / "w").exists()

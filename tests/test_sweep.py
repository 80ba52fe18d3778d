"""Sweeps: trial expansion, validation of the plan, resuming an interrupted sweep, ranking."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, child_xla_flags, run_py, tiny_overrides

from transformer_mt import cli
from transformer_mt.config.search_space import Sweep, choice, log_uniform, randint, uniform
from transformer_mt.evaluation import reports
from transformer_mt.training import sweep

STEPS = 80
TINY = tiny_overrides(
  "data.num_validation=8", "train.checkpoint_every=5", f"train.num_steps={STEPS}"
)


def test_grid_times_random_draws_is_deterministic():
  definition = Sweep(
    grid={"a": [1, 2], "b": ["x", "y"]},
    random={
      "r": uniform(0.0, 0.5),
      "l": log_uniform(1e-4, 1e-2),
      "i": randint(1, 3),
      "c": choice(0.0, 0.1),
    },
    num_random=3,
    seed=7,
  )
  trials = definition.trials()
  assert len(trials) == 2 * 2 * 3
  assert [(t["a"], t["b"]) for t in trials[:6]] == [(1, "x")] * 3 + [(1, "y")] * 3
  for t in trials:
    assert 0.0 <= t["r"] < 0.5 and 1e-4 <= t["l"] <= 1e-2 and t["i"] in (1, 2, 3)
    assert t["c"] in (0.0, 0.1)
  assert definition.trials() == trials
  assert (
    Sweep(grid=definition.grid, random=definition.random, num_random=3, seed=8).trials() != trials
  )
  assert Sweep(grid={"a": [1, 2]}).trials() == [{"a": 1}, {"a": 2}]
  assert len(Sweep(random={"r": uniform(0, 1)}, num_random=4).trials()) == 4
  with pytest.raises(ValueError, match="num_random"):
    Sweep(random={"r": uniform(0, 1)}).trials()


def test_plan_checks_keys_overrides_and_the_recorded_sweep(tmp_path):
  trials, record = sweep.plan("demo", str(tmp_path), ["train.num_steps=5"])
  assert [t["name"] for t in trials] == ["trial_000", "trial_001", "trial_002", "trial_003"]
  assert trials[1]["overrides"] == ["train.lr_scale=0.5", "train.warmup_steps=500"]
  with pytest.raises(ValueError, match="sets a key the sweep varies"):
    sweep.plan("demo", str(tmp_path), ["train.lr_scale=2.0"])
  with pytest.raises(ValueError, match="declares no sweep"):
    sweep.plan("seed_minimal", str(tmp_path))
  with pytest.raises(ValueError, match="Unknown config key"):
    sweep.plan("demo", str(tmp_path), ["train.no_such_key=1"])
  (tmp_path / sweep.SWEEP_FILENAME).write_text(json.dumps(record))
  with pytest.raises(ValueError, match="records a different sweep"):
    sweep.plan("demo", str(tmp_path), ["train.num_steps=6"])
  with pytest.raises(ValueError, match="out of range"):
    sweep.run("demo", str(tmp_path), ["train.num_steps=5"], only_trial=4)


def write_finished_trial(root, name, bleu, loss, **more):
  """A finished trial's trial.json under root/name: validation BLEU `bleu`, final loss `loss`
  (overrides k=1, 10 steps, test BLEU 1.0), then the keys of `more`."""
  status = {
    "status": "finished",
    "trial": name,
    "overrides": ["k=1"],
    "steps": 10,
    "validation_bleu": bleu,
    "test_bleu": 1.0,
    "final_loss": loss,
    **more,
  }
  (root / name).mkdir()
  (root / name / sweep.TRIAL_FILENAME).write_text(json.dumps(status))


def test_ranking_orders_by_validation_bleu_with_unfinished_last(tmp_path):
  _, record = sweep.plan("demo", str(tmp_path))
  (tmp_path / sweep.SWEEP_FILENAME).write_text(json.dumps(record))
  scripted = {"trial_000": (12.5, 2.0), "trial_001": (30.0, 3.0), "trial_003": (12.5, 1.5)}
  for name, (bleu, loss) in scripted.items():
    write_finished_trial(tmp_path, name, bleu, loss)
  table = reports.ranking_table(str(tmp_path)).splitlines()
  rows = [line for line in table if line.startswith("| ") and "trial_" in line]
  # BLEU first; the tie at 12.5 goes to the lower final loss; the unfinished trial comes last.
  assert [row.split(" | ")[1] for row in rows] == [
    "trial_001",
    "trial_003",
    "trial_000",
    "trial_002",
  ]
  assert rows[0].startswith("| 1 |") and "30.00" in rows[0]
  assert "unfinished" in rows[3]


def test_ranking_by_chrf_puts_trials_without_it_last(tmp_path, capsys):
  """`--metric chrf` ranks by validation chrF, which orders these trials differently from BLEU.
  trial_002 finished before chrF was logged (its trial.json has no such key): it is ranked
  after every trial with a chrF, shown as "–", and still ranked by BLEU under --metric bleu."""
  _, record = sweep.plan("demo", str(tmp_path))
  (tmp_path / sweep.SWEEP_FILENAME).write_text(json.dumps(record))
  # name: (validation BLEU, validation chrF or absent, final loss)
  scripted = {
    "trial_000": (30.0, 40.0, 2.0),
    "trial_001": (20.0, 55.0, 3.0),
    "trial_002": (40.0, None, 1.0),
    "trial_003": (10.0, 55.0, 1.5),
  }
  for name, (bleu, chrf, loss) in scripted.items():
    chrf_key = {} if chrf is None else {"validation_chrf": chrf}  # trial_002: none
    write_finished_trial(tmp_path, name, bleu, loss, **chrf_key)

  def ranked(metric):
    table = reports.ranking_table(str(tmp_path), metric).splitlines()
    assert table[0].endswith(f"ranked by validation {'chrF' if metric == 'chrf' else 'BLEU'}")
    return [line.split(" | ") for line in table if line.startswith("| ") and "trial_" in line]

  # chrF first; the tie at 55 goes to the lower final loss; no chrF comes last.
  rows = ranked("chrf")
  assert [row[1] for row in rows] == ["trial_003", "trial_001", "trial_000", "trial_002"]
  assert [row[4] for row in rows] == ["55.00", "55.00", "40.00", "–"]
  assert [row[1] for row in ranked("bleu")] == ["trial_002", "trial_000", "trial_001", "trial_003"]

  assert cli.main(["report", str(tmp_path), "--metric", "chrf"]) == 0
  assert "| 1 | trial_003 |" in capsys.readouterr().out
  # An unknown metric is one error line, before any sweep work.
  assert cli.main(["report", str(tmp_path), "--metric", "comet"]) == 2
  assert cli.main(["sweep", "--experiment", "demo", "--workdir", "x", "--metric", "ter"]) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 2 and all(line.startswith("error: --metric") for line in err)
  assert "use one of bleu, chrf" in err[0]


def sweep_command(root, *extra):
  return run_py("sweep", "--experiment", "demo", "--workdir", str(root), *TINY, *extra)


def subprocess_env(devices):
  return dict(os.environ, PYTHONUNBUFFERED="1", XLA_FLAGS=child_xla_flags(devices))


@pytest.mark.slow
def test_interrupted_sweep_resumes_without_rerunning_finished_trials(tmp_path, capsys):
  root = tmp_path / "sweep"
  # --dry-run: one command per trial, as a SLURM array would run them.
  dry_run = ["sweep", "--experiment", "demo", "--workdir", str(root), *TINY, "--dry-run"]
  assert cli.main(dry_run) == 0
  commands = capsys.readouterr().out.splitlines()
  assert len(commands) == 4 and all(f"--trial {i}" in c for i, c in enumerate(commands))
  assert not root.exists()  # a dry run writes nothing

  # Trial 0 alone, as SLURM array task 0 runs it: the shipped sbatch script under bash,
  # submitted from tmp_path (outside the repository) with the sweep root given relative to it.
  env = dict(
    subprocess_env(1),
    SLURM_ARRAY_TASK_ID="0",
    SLURM_SUBMIT_DIR=str(tmp_path),
    PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
    PYTHONPATH=str(ROOT),
  )
  subprocess.run(
    ["bash", str(ROOT / "launch" / "slurm_sweep.sbatch"), "demo", root.name, *TINY],
    cwd="/",
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  trial_0 = root / "trial_000"
  finished_0 = (trial_0 / sweep.TRIAL_FILENAME).read_text()
  metrics_0 = (trial_0 / "metrics.jsonl").read_text()
  assert json.loads(finished_0)["status"] == "finished"
  assert not (root / "trial_001").exists()

  # The whole sweep, stopped (SIGTERM, as on preemption) as soon as trial 1 has a checkpoint.
  process = subprocess.Popen(
    sweep_command(root),
    cwd=ROOT,
    env=subprocess_env(1),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  first_checkpoint = root / "trial_001" / "checkpoints" / "5" / "commit_success.txt"
  deadline = time.time() + 120
  while not first_checkpoint.exists():
    assert process.poll() is None, process.stdout.read()[-3000:]
    assert time.time() < deadline, "trial 1 wrote no checkpoint in time"
    time.sleep(0.02)
  process.send_signal(signal.SIGTERM)
  output = process.communicate(timeout=120)[0]
  assert process.returncode == 0, output[-3000:]
  assert "Skipping trial_000: finished earlier" in output
  assert "Sweep stopped by a signal during trial_001" in output
  assert sweep.trial_status(str(root / "trial_001")) is None
  assert not (root / "trial_002").exists()

  # Resume, two trials at a time on disjoint device groups.
  output = subprocess.run(
    sweep_command(root, "--parallel", "2"),
    cwd=ROOT,
    env=subprocess_env(2),
    capture_output=True,
    text=True,
    check=True,
  )
  output = output.stdout + output.stderr
  assert "Skipping trial_000: finished earlier" in output
  assert "Resumed from the checkpoint" in (root / "logs" / "trial_001.log").read_text()
  assert (trial_0 / sweep.TRIAL_FILENAME).read_text() == finished_0
  assert (trial_0 / "metrics.jsonl").read_text() == metrics_0
  for index in range(4):
    status = sweep.trial_status(str(root / f"trial_{index:03d}"))
    assert status["status"] == "finished" and status["steps"] == STEPS
    assert status["validation_bleu"] is not None and status["validation_chrf"] is not None
  # Trial 1 logged each step once across the two runs: the resumed part was not redone.
  steps_1 = [
    json.loads(line)["step"]
    for line in (root / "trial_001" / "metrics.jsonl").read_text().splitlines()
    if '"loss"' in line
  ]
  assert steps_1 == list(range(1, STEPS + 1))

  assert cli.main(["report", str(root)]) == 0
  rows = [
    line
    for line in capsys.readouterr().out.splitlines()
    if line.startswith("| ") and "trial_" in line
  ]
  assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 2", "| 3", "| 4"]
  ranked = [(-float(row.split(" | ")[3]), float(row.split(" | ")[6])) for row in rows]
  assert ranked == sorted(ranked)

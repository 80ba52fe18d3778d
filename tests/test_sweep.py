"""Sweeps on Optuna studies: the fixed trial lists of grid and random sweeps, the checks before a
sweep runs, storages and their errors, the report, pruning, a killed worker's trial taken over
and two workers sharing one study (journal file and PostgreSQL)."""

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest
from helpers import (
  ROOT,
  assert_same_params,
  child_xla_flags,
  experiment_file,
  final_params,
  run_py,
  tiny_overrides,
)
from optuna.trial import TrialState

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.config.search_space import Sweep, choice, log_uniform, randint, uniform
from transformer_mt.evaluation import reports, sweep_report
from transformer_mt.training import sweep, sweep_study
from transformer_mt.workdir import checkpointing, filesystems
from transformer_mt.workdir import lock as workdir_lock
from transformer_mt.workdir import metrics_log as metrics

STEPS = 40
TINY = tiny_overrides(
  "data.num_validation=8",
  "train.checkpoint_every=10",
  f"train.num_steps={STEPS}",
  "train.eval_every=10",
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


# news_ende_small's random sweep as the code before Optuna expanded it (commit a9c4162).
NEWS_TRIALS_BEFORE_OPTUNA = [
  (1.0, 0.19108850619643628, 0.1),
  (1.0, 0.012292057180858407, 0.0),
  (1.0, 0.004958290658558728, 0.0),
  (2.0, 0.2738266731833165, 0.2),
  (2.0, 0.18199073273015395, 0.2),
  (2.0, 0.16308749743962686, 0.2),
]


def test_a_study_gives_grid_and_random_sweeps_their_trials_of_before():
  """Trial number i of the study is the i-th entry of the list the code before Optuna ran."""
  news = sweep.load_sweep("news_ende_small")
  assert news.sampler_name == "random" and news.budget() == 6
  grid = Sweep(grid={"train.lr_scale": [0.5, 1.0], "train.warmup_steps": [250, 500]})
  for definition, expected in (
    (news, [dict(zip(news.trials()[0], values)) for values in NEWS_TRIALS_BEFORE_OPTUNA]),
    (
      grid,
      [{"train.lr_scale": a, "train.warmup_steps": b} for a in (0.5, 1.0) for b in (250, 500)],
    ),
  ):
    assert definition.trials() == expected
    study = optuna.create_study(sampler=sweep_study.sampler(definition))
    asked = [sweep_study.suggest(study.ask(), definition) for _ in expected]
    assert asked == expected


def test_prepare_checks_the_sweep_overrides_and_the_recorded_study(tmp_path):
  root = str(tmp_path / "root")
  definition, record = sweep.prepare("demo", root, ["train.num_steps=5", "train.bleu_every=5"])
  assert definition.sampler_name == "tpe" and definition.pruner == "asha"
  assert record["sweep"]["num_trials"] == 6 and record["storage"] is None
  with pytest.raises(ValueError, match="sets a key the sweep varies"):
    sweep.prepare("demo", root, ["train.lr_scale=2.0"])
  with pytest.raises(ValueError, match="declares no sweep"):
    sweep.prepare("seed_minimal", root)
  with pytest.raises(ValueError, match="Unknown config key"):
    sweep.prepare("demo", root, ["train.no_such_key=1"])
  with pytest.raises(ValueError, match="set train.bleu_every > 0"):
    sweep.prepare("demo", root, ["train.bleu_every=0"])
  study, _ = sweep_study.open_study(root, record, definition, None)
  assert os.path.exists(os.path.join(root, "study.journal"))
  _, changed = sweep.prepare("demo", root, ["train.num_steps=6", "train.bleu_every=5"])
  with pytest.raises(ValueError, match=r"records a different sweep \(overrides changed"):
    sweep_study.open_study(root, changed, definition, None)
  # The study itself refuses a changed sweep too, whatever the root says.
  os.remove(os.path.join(root, reports.SWEEP_FILENAME))
  with pytest.raises(ValueError, match="started by a different sweep or with other overrides"):
    sweep_study.open_study(root, changed, definition, None)
  for bad, message in (
    (Sweep(grid={"a": [1]}, sampler="bayes"), "sampler 'bayes' is not known"),
    (Sweep(grid={"a": [1]}, pruner="early"), "pruner 'early' is not known"),
    (Sweep(grid={"a": [1]}, metric="ter"), "metric 'ter' is not known"),
    (Sweep(grid={"a": [1]}, sampler="tpe"), "needs a budget"),
    (Sweep(grid={"a": [1]}, num_trials=3), "leave num_trials at 0"),
  ):
    with pytest.raises(ValueError, match=message):
      bad.check()
  with pytest.raises(ValueError, match="refuses its settings"):
    sweep_study.pruner(Sweep(grid={"a": [1]}, pruner="median", pruner_settings={"rungs": 2}))
  with pytest.raises(ValueError, match="refuses its settings"):
    sweep_study.sampler(
      Sweep(grid={"a": [1]}, sampler="tpe", num_trials=2, sampler_settings={"x": 1})
    )
  # TPE's random start-up is a third of a small budget, not Optuna's 10 (all of it).
  assert (
    sweep_study.sampler(Sweep(grid={"a": [1]}, sampler="tpe", num_trials=6))._n_startup_trials == 2
  )


def fake_mounts(tmp_path, monkeypatch, fs_type):
  """A mount table in which tmp_path is a `fs_type` mount."""
  table = tmp_path / "mountinfo"
  table.write_text(
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    f"98 22 0:51 / {tmp_path} rw,relatime shared:7 - {fs_type} server:/export rw\n"
  )
  monkeypatch.setattr(filesystems, "MOUNTINFO", str(table))


def test_storages_that_cannot_work_are_one_error_line(tmp_path, monkeypatch, capsys, caplog):
  def sweep_with(storage):
    root = tmp_path / f"root_{uuid.uuid4().hex[:6]}"
    code = cli.main(["sweep", "--experiment", "demo", "--workdir", str(root), "--storage", storage])
    return code, capsys.readouterr().err.strip().splitlines()

  for storage, message in (
    ("nosuchdialect://host/db", "cannot be opened: Can't load plugin"),
    ("postgresql+psycopg2://user:secret@127.0.0.1:1/db", "cannot be opened: "),
  ):
    code, err = sweep_with(storage)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --storage"), err
    assert message in err[0] and "secret" not in err[0]

  fake_mounts(tmp_path, monkeypatch, "nfs4")
  assert filesystems.filesystem_type(str(tmp_path / "not" / "yet")) == "nfs4"
  assert filesystems.filesystem_type("/usr") == "ext4"
  code, err = sweep_with(f"sqlite:///{tmp_path}/study.db")
  assert code == 2 and len(err) == 1 and "SQLite on a network filesystem (nfs4)" in err[0]
  assert not (tmp_path / "study.db").exists()
  sweep_study.study_storage.open_storage(None, str(tmp_path / "root"))  # a journal: warned
  assert "optuna/optuna#5138" in caplog.text


def test_report_ranks_the_trials_of_a_study_by_state_and_value(tmp_path, capsys):
  """A study with a trial in each state, written with ask/tell as workers would: the report
  ranks the complete ones by value, then the pruned (longest first), running and failed
  ones; `optuna.load_study` from outside lists the same trials; the plots are written."""
  root = str(tmp_path / "root")
  definition, record = sweep.prepare("demo", root, ["train.bleu_every=5"])
  study, _ = sweep_study.open_study(root, record, definition, None)
  scripted = [  # (final state, values reported at steps 100, 200, ...)
    (TrialState.COMPLETE, [10.0, 20.0]),
    (TrialState.PRUNED, [2.0]),
    (TrialState.COMPLETE, [15.0, 35.0]),
    (TrialState.RUNNING, [5.0]),
    (TrialState.FAIL, []),
    (TrialState.PRUNED, [3.0, 4.0]),
  ]
  for state, values in scripted:
    trial = study.ask()
    sweep_study.suggest(trial, definition)
    for step, value in enumerate(values, start=1):
      trial.report(value, 100 * step)
    if state == TrialState.COMPLETE:
      study.tell(trial, values[-1])
    elif state == TrialState.FAIL:
      trial.set_user_attr("error", "Non-finite loss at step 3")
      study.tell(trial, state=state)
    elif state == TrialState.PRUNED:
      study.tell(trial, state=state)
  assert cli.main(["report", root, "--plots", str(tmp_path / "plots")]) == 0
  out = capsys.readouterr().out
  rows = [
    line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "trial_" in line
  ]
  assert [(r[0], r[1], r[2]) for r in rows] == [
    ("| 1", "trial_002", "complete"),
    ("| 2", "trial_000", "complete"),
    ("| –", "trial_005", "pruned"),
    ("| –", "trial_001", "pruned"),
    ("| –", "trial_003", "running"),
    ("| –", "trial_004", "failed: Non-finite loss at step 3"),
  ]
  assert [r[3] for r in rows[:4]] == ["200", "200", "200", "100"]
  assert "2 complete, 2 pruned, 1 running, 1 failed" in out
  assert f"optuna-dashboard {root}/study.journal" in out
  for name in ("optimization_history", "intermediate_values", "param_importances"):
    assert (tmp_path / "plots" / "root" / f"{name}.png").stat().st_size > 1000
  outside = optuna.load_study(
    study_name=record["study_name"],
    storage=optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(f"{root}/study.journal")
    ),
  )
  assert [t.state for t in outside.trials] == [state for state, _ in scripted]
  assert [list(t.intermediate_values.values()) for t in outside.trials] == [v for _, v in scripted]
  assert set(outside.trials[0].params) == {"train.lr_scale", "train.warmup_steps"}
  # --metric belongs to sweeps from before Optuna; a study is ranked by its own.
  assert cli.main(["report", root, "--metric", "chrf"]) == 2
  assert "judges its trials by validation bleu" in capsys.readouterr().err


def write_old_root(root, scripted):
  """A sweep root written before Optuna: sweep.json's list of trials and finished trial.json
  files. `scripted`: name -> (validation BLEU, validation chrF or None, final loss)."""
  names = ["trial_000", "trial_001", "trial_002", "trial_003"]
  record = {
    "experiment": "demo",
    "overrides": [],
    "trials": [{"name": n, "overrides": ["k=1"]} for n in names],
  }
  root.mkdir()
  (root / reports.SWEEP_FILENAME).write_text(json.dumps(record))
  for name, (bleu, chrf, loss) in scripted.items():
    status = {"status": "finished", "trial": name, "overrides": ["k=1"], "steps": 10}
    status.update(validation_bleu=bleu, test_bleu=1.0, final_loss=loss)
    if chrf is not None:
      status["validation_chrf"] = chrf
    (root / name).mkdir()
    (root / name / reports.TRIAL_FILENAME).write_text(json.dumps(status))


def test_a_sweep_from_before_optuna_is_still_ranked_by_bleu_or_chrf(tmp_path, capsys):
  """Its trial.json files: BLEU (ties by the lower final loss, unfinished last) or chrF (trials
  without one last, shown as "–"); an unknown metric is one error line."""
  root = tmp_path / "old"
  write_old_root(
    root,
    {
      "trial_000": (30.0, 40.0, 2.0),
      "trial_001": (20.0, 55.0, 3.0),
      "trial_003": (30.0, 55.0, 1.5),
    },
  )

  def ranked(metric):
    assert cli.main(["report", str(root), "--metric", metric]) == 0
    table = capsys.readouterr().out.splitlines()
    return [line.split(" | ") for line in table if line.startswith("| ") and "trial_" in line]

  assert [r[1] for r in ranked("bleu")] == ["trial_003", "trial_000", "trial_001", "trial_002"]
  assert "unfinished" in ranked("bleu")[3][3]
  rows = ranked("chrf")
  assert [r[1] for r in rows[:3]] == ["trial_003", "trial_001", "trial_000"]
  assert cli.main(["report", str(root), "--metric", "comet"]) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("error: --metric") and "bleu, chrf" in err[0]
  with pytest.raises(ValueError, match="from before sweeps ran on Optuna"):
    sweep.run("demo", str(root))


def test_a_trial_locked_by_another_host_is_left_alone_until_forced(tmp_path, monkeypatch, caplog):
  """A running trial whose workdir lock a process on another host holds (a live worker
  there, for all this host can tell) is not taken over: the budget spent, the worker ends
  without training. `--force_unlock` takes it over (a dead node's trial)."""
  experiment = experiment_file(tmp_path, 'Sweep(grid={"train.lr_scale": [0.5]})')
  root = str(tmp_path / "root")
  definition, record = sweep.prepare(experiment, root)
  study, _ = sweep_study.open_study(root, record, definition, None)
  sweep_study.suggest(study.ask(), definition)  # as the other host's worker did
  lock = pathlib.Path(sweep.trial_dir(root, 0), workdir_lock.LOCK_FILENAME)
  lock.parent.mkdir()
  foreign = {"host": "node-17", "pid": 4242, "started": "2026-01-01T00:00:00+00:00"}
  lock.write_text(json.dumps(foreign))
  trained = []

  def run_trial(name, overrides, definition, study, trial, root):
    trained.append((trial.number, workdir_lock.read_holder(sweep.trial_dir(root, 0))["pid"]))
    study.tell(trial, 1.0)
    return True

  monkeypatch.setattr(sweep, "run_trial", run_trial)
  sweep.run(experiment, root)
  assert trained == [] and json.loads(lock.read_text()) == foreign
  with caplog.at_level(logging.WARNING):
    sweep.run(experiment, root, force_unlock=True)
  assert trained == [(0, os.getpid())] and not lock.exists()
  assert "--force_unlock: took over" in caplog.text and "node-17" in caplog.text


def logged_steps(workdir):
  return [r["step"] for r in metrics.read_metrics(str(workdir)) if "loss" in r]


@pytest.mark.slow
def test_a_diverging_trial_is_pruned_and_keeps_its_checkpoint(tmp_path, capsys):
  """Two trials judged by validation loss under the median pruner: the second, at a learning
  rate 1000 times the first's, diverges, is worse at its first validation and is stopped
  there, with that step's checkpoint; a rerun trains nothing more."""
  experiment = experiment_file(
    tmp_path,
    'Sweep(grid={"train.lr_scale": [0.5, 500.0]}, pruner="median", metric="loss", '
    'pruner_settings={"n_startup_trials": 1, "n_warmup_steps": 0})',
  )
  root = tmp_path / "root"
  diverging = ["train.warmup_steps=10", "train.nonfinite='skip'"]
  command = ["sweep", "--experiment", experiment, "--workdir", str(root), *TINY, *diverging]
  assert cli.main(command) == 0
  study, _ = sweep_report.load(str(root))
  assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED]
  assert sorted(study.trials[0].intermediate_values) == [10, 20, 30, 40]
  assert list(study.trials[1].intermediate_values) == [10]
  pruned = sweep.trial_dir(str(root), 1)
  assert checkpointing.all_steps(pruned) == [10]
  status = reports.trial_status(pruned)
  assert status["status"] == "pruned" and status["pruned_at"] == 10 and status["test_bleu"] is None
  assert logged_steps(pruned) == list(range(1, 11))
  assert "| – | trial_001 | pruned | 10 |" in capsys.readouterr().out
  assert cli.main(command) == 0  # nothing left: neither trial runs again
  assert logged_steps(pruned) == list(range(1, 11))
  assert len(sweep_report.load(str(root))[0].trials) == 2


def worker_env(devices):
  return dict(os.environ, PYTHONUNBUFFERED="1", XLA_FLAGS=child_xla_flags(devices))


@pytest.fixture(scope="module")
def resume_sweep(tmp_path_factory):
  """(experiment file, the uninterrupted trial's workdir): a sweep of one trial, and that
  trial trained without a stop, which every interrupted one must equal."""
  folder = tmp_path_factory.mktemp("resume_sweep")
  experiment = experiment_file(folder, 'Sweep(grid={"train.lr_scale": [0.7]}, metric="loss")')
  config = registry.load_experiment(experiment, [*TINY, "train.lr_scale=0.7"])
  from transformer_mt.training import train

  train.train(config, str(folder / "uninterrupted"), progress=False)
  return experiment, folder / "uninterrupted"


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["journal", "postgresql"])
def test_a_killed_workers_trial_is_finished_from_its_checkpoint(
  storage, resume_sweep, tmp_path, request, caplog
):
  """A worker (the SLURM script) is killed with SIGKILL once trial 0 has its step-10
  checkpoint: the trial stays running in the study. The next worker sees its lock is free,
  trains it on from the checkpoint with the same parameters and its reported values kept:
  its parameters equal an uninterrupted run's."""
  caplog.set_level(logging.INFO)
  experiment, uninterrupted = resume_sweep
  url = request.getfixturevalue("postgres_url") if storage == "postgresql" else None
  root = tmp_path / f"sweep_{uuid.uuid4().hex[:8]}"
  extra = ["--storage", url] if url else []
  # As many devices as this process, which trains the reference and the rest of the trial:
  # the same sharding, so the same sums in the same order.
  env = dict(worker_env(8), SLURM_ARRAY_TASK_ID="0", SLURM_SUBMIT_DIR=str(ROOT))
  env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
  process = subprocess.Popen(
    ["bash", str(ROOT / "launch" / "slurm_sweep.sbatch"), experiment, str(root), *extra, *TINY],
    cwd="/",
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  checkpoint = root / "trial_000" / "checkpoints" / "10" / "commit_success.txt"
  deadline = time.time() + 180
  while not checkpoint.exists():
    assert process.poll() is None, process.stdout.read()[-3000:]
    assert time.time() < deadline, "trial 0 wrote no checkpoint in time"
    time.sleep(0.02)
  process.send_signal(signal.SIGKILL)
  assert process.wait() == -signal.SIGKILL
  process.stdout.close()
  study, _ = sweep_report.load(str(root), url)
  assert [t.state for t in study.trials] == [TrialState.RUNNING]
  reported_before = dict(study.trials[0].intermediate_values)
  assert 10 in reported_before

  assert cli.main(["sweep", "--experiment", experiment, "--workdir", str(root), *extra, *TINY]) == 0
  study, _ = sweep_report.load(str(root), url)
  assert [t.state for t in study.trials] == [TrialState.COMPLETE]
  assert study.trials[0].params == {"train.lr_scale": 0.7}
  trial_0 = study.trials[0]
  assert sorted(trial_0.intermediate_values) == [10, 20, 30, 40]
  assert all(trial_0.intermediate_values[s] == v for s, v in reported_before.items())
  assert_same_params(final_params(root / "trial_000", STEPS), final_params(uninterrupted, STEPS))
  # Trained on from step 10, each step logged once (rows past the checkpoint dropped).
  assert "Resumed from the checkpoint of step 10" in caplog.text
  assert logged_steps(root / "trial_000") == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_two_workers_share_one_study_and_never_run_one_trial_twice(tmp_path, capsys):
  """`--parallel 2`: two worker processes on one journal file run the four trials of a grid,
  each trial once (its steps logged once), every grid point once. The two trials with a bad
  setting fail with their error line, recorded, and the workers go on."""
  experiment = experiment_file(
    tmp_path, 'Sweep(grid={"train.lr_scale": [0.5, 1.0], "train.nonfinite": ["stop", "bogus"]})'
  )
  root = tmp_path / "root"
  output = subprocess.run(
    run_py("sweep", "--experiment", experiment, "--workdir", str(root), "--parallel", "2", *TINY),
    cwd=ROOT,
    env=worker_env(2),
    capture_output=True,
    text=True,
  )
  assert output.returncode == 0, (output.stdout + output.stderr)[-3000:]
  study, _ = sweep_report.load(str(root))
  complete, failed = TrialState.COMPLETE, TrialState.FAIL
  assert [t.state for t in study.trials] == [complete, failed, complete, failed]
  points = {(t.params["train.lr_scale"], t.params["train.nonfinite"]) for t in study.trials}
  assert points == {(a, b) for a in (0.5, 1.0) for b in ("stop", "bogus")}
  ran = []
  for worker in (0, 1):
    log = (root / "logs" / f"worker_{worker}.log").read_text()
    ran.append({n for n in range(4) if f"Trial {n}: " in log})
  assert ran[0] and ran[1] and not ran[0] & ran[1] and ran[0] | ran[1] == set(range(4)), ran
  for number in (0, 2):
    assert logged_steps(root / f"trial_{number:03d}") == list(range(1, STEPS + 1))
  for number in (1, 3):
    status = reports.trial_status(str(root / f"trial_{number:03d}"))
    assert status["status"] == "failed" and "train.nonfinite='bogus'" in status["error"]
    assert study.trials[number].user_attrs["error"] == status["error"]
  assert "2 complete, 0 pruned, 0 running, 2 failed" in output.stdout
  assert "| failed: train.nonfinite='bogus' must be" in output.stdout

"""`--experiment path/to/my_exp.py`: an experiment file kept outside the repository trains like
a named one, its path is made absolute once (so sweep trials and SLURM jobs started elsewhere
find it), and no top-level `experiments` package is installed or imported."""

import sys
import textwrap

from helpers import tiny_overrides

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.workdir import checkpointing

SMALL = tiny_overrides(
  "data.num_validation=8", "train.num_steps=4", "train.log_every=2", "train.checkpoint_every=4"
)

MY_EXPERIMENT = '''
"""A user's experiment: the demo with its own description and a one-trial sweep."""

from transformer_mt.config import registry

demo = registry.experiment_module("demo")


def get_config():
  config = demo.get_config()
  config.description = "my experiment, kept outside the repository"
  return config


def get_sweep():
  return demo.get_sweep()
'''


def write_experiment(folder, text=MY_EXPERIMENT, name="my_exp.py"):
  folder.mkdir(parents=True, exist_ok=True)
  (folder / name).write_text(textwrap.dedent(text))
  return folder / name


def test_an_experiment_file_outside_the_repository_trains(tmp_path, monkeypatch):
  path = write_experiment(tmp_path / "mine")
  monkeypatch.chdir(tmp_path)
  argv = ["train", "--experiment", "mine/my_exp.py", "--workdir", "w", *SMALL]
  assert cli.main(argv) == 0
  config, _, step = checkpointing.read_config(str(tmp_path / "w"))
  assert step == 4
  assert config.experiment == str(path)  # absolute: the command ran from tmp_path
  assert config.description == "my experiment, kept outside the repository"
  assert "experiments" not in sys.modules


def test_the_same_file_is_loaded_once_whether_named_or_given_by_path():
  named = registry.experiment_module("demo")
  assert registry.experiment_module(str(registry.EXPERIMENTS_DIR / "demo.py")) is named
  assert registry.load_experiment(str(registry.EXPERIMENTS_DIR / "demo.py")).model.d_model == (
    registry.load_experiment("demo").model.d_model
  )


def test_a_missing_file_or_one_without_get_config_is_one_error_line(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  write_experiment(tmp_path, "X = 1\n", name="no_config.py")
  for experiment, fragment in [
    ("absent/my_exp.py", "absent/my_exp.py does not exist; give a Python file"),
    ("no_config.py", "no_config.py defines no get_config()"),
  ]:
    assert cli.main(["train", "--experiment", experiment, "--workdir", "w", *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and fragment in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "w").exists()


def test_a_sweep_dry_run_names_the_file_by_its_absolute_path(tmp_path, monkeypatch, capsys):
  path = write_experiment(tmp_path / "mine")
  monkeypatch.chdir(tmp_path)
  argv = ["sweep", "--experiment", "mine/my_exp.py", "--workdir", "root", "--dry-run"]
  assert cli.main(argv) == 0
  command = capsys.readouterr().out.strip().splitlines()[-1]
  assert command.startswith("python run.py sweep ") and f"--experiment {path} " in command
  assert not (tmp_path / "root").exists()

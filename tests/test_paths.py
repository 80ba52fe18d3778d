"""Paths as users type them: relative to the current directory, `~`, moved workdirs, and
data folders a user never had. The libraries underneath (Orbax, TensorBoard) must only ever
see absolute paths; the CLI resolves every path once, where it parses the command line."""

import os
import shutil

import orbax.checkpoint as ocp
import pytest
import tensorboardX
from helpers import tiny_overrides

from transformer_mt import cli
from transformer_mt.commands import paths
from transformer_mt.workdir import checkpointing
from transformer_mt.workdir import metrics_log as metrics

pytestmark = pytest.mark.slow

TINY = tiny_overrides("data.num_validation=8", "train.checkpoint_every=5")


@pytest.fixture
def library_paths(monkeypatch):
  """Every directory handed to Orbax's CheckpointManager and TensorBoard's SummaryWriter.

  Grain's iterator state is written by Orbax into the checkpoint directory, so the
  CheckpointManager's path covers it too.
  """
  seen = []
  manager_init = ocp.CheckpointManager.__init__
  writer_init = tensorboardX.SummaryWriter.__init__

  def record_manager(self, directory, *args, **kwargs):
    seen.append(("orbax", str(directory)))
    manager_init(self, directory, *args, **kwargs)

  def record_writer(self, logdir=None, *args, **kwargs):
    seen.append(("tensorboard", str(logdir)))
    writer_init(self, logdir, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "__init__", record_manager)
  monkeypatch.setattr(tensorboardX.SummaryWriter, "__init__", record_writer)
  return seen


def test_relative_paths_everywhere_and_a_moved_workdir(tmp_path, monkeypatch, library_paths):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "lines.txt").write_text("the old dog watched these apples\n\nmy cats\n")

  assert cli.main(["train", "--workdir", "runs/a", *TINY, "train.num_steps=10"]) == 0
  assert checkpointing.all_steps(str(tmp_path / "runs" / "a")) == [5, 10]
  commands = [
    ["translate", "--workdir", "runs/a", "--input", "lines.txt", "--output", "out/a.txt"],
    ["evaluate", "--workdir", "runs/a", "--limit", "4"],
    ["average", "--workdir", "runs/a", "--last", "2", "--output", "avg"],
    ["evaluate", "--workdir", "avg", "--source", "lines.txt", "--reference", "lines.txt"],
    ["attention", "--workdir", "runs/a", "--src", "my cats", "--output", "att.png"],
    ["plot", "runs/a", "--output", "curves.png"],
  ]
  for command in commands:
    os.makedirs("out", exist_ok=True)
    assert cli.main(command) == 0, command
  assert len((tmp_path / "out" / "a.txt").read_text().splitlines()) == 3
  assert (tmp_path / "att.png").exists() and (tmp_path / "curves.png").exists()
  assert (tmp_path / "avg" / "checkpoints").is_dir()

  # A moved workdir keeps working: translate from, and resume in, the new place.
  shutil.move("runs/a", "moved")
  assert cli.main(["translate", "--workdir", "moved", "--input", "lines.txt", "--output", "b"]) == 0
  assert (tmp_path / "b").read_text() == (tmp_path / "out" / "a.txt").read_text()
  assert cli.main(["train", "--workdir", "moved", *TINY, "train.num_steps=15"]) == 0
  assert checkpointing.all_steps(str(tmp_path / "moved")) == [10, 15]
  steps = [r["step"] for r in metrics.read_metrics(str(tmp_path / "moved")) if "loss" in r]
  assert steps == list(range(1, 16))  # resumed at 10, not restarted

  assert {kind for kind, _ in library_paths} == {"orbax", "tensorboard"}
  relative = [(kind, path) for kind, path in library_paths if not os.path.isabs(path)]
  assert not relative


def test_home_and_path_overrides_are_resolved_once(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.chdir(tmp_path)
  args = cli.build_parser().parse_args(
    [
      "train",
      "--workdir",
      "~/runs/x",
      "data.root=corpus",
      "data.tfds_data_dir='~/tfds'",
      "data.tfds_manual_dir=",
      "train.num_steps=3",
    ]
  )
  paths.resolve_paths(args)
  assert args.workdir == str(tmp_path / "runs" / "x")
  assert args.overrides == [
    f"data.root={str(tmp_path / 'corpus')!r}",
    f"data.tfds_data_dir={str(tmp_path / 'tfds')!r}",
    "data.tfds_manual_dir=''",
    "train.num_steps=3",
  ]
  # URLs (a GCS workdir) and stdin/stdout are left as they are.
  args = cli.build_parser().parse_args(
    ["translate", "--workdir", "gs://bucket/run", "--input", "-", "--output", "-"]
  )
  paths.resolve_paths(args)
  # translate takes --workdir repeatedly (an ensemble): a list.
  assert (args.workdir, args.input, args.output) == (["gs://bucket/run"], "-", "-")


def test_missing_data_folder_says_which_data_root_to_pass(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  status = cli.main(
    ["train", "--experiment", "news_ende_small", "--workdir", "w", "data.root=nowhere"]
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert status == 2 and len(err) == 1, err
  assert f"data.root={tmp_path / 'nowhere'} does not exist" in err[0]
  assert "sacrebleu -t wmt14/full -l en-de --echo src" in err[0]
  assert "Helsinki-NLP/OPUS-MT-testsets" in err[0]
  # A folder that exists but lacks the files: the missing file, data.root and the same advice.
  (tmp_path / "empty").mkdir()
  assert cli.main(["train", "--experiment", "news_ende_small", "--workdir", "w", "data.root=empty"])
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "No such file" in err[0] and "news-test2008.en" in err[0]
  assert f"data.root={tmp_path / 'empty'}" in err[0] and "sacrebleu -t wmt14/full" in err[0]
  assert not (tmp_path / "w").exists()  # nothing written

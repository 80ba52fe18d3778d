"""Resuming over changed training data (issue 34): a checkpoint records the data it was on
(pair count, the prepared files' key, the tokenizer's hash); a resume over other data stops
with one `error:` line naming what changed, or goes on with a warning when
data.allow_changed_corpus=True. A copy that keeps size and mtime (`cp -p`, `rsync -t`) is a
new version of the file: it is prepared again."""

import os
import shutil

import pytest
from helpers import local_train_overrides, tiny_overrides, write_local_pairs

from transformer_mt import cli
from transformer_mt.data import corpus_fingerprint, prepared_corpus, synthetic


def _command(tmp_path, steps, *extra):
  return [
    "train",
    "--experiment",
    "demo",
    "--workdir",
    str(tmp_path / "run"),
    *tiny_overrides(f"train.num_steps={steps}", "train.checkpoint_every=5"),
    *local_train_overrides(tmp_path / "data", tmp_path / "cache"),
    "evaluate.test_after_training=False",
    *extra,
  ]


@pytest.fixture
def a_run_at_step_5(tmp_path):
  pairs = list(synthetic.generate_splits(600, 4, seed=3)["train"])
  write_local_pairs(tmp_path / "data", pairs)
  assert cli.main(_command(tmp_path, 5)) == 0
  return pairs


def _errors(capsys):
  return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]


def test_resuming_over_a_changed_file_stops_with_one_line(tmp_path, a_run_at_step_5, capsys):
  pairs = a_run_at_step_5
  write_local_pairs(tmp_path / "data", pairs + pairs[:7])  # 7 more pairs
  assert cli.main(_command(tmp_path, 10)) == 2
  (line,) = _errors(capsys)
  assert "Cannot resume from step 5" in line
  assert "600 training pairs then, 607 now" in line
  assert f"{tmp_path / 'data' / 'train.en'} changed (size" in line
  assert "data.allow_changed_corpus=True" in line
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints"))[-1] == "5"  # nothing written


def test_the_flag_goes_on_over_the_new_data_with_a_warning(tmp_path, a_run_at_step_5, caplog):
  pairs = a_run_at_step_5
  write_local_pairs(tmp_path / "data", list(reversed(pairs)))  # same count, other order
  caplog.set_level("WARNING")
  assert cli.main(_command(tmp_path, 10, "data.allow_changed_corpus=True")) == 0
  assert "The training data changed since this checkpoint was written" in caplog.text
  assert "10" in os.listdir(tmp_path / "run" / "checkpoints")


def test_unchanged_data_resume_silently(tmp_path, a_run_at_step_5, caplog):
  caplog.set_level("WARNING")
  assert cli.main(_command(tmp_path, 10)) == 0
  assert "changed" not in caplog.text


def test_a_copy_keeping_size_and_mtime_is_prepared_again(tmp_path):
  """`cp -p` of another text with the same size and mtime: before, the old index (other line
  offsets) was reused; the inode and ctime in the key tell the versions apart."""
  folder = tmp_path / "data"
  folder.mkdir()
  original, other = folder / "train.en", tmp_path / "other.en"
  original.write_text("aa\nbb\ncc\n")
  other.write_text("a\nbbbb\nc\n")  # same size, other lines
  stat = os.stat(original)
  os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  (folder / "train.xx").write_text("x\ny\nz\n")
  files = [(str(original), str(folder / "train.xx"))]
  corpus, _ = prepared_corpus.prepare(files, str(tmp_path / "cache"))
  assert list(corpus)[1] == ("bb", "y")
  before = corpus.files_key()
  os.remove(original)
  shutil.copy2(other, original)  # what cp -p does: same size and mtime, new inode and ctime
  assert os.stat(original).st_size == stat.st_size
  assert os.stat(original).st_mtime_ns == stat.st_mtime_ns
  corpus, prepared_now = prepared_corpus.prepare(files, str(tmp_path / "cache"))
  assert prepared_now == [str(original)] and list(corpus)[1] == ("bbbb", "y")
  changed = corpus_fingerprint.differences(
    {"pairs": 3, "files": before, "tokenizer": "t"},
    {"pairs": 3, "files": corpus.files_key(), "tokenizer": "t"},
  )
  assert len(changed) == 1 and "changed (inode, ctime_ns)" in changed[0]


def test_differences_name_each_kind_of_change():
  files = [["/d/a.en", 10, 1, 7, 1], ["/d/a.xx", 10, 1, 8, 1]]
  same = {"pairs": 5, "files": files, "tokenizer": "t1"}
  assert corpus_fingerprint.differences(same, dict(same)) == []
  other = {
    "pairs": 6,
    "files": [["/d/a.en", 12, 2, 7, 2], ["/d/b.xx", 10, 1, 9, 1]],
    "tokenizer": "t2",
  }
  assert corpus_fingerprint.differences(same, other) == [
    "5 training pairs then, 6 now",
    "/d/a.en changed (size, mtime_ns, ctime_ns); /d/a.xx gone; /d/b.xx new",
    "another tokenizer",
  ]
  # A state saved before fingerprints existed, or a source without one, is not checked.
  corpus_fingerprint.check(None, same, allow_changed=False)
  with pytest.raises(corpus_fingerprint.CorpusChanged, match="another tokenizer"):
    corpus_fingerprint.check(same, dict(same, tokenizer="t3"), allow_changed=False)

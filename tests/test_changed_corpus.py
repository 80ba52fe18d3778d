"""Resuming over changed training data (issue 34): a checkpoint records the data it was on
(pair count, each prepared file's content digest, the tokenizer's hash); a resume over other
data stops with one `error:` line naming what changed, or goes on with a warning when
data.allow_changed_corpus=True. A copy that keeps size and mtime (`cp -p`, `rsync -t`) is a
new version of the file: it is prepared again. A copy of the same text (a job that stages its
data on local disk) resumes as it is."""

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
  assert f"{tmp_path / 'data' / 'train.en'} holds other text" in line
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


def test_the_same_text_copied_anew_resumes_silently(tmp_path, a_run_at_step_5, caplog):
  """The corpus written again with the same text: new inode, mtime and ctime, as when a job
  copies its data to a node's local disk. It is prepared again; the resume goes on, the same
  as over the untouched files. (Before the digests it stopped: "changed (mtime_ns, inode,
  ctime_ns)".)"""
  write_local_pairs(tmp_path / "data", a_run_at_step_5)  # the same pairs, written anew
  caplog.set_level("WARNING")
  assert cli.main(_command(tmp_path, 10)) == 0
  assert "changed" not in caplog.text
  assert "10" in os.listdir(tmp_path / "run" / "checkpoints")


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
  before = corpus.content_key()
  os.remove(original)
  shutil.copy2(other, original)  # what cp -p does: same size and mtime, new inode and ctime
  assert os.stat(original).st_size == stat.st_size
  assert os.stat(original).st_mtime_ns == stat.st_mtime_ns
  corpus, prepared_now = prepared_corpus.prepare(files, str(tmp_path / "cache"))
  assert prepared_now == [str(original)] and list(corpus)[1] == ("bbbb", "y")
  changed = corpus_fingerprint.differences(
    {"pairs": 3, "files": before, "tokenizer": "t"},
    {"pairs": 3, "files": corpus.content_key(), "tokenizer": "t"},
  )
  assert changed == [f"{original} holds other text"]


def test_differences_name_each_kind_of_change():
  files = [["/d/a.en", "e1"], ["/d/a.xx", "x1"]]
  same = {"pairs": 5, "files": files, "tokenizer": "t1"}
  assert corpus_fingerprint.differences(same, dict(same)) == []
  moved = [["/node/a.en", "e1"], ["/node/a.xx", "x1"]]  # the same bytes elsewhere
  assert corpus_fingerprint.differences(same, dict(same, files=moved)) == []
  other = {
    "pairs": 6,
    "files": [["/d/a.en", "e2"], ["/e/a.xx", "x2"], ["/d/b.en", "b1"]],
    "tokenizer": "t2",
  }
  assert corpus_fingerprint.differences(same, other) == [
    "5 training pairs then, 6 now",
    "/d/a.en holds other text; /e/a.xx holds other text than /d/a.xx did; /d/b.en new",
    "another tokenizer",
  ]
  assert corpus_fingerprint.differences(dict(same, files=files + [["/d/c.en", "c"]]), same) == [
    "/d/c.en gone"
  ]
  # A state saved before fingerprints existed, or a source without one, is not checked.
  corpus_fingerprint.check(None, same, allow_changed=False)
  with pytest.raises(corpus_fingerprint.CorpusChanged, match="another tokenizer"):
    corpus_fingerprint.check(same, dict(same, tokenizer="t3"), allow_changed=False)


def test_a_checkpoint_of_before_the_digests_is_compared_by_metadata(tmp_path):
  """Fingerprints saved before content digests hold (path, size, mtime, inode, ctime): they
  are compared with the files' metadata now, as they were when written."""
  path = tmp_path / "a.en"
  path.write_text("a\n")
  st = os.stat(path)
  legacy = {
    "pairs": 1,
    "files": [[str(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]],
  }
  current = {"pairs": 1, "files": [[str(path), "digest"]]}
  assert corpus_fingerprint.differences(legacy, current) == []
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
  (changed,) = corpus_fingerprint.differences(legacy, current)
  assert changed.startswith(f"{path} changed (mtime_ns, ctime_ns")

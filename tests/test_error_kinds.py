"""Two kinds of failure, told apart by cli.main: bad input the project raises on purpose
(errors.UserError) is one `error:` line and exit status 2; anything else (a JAX, Orbax or
internal error, even a plain ValueError or KeyError) is a bug: its traceback, what to report,
exit status 1. Never the other way round."""

import ast

import pytest
from helpers import ROOT

from transformer_mt import cli
from transformer_mt.config import registry
from transformer_mt.data import text_files
from transformer_mt.runtime import errors


def run_main(argv, capsys):
  status = cli.main(argv)
  captured = capsys.readouterr()
  return status, captured.err.strip()


def test_bad_input_is_one_error_line_with_status_2(tmp_path, capsys):
  argv = ["train", "--experiment", "nope", "--workdir", str(tmp_path / "w")]
  status, err = run_main(argv, capsys)
  assert status == 2
  assert err.startswith("error: Unknown experiment 'nope'") and len(err.splitlines()) == 1
  assert "Traceback" not in err and cli.BUG_REPORT not in err
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
  "internal",
  [
    ValueError("operands could not be broadcast together"),  # what NumPy or JAX would raise
    KeyError("params"),  # e.g. a tree missing an item, inside Orbax
    RuntimeError("INTERNAL: XLA compilation failed"),
    FileNotFoundError(2, "No such file or directory", "/tmp/ocdbt.process_0/manifest"),
  ],
  ids=type,
)
def test_an_error_not_raised_on_purpose_is_a_bug_with_its_traceback(
  internal, tmp_path, capsys, monkeypatch
):
  def broken(*args, **kwargs):
    raise internal

  monkeypatch.setattr(registry, "load_experiment", broken)
  status, err = run_main(["train", "--workdir", str(tmp_path / "w")], capsys)
  assert status == 1
  assert err.startswith("Traceback (most recent call last):")
  assert "in broken" in err  # the frame that raised it, for the report
  assert f"{type(internal).__name__}: " in err
  assert err.endswith(cli.BUG_REPORT)
  assert "please report it with the command, the traceback" in cli.BUG_REPORT
  assert "pip freeze" in cli.BUG_REPORT
  assert not any(line.startswith("error:") for line in err.splitlines())


def test_debug_shows_the_traceback_of_bad_input_too(tmp_path):
  with pytest.raises(errors.BadValue, match="Unknown experiment"):
    cli.main(["--debug", "train", "--experiment", "nope", "--workdir", str(tmp_path / "w")])


def test_project_errors_are_still_their_builtin_types():
  """Callers (and tests) that catch ValueError, FileNotFoundError... still catch them."""
  for cls, builtin in (
    (errors.BadValue, ValueError),
    (errors.MissingFile, FileNotFoundError),
    (errors.AlreadyExists, FileExistsError),
    (errors.UnknownName, KeyError),
    (text_files.DataError, ValueError),
  ):
    assert issubclass(cls, errors.UserError) and issubclass(cls, builtin)
  assert str(errors.UnknownName("en->de: the record has languages ['fr']")) == (
    "en->de: the record has languages ['fr']"  # not KeyError's quoted repr
  )
  assert not issubclass(ValueError, errors.UserError)


def test_user_input_failing_inside_a_library_is_still_one_line(tmp_path, capsys):
  """A file the user named that is not JSON, or an output directory that does not exist."""
  broken = tmp_path / "broken.json"
  broken.write_text("{not json")
  with pytest.raises(text_files.DataError, match=r"broken.json is not valid JSON"):
    text_files.read_json(broken)
  with pytest.raises(errors.MissingFile, match="does not exist"):
    text_files.read_json(tmp_path / "absent.json")
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "results.json").write_text("{not json")
  status, err = run_main(["report", str(tmp_path / "run")], capsys)
  assert status == 2 and err.startswith("error: ") and "results.json is not valid JSON" in err
  target = tmp_path / "no_such_dir" / "out.txt"
  with pytest.raises(text_files.DataError, match="Cannot write .*no_such_dir/out.txt"):
    text_files.write_atomically(target, "x")
  assert not (tmp_path / "no_such_dir").exists()


# Plain built-in raises left in the package: checks of our own invariants, which bad input
# cannot reach; if one fires it is a bug and must show its traceback.
INTERNAL_RAISES = {
  "model/attention.py": 2,  # attention weights asked of the in-place cache; an empty cross cache
  "model/decode_cache.py": 2,  # a self-attention cache without a length; more than one token a step
  "decoding/beam_rows.py": 2,  # cache leaf without a batch axis; a batch the devices do not split
  "decoding/incremental.py": 1,  # ensemble params/configs of different lengths
  "decoding/beam_search.py": 1,  # cache sizes of a growing cache that beam_decode did not pick
  "model/transformer.py": 1,  # decode=True without positions
  "training/optimizer.py": 1,  # an optimizer state without exactly one schedule count
  "evaluation/plots.py": 1,  # attention arrays of the wrong shape
  "data/synthetic.py": 1,  # not a sentence of the synthetic grammar (tests' data)
  "runtime/sharding.py": 1,  # a negative prefetch size
  "data/tokenizer.py": 1,  # a tokenizer kind with no file format
  "data/line_index_cache.py": 1,  # remove_unused with days under the minimum (prepare checks it)
  "interop/hf_export.py": 2,  # a parameter or weight with no Marian name (the mapping's own bug)
}


def test_deliberate_raises_use_the_project_errors():
  """Every `raise ValueError/FileNotFoundError/FileExistsError/KeyError(...)` in the package is
  one of the internal checks above; bad input raises errors.* (so it stays one line)."""
  builtin = {"ValueError", "FileNotFoundError", "FileExistsError", "KeyError", "RuntimeError"}
  found = {}
  package = ROOT / "transformer_mt"
  for path in sorted(package.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
        func = node.exc.func
        if isinstance(func, ast.Name) and func.id in builtin:
          name = path.relative_to(package).as_posix()
          found[name] = found.get(name, 0) + 1
  assert found == INTERNAL_RAISES

"""The persistent compilation cache (compile_cache.py): where it lives, how to turn it off, and
that a second process loads what the first compiled. Every process here runs with its own
XDG_CACHE_HOME under tmp_path, so nothing touches the user's ~/.cache."""

import json
import os
import pathlib
import subprocess
import sys

from helpers import ROOT, run_py

# One process: set up the cache as run.py does, compile a tiny function (written whatever its
# compile time), and report the directory and the cache hits JAX counted.
_PROCESS = """
import json, jax, jax.numpy as jnp
from transformer_mt.runtime import compile_cache
hits = []
jax.monitoring.register_event_listener(
  lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
path = compile_cache.enable()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
value = float(jax.jit(lambda x: (x * x).sum())(jnp.arange(4.0)))
print(json.dumps({"path": path, "value": value, "hits": len(hits)}))
"""


def _env(tmp_path, **extra):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  env.update(extra)
  return env


def _run(env):
  out = subprocess.run(
    [sys.executable, "-c", _PROCESS], env=env, cwd=ROOT, capture_output=True, text=True, check=True
  )
  return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _files(path):
  return sorted(p.name for p in pathlib.Path(path).iterdir()) if os.path.isdir(path) else []


def test_default_dir_is_the_user_cache_and_a_second_process_reuses_it(tmp_path):
  env = _env(tmp_path)
  expected = tmp_path / "xdg" / "transformer_mt" / "jax"
  first, _ = _run(env)
  assert first == {"path": str(expected), "value": 14.0, "hits": 0}
  written = _files(expected)
  assert any(name.startswith("jit__lambda") for name in written), written
  second, _ = _run(env)
  # Every program the first process wrote (the function and jnp.arange's) is loaded, none
  # compiled and written again.
  assert second == {"path": str(expected), "value": 14.0, "hits": len(written)}
  assert _files(expected) == written


def test_explicit_jax_dir_wins(tmp_path):
  explicit = tmp_path / "explicit"
  result, _ = _run(_env(tmp_path, JAX_COMPILATION_CACHE_DIR=str(explicit)))
  assert result["path"] == str(explicit)
  assert _files(explicit)
  assert not (tmp_path / "xdg").exists()


def test_opting_out_writes_nothing(tmp_path):
  for opt_out in ({"JAX_COMPILATION_CACHE_DIR": ""}, {"JAX_ENABLE_COMPILATION_CACHE": "false"}):
    result, _ = _run(_env(tmp_path, **opt_out))
    assert result == {"path": None, "value": 14.0, "hits": 0}, opt_out
    assert not (tmp_path / "xdg").exists()


def test_unwritable_cache_dir_warns_and_the_command_runs(tmp_path):
  # A file where the cache's parent directory should be: no user can create the directory.
  (tmp_path / "xdg").write_text("not a directory")
  result, stderr = _run(_env(tmp_path))
  assert result == {"path": None, "value": 14.0, "hits": 0}
  assert "not writable" in stderr
  # run.py sets the cache up before any command, and carries on without one.
  out = subprocess.run(
    run_py("list"),
    env=_env(tmp_path),
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert out.returncode == 0, out.stderr
  assert "demo" in out.stdout
  default_dir = tmp_path / "xdg" / "transformer_mt" / "jax"
  assert f"Compilation cache directory {default_dir} is not writable" in out.stderr

"""Where tests find the shared data folder (../shared/data beside the repository root), and
what a test that needs it does when it is absent: skip on a developer's machine, fail in CI.

CI (the `CI` environment variable set, as CI services do) must run every test: a test of the
real packer or of an Orbax resume that silently skipped would pass CI without testing
anything. TRANSFORMER_MT_SHARED_DATA points the tests at another copy of the folder.
"""

from __future__ import annotations

import os
import pathlib

import pytest

DIR = pathlib.Path(
  os.environ.get("TRANSFORMER_MT_SHARED_DATA")
  or pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
)


def require(*relative: str) -> pathlib.Path:
  """DIR, once DIR and each `relative` path under it (a file or folder) exist.

  Otherwise the test skips naming what is missing (tests/conftest.py turns the skip into a
  failure under CI). `@pytest.mark.shared_data(*relative)` calls this before a test runs.
  """
  missing = [DIR / name for name in relative or ("",) if not (DIR / name).exists()]
  if missing:
    message = (
      f"needs the shared data: {', '.join(map(str, missing))} missing (see docs/data.md; "
      " TRANSFORMER_MT_SHARED_DATA can point at the folder)"
    )
    pytest.skip(message)
  return DIR

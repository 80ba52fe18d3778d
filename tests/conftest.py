"""Makes the repository root importable (`transformer_mt`, `experiments`) without installing it."""

import pathlib
import sys

_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

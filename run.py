"""Entry point: `python run.py list | train | translate` (same as the `transformer-mt` script)."""

import sys

from transformer_mt.__main__ import main

if __name__ == "__main__":
  sys.exit(main())

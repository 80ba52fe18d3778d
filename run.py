"""Entry point: `python run.py list | train | translate` (same as the `transformer-mt` script)."""

import sys

from transformer_mt.cli import main

if __name__ == "__main__":
  sys.exit(main())

"""Entry point: `python run.py list | train | translate` (same as the `transformer-mt` script)."""

import sys

from transformer_mt.launch import main

if __name__ == "__main__":
  sys.exit(main())

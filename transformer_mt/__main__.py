"""`python -m transformer_mt`, `run.py` and the `transformer-mt` script: the allocator and
garbage-collector settings (runtime/allocator.py), then the command line."""

import sys

from transformer_mt.runtime.allocator import collect_less_often, reexec_with_allocator_settings


def main() -> int:
  reexec_with_allocator_settings()
  collect_less_often()
  from transformer_mt.cli import main as cli_main

  return cli_main()


if __name__ == "__main__":
  sys.exit(main())

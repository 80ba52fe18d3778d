"""One module per run.py command: add_parser(subparsers) and run(args)."""

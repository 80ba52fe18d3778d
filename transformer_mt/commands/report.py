"""`run.py report`: a markdown table (and PNG chart) of reproduced rows; a sweep root given
instead is ranked by its trials' validation BLEU (or --metric chrf)."""

from __future__ import annotations

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "report",
    help="markdown table (and PNG chart) of reproduced rows; "
    "sweep roots are ranked by validation BLEU (or --metric chrf)",
  )
  p.add_argument("workdirs", nargs="+", help="workdirs holding results.json, or sweep roots")
  p.add_argument("--chart", default=None, help="also write a PNG bar chart here")
  p.add_argument("--metric", default="bleu", help=flags.METRIC_HELP)
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.evaluation import reports

  reports.check_metric(args.metric)
  sweeps = [w for w in args.workdirs if reports.is_sweep_dir(w)]
  rows = [w for w in args.workdirs if w not in sweeps]
  for root in sweeps:
    print(reports.ranking_table(root, args.metric) + "\n")
  if rows:
    print(reports.report(rows, args.chart))
    if args.chart:
      print(f"chart: {args.chart}")

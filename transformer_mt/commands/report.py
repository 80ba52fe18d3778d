"""`run.py report`: a markdown table (and PNG chart) of reproduced rows; a sweep root given
instead gets its trials ranked (state, steps, value, parameters) and, with --plots, Optuna's
plots of its study as PNG files."""

from __future__ import annotations

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "report",
    help="markdown table (and PNG chart) of reproduced rows; sweep roots: trials ranked "
    "with their state (complete, pruned, failed, running)",
  )
  p.add_argument("workdirs", nargs="+", help="workdirs holding results.json, or sweep roots")
  p.add_argument("--chart", default=None, help="also write a PNG bar chart here")
  p.add_argument(
    "--plots",
    default=None,
    metavar="DIR",
    help="sweep roots: write Optuna's plots (optimization history, intermediate values, "
    "parameter importances) as PNG files into DIR/<root's name>/",
  )
  p.add_argument(
    "--storage",
    default=None,
    help="the sweep's storage URL, where its recorded one hides a password",
  )
  p.add_argument("--metric", default=None, help=flags.METRIC_HELP)
  p.set_defaults(func=run)


def run(args) -> None:
  import os

  from transformer_mt.evaluation import reports, sweep_report

  if args.metric is not None:
    reports.check_metric(args.metric)
  sweeps = [w for w in args.workdirs if reports.is_sweep_dir(w)]
  rows = [w for w in args.workdirs if w not in sweeps]
  for root in sweeps:
    if sweep_report.is_study_root(root):
      print(sweep_report.table(root, args.storage, args.metric) + "\n")
      if args.plots:
        directory = os.path.join(args.plots, os.path.basename(os.path.normpath(root)))
        for path in sweep_report.write_plots(root, directory, args.storage):
          print(f"plot: {path}")
    else:  # a sweep from before Optuna: its trial.json files
      print(reports.ranking_table(root, args.metric or "bleu") + "\n")
  if rows:
    print(reports.report(rows, args.chart))
    if args.chart:
      print(f"chart: {args.chart}")

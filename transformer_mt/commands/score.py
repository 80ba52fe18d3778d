"""`run.py score`: the log-probability of given translations by teacher forcing, as TSV rows
(see transformer_mt/decoding/teacher_forcing.py)."""

from __future__ import annotations

import sys

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "score",
    help="log-probability of given translations (teacher forcing): TSV rows "
    "line_index<TAB>logprob<TAB>tokens<TAB>per_token<TAB>score",
    description="Scores each (source, target) line pair by teacher forcing, as beam search "
    "would have scored that target: logprob = summed log-probability of the target tokens, "
    "tokens = their count (EOS and a forced language tag included; the tag adds 0), "
    "per_token = logprob / tokens, score = logprob / length penalty (the config's alpha and "
    "penalty). An empty source line gives tokens 0 and nan. See "
    "transformer_mt/decoding/teacher_forcing.py.",
    parents=[flags.mesh_flag(), flags.language_flags()],
  )
  flags.model_workdirs_flag(p)
  p.add_argument("--source", required=True, help="source file, one sentence per line")
  p.add_argument("--target", required=True, help="target file, line-aligned with --source")
  p.add_argument("--output", default="-", help="where to write the TSV rows (default: stdout)")
  p.add_argument(
    "--alpha", type=float, default=None, help="length penalty alpha of score (default: config)"
  )
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.data import text_files
  from transformer_mt.decoding import teacher_forcing as scoring

  pairs = text_files.read_parallel(args.source, args.target)  # one error line on a mismatch
  translator = flags.load_from_flags(args)
  scores = scoring.score_lines(translator, [s for s, _ in pairs], [t for _, t in pairs])
  text = scoring.format_scores(scores)
  if args.output == "-":
    sys.stdout.write(text)
  else:
    text_files.write_atomically(args.output, text)

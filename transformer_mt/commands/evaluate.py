"""`run.py evaluate`: translate a test set and report sacreBLEU, paper BLEU, chrF and chrF++,
or, with --hypotheses, score translations made elsewhere."""

from __future__ import annotations

from transformer_mt.commands import flags
from transformer_mt.runtime import errors

# The flags that choose or drive a model: meaningless when --hypotheses gives the translations.
DECODE_FLAGS = ("workdir", "step", "split", "beam", "alpha", "limit", "mesh", "src_lang")


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "evaluate",
    help="translate a test set and report sacreBLEU, paper BLEU, chrF and chrF++ "
    "(or, with --hypotheses, score given translations)",
    parents=[flags.mesh_flag(), flags.language_flags()],
  )
  flags.model_workdirs_flag(p, required=False)
  p.add_argument("--split", default=None, help="the experiment's split to evaluate (default: test)")
  p.add_argument("--source", default=None, help="evaluate on this source file instead of --split")
  p.add_argument("--reference", default=None, help="reference file, line-aligned with --source")
  p.add_argument(
    "--hypotheses",
    default=None,
    help="score these translations (one detokenized line per --reference line) instead of "
    "translating: no --workdir, and --tgt_lang names the target language (e.g. de)",
  )
  p.add_argument("--beam", type=int, default=None, help="beam size (default: the config's)")
  p.add_argument("--alpha", type=float, default=None, help="length penalty alpha (default: config)")
  p.add_argument("--limit", type=int, default=None, help="only the first N sentences")
  p.add_argument(
    "--bleu",
    choices=("sacrebleu", "tokenized"),
    default=None,
    help="'tokenized' scores text that is tokenized already (e.g. Multi30k's lc.norm.tok "
    "files) as it is, with multi-bleu.perl, as published results on such data do (no "
    "--tgt_lang needed); 'sacrebleu' scores detokenized text (default: the experiment's "
    "evaluate.bleu with --workdir, sacrebleu with --hypotheses)",
  )
  p.add_argument(
    "overrides",
    nargs="*",
    metavar="decode.KEY=VALUE",
    help="decoding settings on top of the checkpoint's, e.g. decode.candidate_pool=fairseq "
    "decode.max_len=201 (named in the report's file name)",
  )
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.evaluation import test_set as evaluate

  if args.hypotheses:
    given = [f"--{name}" for name in DECODE_FLAGS if getattr(args, name) is not None]
    given += args.overrides
    if given:
      raise errors.BadValue(
        f"--hypotheses scores the given translations, so {', '.join(given)} (which choose "
        "or run a model) cannot go with it: drop them, or drop --hypotheses to translate."
      )
    if not args.reference:
      raise errors.BadValue(
        "--hypotheses needs --reference, the file to score the translations on."
      )
    report = evaluate.score_translations(
      args.hypotheses, args.reference, args.tgt_lang, args.source, args.bleu or "sacrebleu"
    )
    print(f"{report['split']}: {report['num_sentences']} given translations")
  else:
    if not args.workdir:
      raise errors.BadValue(
        "evaluate needs --workdir (a model to translate with) or --hypotheses (translations "
        "to score)."
      )
    report = evaluate.evaluate(
      args.workdir,
      args.split or "test",
      args.step,
      args.beam,
      args.alpha,
      args.source,
      args.reference,
      args.limit,
      flags.inference_mesh(args),
      args.src_lang,
      args.tgt_lang,
      args.bleu,
      args.overrides,
    )
    print(
      f"{report['split']}: {report['num_sentences']} sentences, step {report['step']}, "
      f"beam {report['beam_size']}, alpha {report['alpha']}, "
      f"{report['sentences_per_second']:.1f} sentences/s"
    )
  sacre = f"  sacreBLEU {report['sacrebleu']:.2f}  ({report['sacrebleu_signature']})"
  tokenized = report["bleu_kind"] == "tokenized"
  label = "tokenized BLEU" if tokenized else "paper-comparable BLEU"
  if not tokenized:  # on tokenized text the published figure leads; sacreBLEU follows it
    print(sacre)
  print(f"  {label} {report['paper_bleu']:.2f}  ({report['paper_bleu_method']})")
  print(f"    multi-bleu.perl: {report['paper_bleu_multi_bleu']}")
  if tokenized:
    print(sacre)
  print(f"  chrF {report['chrf']:.2f}  ({report['chrf_signature']})")
  print(f"  chrF++ {report['chrf_plus_plus']:.2f}  ({report['chrf_plus_plus_signature']})")
  if "report_path" in report:
    print(f"  report: {report['report_path']}")

"""`run.py export`: a workdir's model as a Hugging Face transformers directory (MarianMTModel
and MarianTokenizer, with a model card), or as a CTranslate2 model converted from it."""

from __future__ import annotations

import argparse

FORMATS = ("hf", "ctranslate2")


class _FormatAndOutput(argparse.Action):
  """`--to FORMAT OUT` stored as args.format and args.output, so that commands/paths.py makes
  OUT absolute as it does every --output."""

  def __call__(self, parser, namespace, values, option_string=None):
    namespace.format, namespace.output = values


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "export",
    help="write a trained model as a Hugging Face transformers directory (MarianMTModel, "
    "its tokenizer and a model card) or as a CTranslate2 model",
  )
  p.add_argument("--workdir", required=True, help="workdir (or averaged checkpoint directory)")
  p.add_argument(
    "--to",
    nargs=2,
    required=True,
    metavar=("FORMAT", "OUT"),
    action=_FormatAndOutput,
    help="hf (transformers loads OUT with from_pretrained) or ctranslate2 (converted by "
    "CTranslate2's own converter; needs the ctranslate2 extra), and a new directory OUT",
  )
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  p.add_argument(
    "--quantization",
    default=None,
    help="ctranslate2 only: weight type, e.g. int8 (default: float32)",
  )
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.runtime import errors

  if args.format not in FORMATS:
    raise errors.BadValue(f"--to {args.format}: expected one of {', '.join(FORMATS)}.")
  if args.format == "hf":
    if args.quantization is not None:
      raise errors.BadValue("--quantization applies to --to ctranslate2 only.")
    from transformer_mt.interop import hf_export

    hf_export.export_hf(args.workdir, args.output, args.step)
    print(f"Exported {args.workdir} to {args.output} (transformers: from_pretrained(OUT)).")
  else:
    from transformer_mt.interop import ct2_export

    ct2_export.export_ctranslate2(args.workdir, args.output, args.step, args.quantization)
    print(f"Exported {args.workdir} to {args.output} (ctranslate2.Translator(OUT)).")

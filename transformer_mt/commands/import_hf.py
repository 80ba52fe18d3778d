"""`run.py import`: a Hugging Face checkpoint (Marian, mBART, NLLB) and its tokenizer, converted
into a workdir that translate and evaluate use.

Named import_hf because `import` is a keyword.
"""

from __future__ import annotations

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "import",
    help="convert a Hugging Face checkpoint (Marian, mBART, NLLB) and its tokenizer into a "
    "workdir that translate and evaluate use",
    parents=[flags.language_flags()],
  )
  p.add_argument(
    "--from",
    dest="from_",
    required=True,
    metavar="hf:DIR_OR_NAME",
    help="hf: then a save_pretrained directory, or a hub name (downloaded; needs the internet)",
  )
  p.add_argument("--workdir", required=True, help="a new workdir (or one without checkpoints)")
  p.add_argument(
    "overrides",
    nargs="*",
    metavar="key=value",
    help="decode.* and data.* settings saved with it, e.g. decode.beam_size=4",
  )
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.interop import hf_import

  step_dir = hf_import.import_pretrained(
    args.from_,
    args.workdir,
    args.overrides,
    source_lang=args.src_lang,
    target_lang=args.tgt_lang,
  )
  print(f"Imported {args.from_} into {step_dir} (use --workdir {args.workdir} to translate).")

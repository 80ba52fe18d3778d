"""`run.py attention`: a PNG heatmap of the cross-attention of one translated sentence."""

from __future__ import annotations

from transformer_mt.commands import flags


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
    "attention",
    help="PNG heatmap of cross-attention for one sentence",
    parents=[flags.mesh_flag()],
  )
  p.add_argument("--workdir", required=True)
  p.add_argument("--src", required=True, help="the source sentence")
  p.add_argument("--output", default="attention.png", help="PNG path (default: attention.png)")
  p.add_argument("--layer", default=None, help="decoder layer index, or 'mean' (default: last)")
  p.add_argument("--head", type=int, default=None, help="head index (default: mean over heads)")
  p.add_argument("--step", type=int, default=None)
  p.set_defaults(func=run)


def run(args) -> None:
  from transformer_mt.decoding import loading
  from transformer_mt.evaluation import plots

  translator = loading.load_translator(
    args.workdir, args.step, flags.inference_mesh(args), beam_size=1
  )
  layer = args.layer if args.layer in (None, "mean") else int(args.layer)
  translation = plots.attention_heatmap(
    translator, args.src, args.output, layer=layer, head=args.head
  )
  print(f"{translation}\nwrote {args.output}")

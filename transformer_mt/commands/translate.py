"""`run.py translate`: its flags, their checks, and what it writes.

Three outputs from one command: one translation per input line (beam search or greedy),
`--nbest K` TSV rows (format_nbest), or `--sample` draws (sampling.samples_tsv).
Flag combinations are checked before the checkpoint is read, so a bad one costs nothing.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from transformer_mt.commands import flags
from transformer_mt.runtime import errors

if TYPE_CHECKING:
  from transformer_mt.decoding.translator import Hypothesis


def add_parser(subparsers) -> None:
  """The `translate` subcommand; --workdir (repeatable: an ensemble) and --step as on evaluate
  and score."""
  p = subparsers.add_parser(
    "translate",
    help="translate lines with a trained checkpoint",
    parents=[flags.mesh_flag(), flags.language_flags()],
  )
  flags.model_workdirs_flag(p)
  p.add_argument("--input", default="-", help="file to translate (default: stdin)")
  p.add_argument("--output", default="-", help="where to write translations (default: stdout)")
  p.add_argument(
    "--beam", type=int, default=None, help="beam size (default: the config's; 1 = greedy)"
  )
  p.add_argument("--alpha", type=float, default=None, help="length penalty alpha (default: config)")
  p.add_argument(
    "--nbest",
    type=int,
    default=None,
    metavar="K",
    help="write the K best beam-search hypotheses of every line as TSV rows "
    "line_index<TAB>rank<TAB>score<TAB>logprob<TAB>text (line_index from 0, rank 0 best; "
    "score: the search's length-normalised score, logprob: the summed log-probability), "
    "exactly K rows per input line (an empty line: the empty hypothesis with score 0, then "
    "empty slots with -inf); needs K <= --beam (default beam: the config's, raised to K)",
  )
  group = p.add_argument_group(
    "sampling (back-translation)",
    "temperature, then top-k, then top-p, as transformers' generate(do_sample=True); the same "
    "seed gives the same samples on any number of devices and with any batch size",
  )
  group.add_argument(
    "--sample", action="store_true", help="draw each token from the model instead of a beam"
  )
  group.add_argument(
    "--num_samples",
    type=int,
    default=None,
    metavar="N",
    help="samples per input line (default 1: one line each, as without --sample); N > 1 "
    "writes N lines per input line as TSV: line_index<TAB>sample<TAB>text, both from 0, in "
    "input order, empty input lines included (empty text); tabs and line breaks in a text "
    "become spaces",
  )
  group.add_argument(
    "--temperature",
    type=float,
    default=None,
    metavar="T",
    help="divides the logits (default 1: unchanged)",
  )
  group.add_argument(
    "--top_k",
    type=int,
    default=None,
    metavar="K",
    help="keep the K most probable tokens (default 0: all)",
  )
  group.add_argument(
    "--top_p",
    type=float,
    default=None,
    metavar="P",
    help="keep the most probable tokens until their probability reaches P (default 1: all)",
  )
  group.add_argument(
    "--seed",
    type=int,
    default=None,
    metavar="S",
    help="random seed, 0 to 2**32-1 (default 0); a line's samples depend only on the seed, "
    "its line index and the sample index",
  )
  p.add_argument(
    "overrides",
    nargs="*",
    metavar="decode.KEY=VALUE",
    help="decoding settings on top of the checkpoint's, as on evaluate, e.g. "
    "decode.candidate_pool=fairseq (CTranslate2's stopping rule) decode.max_len=201; "
    "--beam and --alpha win over decode.beam_size and decode.alpha",
  )
  p.set_defaults(func=run)


def run(args) -> None:
  """`run.py translate`: translations, an n-best list or samples of the input lines."""
  nbest = getattr(args, "nbest", None)
  if nbest is not None:
    check_nbest(nbest, args.beam)
    if args.sample:
      raise errors.BadValue("--nbest with --sample: n-best lists come from beam search; use one.")
  check_overrides(args.overrides)
  options = sampling_options(args)
  translator = flags.load_from_flags(args, beam_size=args.beam, decode_overrides=args.overrides)
  if nbest is not None and args.beam is None:  # the config's beam, widened to hold K
    translator.beam_size = max(translator.beam_size, nbest)
  if args.input == "-":
    lines = read_lines(sys.stdin.buffer)
  else:
    if not os.path.exists(args.input):
      raise errors.MissingFile(f"Input file {args.input} does not exist.")
    with open(args.input, "rb") as f:
      lines = read_lines(f)
  if nbest is not None:
    text = format_nbest(translator.nbest(lines, nbest, progress=args.input != "-"))
  else:
    text = translations_text(translator, lines, options, progress=args.input != "-")
  if args.output == "-":
    sys.stdout.write(text)
  else:
    from transformer_mt.data.text_files import write_atomically

    write_atomically(args.output, text)


def check_nbest(nbest: int, beam: int | None) -> None:
  """--nbest K needs K >= 1 and, with an explicit --beam, K <= beam."""
  if nbest < 1:
    raise errors.BadValue(f"--nbest {nbest}: must be at least 1.")
  if beam is not None and nbest > beam:
    raise errors.BadValue(
      f"--nbest {nbest} is larger than --beam {beam}: beam search keeps only {beam} "
      f"hypotheses; pass --beam {nbest} or more (or leave --beam out)."
    )


def check_overrides(overrides: Sequence[str]) -> None:
  """translate's arguments are decode.KEY=VALUE settings; a bare word is most likely a file
  meant for --input (which `load_translator` would report as a setting it refuses). The form
  of a decode setting (decode.KEY without =VALUE, say) is `registry.apply_overrides`'s check."""
  for override in overrides:
    if "=" not in override and not override.startswith("decode."):
      raise errors.BadValue(
        f"{override!r} is not a decode.KEY=VALUE setting: translate reads the lines to "
        f"translate from --input FILE (default: stdin), e.g. --input {override}."
      )


SAMPLING_FLAGS = ("num_samples", "temperature", "top_k", "top_p", "seed")


def sampling_options(args):
  """(settings, num_samples, seed) of `translate --sample`, or None without --sample; checked
  before the checkpoint is read, so a bad value costs nothing."""
  from transformer_mt.decoding import sampling

  if not args.sample:
    given = [f"--{name}" for name in SAMPLING_FLAGS if getattr(args, name) is not None]
    if given:
      raise errors.BadValue(
        f"{', '.join(given)} only apply to sampling: add --sample, or drop them."
      )
    return None
  if args.beam not in (None, 1):
    raise errors.BadValue(
      f"--beam {args.beam} with --sample: sampling draws one token at a time; drop --beam."
    )
  settings = sampling.SamplingSettings(
    temperature=1.0 if args.temperature is None else args.temperature,
    top_k=args.top_k or 0,
    top_p=1.0 if args.top_p is None else args.top_p,
  ).check()
  num_samples = 1 if args.num_samples is None else args.num_samples
  if num_samples < 1:
    raise errors.BadValue(f"--num_samples {num_samples}: must be at least 1.")
  return settings, num_samples, sampling.check_seed(args.seed or 0)


def translations_text(translator, lines: list[str], options, progress: bool) -> str:
  """What `translate` writes: one translation per line, or with --sample N samples per line
  (one line each for N = 1, else `sampling.samples_tsv`'s line_index<TAB>sample<TAB>text)."""
  from transformer_mt.decoding import sampling

  if options is None:
    return "".join(line + "\n" for line in translator.translate(lines, progress=progress))
  settings, num_samples, seed = options
  samples = translator.sample(lines, num_samples, settings, seed, progress=progress)
  if num_samples == 1:
    return "".join(texts[0] + "\n" for texts in samples)
  return sampling.samples_tsv(samples)


def read_lines(stream: Iterable[bytes | str]) -> list[str]:
  """Lines without their newline; undecodable bytes become U+FFFD (with a warning)."""
  lines = []
  for number, line in enumerate(stream, start=1):
    if isinstance(line, bytes):
      text = line.decode("utf-8", errors="replace")
      if "\ufffd" in text and b"\xef\xbf\xbd" not in line:
        logging.warning("Line %d is not valid UTF-8; undecodable bytes were replaced.", number)
      line = text
    lines.append(line.rstrip("\r\n"))
  return lines


def format_nbest(nbest: Sequence[Sequence[Hypothesis]]) -> str:
  """TSV rows `line_index<TAB>rank<TAB>score<TAB>logprob<TAB>text`, one per hypothesis, in
  input order. Scores have 6 decimals (-inf for an empty slot); tabs and
  newlines inside a text (which no detokenizer should produce) become spaces."""
  rows = []
  for index, hypotheses in enumerate(nbest):
    for rank, h in enumerate(hypotheses):
      text = h.text.replace("\t", " ").replace("\n", " ").replace("\r", " ")
      rows.append(f"{index}\t{rank}\t{h.score:.6f}\t{h.logprob:.6f}\t{text}\n")
  return "".join(rows)

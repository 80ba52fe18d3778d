"""Lines of text in, the same number of translated lines out.

Sentences are sorted by length and decoded in fixed-size batches padded to a few
length buckets (so the decoder compiles a handful of times, not once per batch: every
program of a call compiles ahead, together, runtime/ahead_of_time.py), then put back in
input order. An empty line gives an empty line; an overlong line
is truncated with a warning, never dropped.

`Translator.nbest` returns the K best hypotheses of the beam search per line (`run.py
translate --nbest K`), each with the beam search's own length-normalised score and its summed
log-probability; `run.py translate --nbest` writes them as TSV rows

    line_index<TAB>rank<TAB>score<TAB>logprob<TAB>text

with exactly K rows per input line, in input order (line_index 0-based, rank 0 = best). An
empty input line gets K rows too: rank 0 is the empty hypothesis (score 0, logprob 0, as
beam search scores it) and the other ranks are empty slots. An empty slot (fewer than K
hypotheses finished) has score and logprob -inf and empty text. Two ranks may show the same
text (different token sequences can detokenize alike).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from transformer_mt.data.input_pipeline import bucket_length, evaluation_bucket
from transformer_mt.data.tokenizer import AnyTokenizer
from transformer_mt.decoding import beam_decode, beam_rows, beam_search, sampling
from transformer_mt.decoding import incremental as decode
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors, sharding
from transformer_mt.runtime.ahead_of_time import Programs

# A shrinking batch stops before a stage of fewer sentences: each stage is one more compiled
# copy of the decoder step (the batch of 64 on one device compiled 64, 16, 4 and 1), and the
# last few searching sentences of a batch cost little in any case.
SMALLEST_SHRUNK_BATCH = 8


class Hypothesis(NamedTuple):
  """One entry of an n-best list."""

  text: str
  # The beam search's length-normalised score: logprob / lp(len) (beam_search.penalty).
  score: float
  # Summed log-probability of the hypothesis' tokens (a forced first token adds 0).
  logprob: float


@dataclasses.dataclass
class Translator:
  """Holds trained parameters and the tokenizer; `translate` is the whole job."""

  params: Any
  model_config: TransformerConfig
  tokenizer: AnyTokenizer
  mesh: Mesh
  batch_size: int = 64
  # Longest source accepted (tokens, EOS included); longer lines are truncated.
  max_source_len: int = 1024
  # Target tokens generated at most: source length + `extra_len` (the paper's +50),
  # capped at `max_target_len`.
  extra_len: int = 50
  max_target_len: int = 256
  # 1 = greedy; the paper decodes with beam 4 and length penalty alpha 0.6.
  beam_size: int = 1
  alpha: float = 0.6
  # The first target token, forced (mBART-50 and NLLB: the target language code), or None.
  forced_first_id: int | None = None
  # How beam search scores and keeps hypotheses (beam_search's module docstring): "gnmt" /
  # "beam" for our models; "power" / "hf" reproduce transformers' generate for imports.
  length_penalty: str = "gnmt"
  candidate_pool: str = "beam"
  # How beam search reorders the KV cache ("chunked", "gather", "ancestry", or "auto": by the
  # mesh's platform and the batch) and every how many steps it checks whether to stop;
  # neither changes a translation (beam_search's module docstring, "Cache reordering": the
  # "ancestry" scores may differ from the others' in the last float32 bits).
  cache_reorder: str = "auto"
  stop_check_every: int = 1
  # Beam search goes on in a quarter of the batch each time at most a quarter of its sentences
  # still search, down to the mesh's device count (beam_search's module docstring, "Shrinking
  # batch"); the same translations, one more compiled copy of the decoder step per size.
  shrink_batch: bool = True
  # An ensemble (several workdirs, `load_translator`): the members' configs, with `params`
  # the tuple of their parameter trees; `model_config` is then the first member's, whose
  # ids (PAD, EOS, decoder start) and tokenizer every member shares. None: one model.
  members: tuple[TransformerConfig, ...] | None = None
  # Decode programs compiled ahead (`list_programs`): a decode waits for its program there
  # instead of compiling it again. None: each program compiles at its first call.
  ahead: Programs | None = None

  def __post_init__(self):
    # Learned position tables end at max_len: no source token and no generated token may sit
    # at a position past it (longer lines are truncated, with a warning; see encode_sources).
    limit = self.position_limit
    if limit is not None:
      self.max_source_len = min(self.max_source_len, limit)
      self.max_target_len = min(self.max_target_len, limit)

  @property
  def position_limit(self) -> int | None:
    """Positions the models can address (the smallest learned table), None if unbounded."""
    learned = [c.max_len for c in self.configs if c.position_encoding == "learned"]
    return min(learned) if learned else None

  @property
  def decoder_config(self) -> decode.ModelConfig:
    """The static config of the jitted decoders: the model's, or the ensemble's tuple."""
    return self.members or self.model_config

  @property
  def configs(self) -> tuple[TransformerConfig, ...]:
    """Every member's config (one for a single model)."""
    return self.members or (self.model_config,)

  def translate(self, lines: Sequence[str], progress: bool = False) -> list[str]:
    """Each line's translation, in order ("" for an empty line); `progress`: a tqdm bar.

    The decoder programs of all batches compile together, ahead, in threads (in `ahead`, or
    in programs of this call's own), while the first batches decode."""
    if self.ahead is None:
      with Programs() as programs:
        return dataclasses.replace(self, ahead=programs).translate(lines, progress)
    outputs = [""] * len(lines)
    batches = self.source_batches(lines)
    shapes = self.program_shapes(batches)
    self._add_programs(shapes, self.beam_size > 1)
    for batch, shape in _progress(zip(batches, shapes), progress, len(batches), "translate"):
      for (index, _), ids in zip(batch, self._decode_batch([ids for _, ids in batch], shape)):
        outputs[index] = self.tokenizer.decode(ids)
    return outputs

  def sample(
    self,
    lines: Sequence[str],
    num_samples: int = 1,
    settings: sampling.SamplingSettings | None = None,
    seed: int = 0,
    progress: bool = False,
  ) -> list[list[str]]:
    """`num_samples` sampled translations of each line (decoding/sampling.py): a list per
    line, of "" for an empty line. The same seed gives the same samples whatever the batch size
    or the mesh: a row's draws depend on (seed, line index, sample index). `settings` default:
    temperature 1, no top-k, no top-p (the model's own distribution).

    Raises:
      ValueError: num_samples < 1, or a bad setting or seed (one line naming the flag).
    """
    if num_samples < 1:
      raise errors.BadValue(f"--num_samples {num_samples}: must be at least 1.")
    settings = (settings or sampling.SamplingSettings()).check()
    seed = sampling.check_seed(seed)
    outputs = [[""] * num_samples for _ in lines]
    # The samples of a line are rows of their own, next to each other in the length order.
    rows = [
      ((index, number), ids)
      for index, ids in enumerate(self.encode_sources(lines))
      if ids is not None
      for number in range(num_samples)
    ]
    batches = self._batches(rows)
    for batch in _progress(batches, progress, len(batches), "sample"):
      decoded = self._sample_batch(
        [ids for _, ids in batch], [key for key, _ in batch], settings, seed
      )
      for ((index, number), _), ids in zip(batch, decoded):
        outputs[index][number] = self.tokenizer.decode(ids)
    return outputs

  def source_batches(self, lines: Sequence[str]) -> list[list[tuple[int, list[int]]]]:
    """The non-empty lines as (index, source ids) in batches of `batch_size`, sorted by length
    so each batch pads little; an overlong line is truncated with a warning."""
    todo = [(i, ids) for i, ids in enumerate(self.encode_sources(lines)) if ids is not None]
    return self._batches(todo)

  def _batches(self, todo: list) -> list[list]:
    """(key, source ids) items sorted by source length (so each batch pads little), in
    batches of `batch_size`."""
    todo = sorted(todo, key=lambda item: len(item[1]))
    return [todo[i : i + self.batch_size] for i in range(0, len(todo), self.batch_size)]

  def program_shapes(self, batches: list[list[tuple[Any, list[int]]]]) -> list[tuple[int, int]]:
    """Each batch's decoder program, (src_len, max_len): its own `padded_shape`, except that
    batches with the same max_len (capped by max_target_len) share the program of the
    longest source among them. Only the encoder's padding grows there, and one program fewer
    compiles (seconds each on a CPU, more on a GPU)."""
    shapes = [self.padded_shape([ids for _, ids in batch]) for batch in batches]
    longest: dict[int, int] = {}
    for src_len, max_len in shapes:
      longest[max_len] = max(longest.get(max_len, 0), src_len)
    return [(longest[max_len], max_len) for _, max_len in shapes]

  def encode_sources(self, lines: Sequence[str]) -> list[list[int] | None]:
    """Source ids of every line (None for an empty one); an overlong line is truncated to
    `max_source_len` tokens, EOS kept, with a warning."""
    encoded = self.tokenizer.encode([line.strip() for line in lines])
    sources = []
    for index, (line, ids) in enumerate(zip(lines, encoded)):
      if line.strip() and len(ids) > self.max_source_len:
        logging.warning(
          "Line %d has %d tokens; using only its first %d.",
          index + 1,
          len(ids),
          self.max_source_len,
        )
        ids = ids[: self.max_source_len - 1] + [self.model_config.eos_id]
      sources.append(list(ids) if line.strip() else None)
    return sources

  def nbest(self, lines: Sequence[str], k: int, progress: bool = False) -> list[list[Hypothesis]]:
    """The `k` best beam-search hypotheses of every line, best first (module docstring).

    Always decodes with beam search (beam 1 included, which equals greedy), so every
    hypothesis has the search's own score.

    Raises:
      ValueError: k < 1 or k > beam_size.
    """
    if not 1 <= k <= self.beam_size:
      raise errors.BadValue(
        f"--nbest {k}: must be between 1 and the beam size ({self.beam_size}); pass "
        f"--beam {max(k, 1)} or more, or a smaller --nbest."
      )
    if self.ahead is None:  # as in `translate`
      with Programs() as programs:
        return dataclasses.replace(self, ahead=programs).nbest(lines, k, progress)
    empty_slot = Hypothesis("", float("-inf"), float("-inf"))
    # An empty line: beam search's empty hypothesis (score 0) then empty slots.
    outputs = [[Hypothesis("", 0.0, 0.0)] + [empty_slot] * (k - 1) for _ in lines]
    batches = self.source_batches(lines)
    shapes = self.program_shapes(batches)
    self._add_programs(shapes, beam=True)
    for batch, shape in _progress(zip(batches, shapes), progress, len(batches), "n-best"):
      result = self._search_batch([ids for _, ids in batch], shape)
      for row, (index, _) in enumerate(batch):
        outputs[index] = [
          Hypothesis(self.tokenizer.decode(ids), float(score), float(logprob))
          if np.isfinite(score)
          else empty_slot
          for ids, score, logprob in zip(
            result.all_sequences[row, :k], result.all_scores[row, :k], result.all_log_probs[row, :k]
          )
        ]
    return outputs

  def _search_batch(
    self, sources: list[list[int]], shape: tuple[int, int] | None = None
  ) -> beam_search.BeamSearchOutput:
    """Beam search over `sources`: every hypothesis and its scores, on the host, one row per
    source (the padding rows dropped)."""
    output = self._run_decoder(*self.padded_batch(sources, shape), beam=True)
    return jax.tree.map(lambda x: sharding.to_host(x)[: len(sources)] if x.ndim else x, output)

  def list_programs(self, lines: Sequence[str], programs: Programs) -> None:
    """Adds to `programs` the decode programs `translate(lines)` (and `nbest`) will run: one
    per padded batch shape. `params` may be abstract (sharded ShapeDtypeStructs of the
    parameters the decode will get)."""
    self._add_programs(
      self.program_shapes(self.source_batches(lines)), self.beam_size > 1, programs
    )

  def _add_programs(
    self, shapes: list[tuple[int, int]], beam: bool, programs: Programs | None = None
  ) -> None:
    """Adds the decoder programs of `shapes` ((src_len, max_len) each) to `programs` (default:
    `ahead`) and starts their compilation."""
    programs = programs or self.ahead
    rows = bucket_length(self.batch_size, self.mesh.devices.size)
    for shape in sorted(set(shapes)):
      inputs = jax.ShapeDtypeStruct((rows, shape[0]), np.int32, sharding=self._row_sharding(2))
      max_lengths = jax.ShapeDtypeStruct((rows,), np.int32, sharding=self._row_sharding(1))
      name, fn, args, kwargs = self._decoder(inputs, max_lengths, shape[1], beam)

      def lower(fn=fn, args=args, kwargs=kwargs):
        with jax.set_mesh(self.mesh):
          return fn.lower(*args, **kwargs)

      programs.add(name, lower)
    programs.start()

  def _row_sharding(self, ndim: int):
    return sharding.batch_sharding(self.mesh, ndim, 0)

  def _sample_batch(
    self,
    sources: list[list[int]],
    keys: list[tuple[int, int]],
    settings: sampling.SamplingSettings,
    seed: int,
  ) -> list[np.ndarray]:
    """One sample per source; keys[i] = (line index, sample index) of sources[i]."""
    inputs, max_lengths, max_len = self.padded_batch(sources)
    line_ids = np.zeros(len(inputs), np.int32)  # padding rows: any key, they emit nothing
    sample_ids = np.zeros(len(inputs), np.int32)
    line_ids[: len(keys)], sample_ids[: len(keys)] = np.array(keys, np.int32).T
    with jax.set_mesh(self.mesh):
      rows = sharding.global_batch_from_host((inputs, max_lengths, line_ids, sample_ids), self.mesh)
      outputs = sampling.sample_decode(
        self.params,
        rows[0],
        np.uint32(seed),
        rows[2],
        rows[3],
        self.decoder_config,
        max_len,
        settings,
        max_lengths=rows[1],
        forced_first_id=self.forced_first_id,
      )
    return list(sharding.to_host(outputs)[: len(sources)])

  def padded_shape(self, sources: list[list[int]]) -> tuple[int, int]:
    """(src_len, max_len) of the decoder program for these sources: the source length padded
    to its bucket (input_pipeline.evaluation_bucket), so a few programs cover every batch, and
    the longest target it may generate."""
    src_len = evaluation_bucket(max(len(s) for s in sources))
    if self.position_limit is not None:  # the bucket's padding stays inside the table too
      src_len = max(min(src_len, self.position_limit), max(len(s) for s in sources))
    return src_len, min(self.max_target_len, src_len + self.extra_len)

  def padded_batch(
    self, sources: list[list[int]], shape: tuple[int, int] | None = None
  ) -> tuple[np.ndarray, np.ndarray, int]:
    """(inputs int32 [rows, src_len], max_lengths int32 [rows], max_len) for the decoder.

    Rows are padded to a fixed count (a multiple of the device count) with empty rows and
    the source length to a bucket, so a few shapes cover every batch; `shape`: the program's
    (src_len, max_len) (`program_shapes`), default the batch's own `padded_shape`.
    """
    src_len, max_len = shape or self.padded_shape(sources)
    rows = bucket_length(self.batch_size, self.mesh.devices.size)
    pad_id = self.model_config.pad_id
    inputs = np.full((rows, src_len), pad_id, np.int32)
    for row, ids in enumerate(sources):
      inputs[row, : len(ids)] = ids
    # Each sentence may grow to its own source length + extra_len (the paper's +50).
    max_lengths = np.minimum((inputs != pad_id).sum(axis=1) + self.extra_len, max_len)
    return inputs, max_lengths.astype(np.int32), max_len

  def _decoder(self, inputs, max_lengths, max_len: int, beam: bool):
    """(program name, jitted decoder, args, kwargs) of one padded batch: beam search with this
    translator's settings (`beam`), else greedy decoding. `inputs` [rows, src_len] and
    `max_lengths` [rows] are global arrays or their ShapeDtypeStructs (`list_programs`)."""
    rows, src_len = inputs.shape
    if not beam:
      name = f"greedy_decode[{rows}x{src_len}, max_len {max_len}]"
      kwargs = dict(forced_first_id=self.forced_first_id, max_lengths=max_lengths)
      return name, decode.greedy_decode, (self.params, inputs, self.decoder_config, max_len), kwargs
    name = f"beam_decode[{rows}x{src_len}, max_len {max_len}]"
    args = (
      self.params,
      inputs,
      self.decoder_config,
      self.beam_size,
      max_len,
      self.alpha,
      max_lengths,
    )
    return name, beam_decode.beam_decode, args, self.beam_decode_options(rows)

  def beam_decode_options(self, rows: int) -> dict:
    """beam_decode's keyword arguments for a batch of `rows` sentences under this translator's
    settings ("auto" resolved for its mesh): what users run, and what
    benchmarks/accelerator.py's decode section times."""
    return dict(
      forced_first_id=self.forced_first_id,
      length_penalty=self.length_penalty,
      candidate_pool=self.candidate_pool,
      cache_reorder=beam_rows.resolve_cache_reorder(
        self.cache_reorder, self.mesh.devices.flat[0].platform, rows
      ),
      stop_check_every=self.stop_check_every,
      shrink_batch=self.shrink_batch,
      # Every batch size a multiple of the devices: each still splits evenly over them.
      min_batch=self.mesh.devices.size,
      smallest_batch=SMALLEST_SHRUNK_BATCH,
    )

  def _run_decoder(self, inputs: np.ndarray, max_lengths: np.ndarray, max_len: int, beam: bool):
    """The decoder's output for one padded batch (`padded_batch`), after waiting for its
    program when it is being compiled ahead."""
    with jax.set_mesh(self.mesh):
      # Every process decodes the same sentences, each device its slice of the rows.
      inputs, max_lengths = sharding.global_batch_from_host((inputs, max_lengths), self.mesh)
      name, fn, args, kwargs = self._decoder(inputs, max_lengths, max_len, beam)
      if self.ahead is not None:
        self.ahead.wait(name)
      return fn(*args, **kwargs)

  def _decode_batch(
    self, sources: list[list[int]], shape: tuple[int, int] | None = None
  ) -> list[np.ndarray]:
    beam = self.beam_size > 1
    outputs = self._run_decoder(*self.padded_batch(sources, shape), beam=beam)
    if beam:
      outputs = outputs.sequences
    return list(sharding.to_host(outputs)[: len(sources)])


def _progress(items: Iterable, progress: bool, total: int, desc: str) -> Iterable:
  """`items`, under a tqdm bar of `total` batches when `progress`."""
  if not progress:
    return items
  from tqdm import tqdm

  return tqdm(items, total=total, desc=desc, unit="batch")

"""The generated corpus of benchmarks/corpus_scale.py: N line-aligned EN-DE pairs of news-like
lengths, written fast enough for WMT sizes (4.5M pairs in about half a minute).

Words are sampled from the running text of the EN-DE news files in ../shared/data (a fixed
pseudo-word list when that folder is missing), so word frequencies are Zipf-like as in news;
source lengths are log-normal with a long tail and each target length is the source's times a
noisy DE/EN word ratio. Vectorised NumPy: word ids -> one byte gather per chunk.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE_LANG, TARGET_LANG = "en", "de"
DEFAULT_DATA_ROOT = ROOT.parent / "shared" / "data"
MAX_WORDS = 150


@dataclasses.dataclass(frozen=True)
class WordPool:
  """Words to sample: each word's UTF-8 bytes followed by one space, back to back in `buffer`
  (at `offsets`, `sizes` bytes each), and `stream`, word ids in running-text order: a uniform
  index into it draws words with their text frequency."""

  buffer: np.ndarray  # uint8 [total bytes]
  offsets: np.ndarray  # int64 [words]
  sizes: np.ndarray  # int64 [words], including the space
  stream: np.ndarray  # int32 [running words]


def pool_from_tokens(tokens: list[str]) -> WordPool:
  index: dict[str, int] = {}
  stream = np.fromiter((index.setdefault(t, len(index)) for t in tokens), np.int32, len(tokens))
  encoded = [word.encode("utf-8") + b" " for word in index]
  sizes = np.fromiter((len(e) for e in encoded), np.int64, len(encoded))
  offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
  return WordPool(np.frombuffer(b"".join(encoded), np.uint8), offsets, sizes, stream)


def fallback_tokens(seed: int, count: int = 300_000) -> list[str]:
  """Pseudo-words of 1-4 syllables with Zipf frequencies, for a machine without the news files."""
  rng = np.random.default_rng(seed)
  syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
  words = sorted(
    {"".join(rng.choice(syllables, size=rng.integers(1, 5))) for _ in range(20_000)}, key=len
  )
  ranks = np.minimum(rng.zipf(1.2, size=count), len(words)) - 1
  return [words[r] for r in ranks]


def word_pool(lang: str, data_root: pathlib.Path, seed: int) -> WordPool:
  """The running text of data_root/news/en-de/*.LANG (the WMT news sets), or pseudo-words."""
  folder = data_root / "news" / f"{SOURCE_LANG}-{TARGET_LANG}"
  paths = tuple(sorted(glob.glob(str(folder / f"*.{lang}"))))
  pool = paths and _news_pool(paths)
  return pool or pool_from_tokens(fallback_tokens(seed + len(lang)))


@functools.lru_cache(maxsize=4)
def _news_pool(paths: tuple[str, ...]) -> WordPool | None:
  """The pool of these files' running text (None if they hold no words), built once per
  process (~0.25 s a language): a process that generates several corpora reads them once. Its
  arrays are read-only, since every corpus shares them."""
  tokens = []
  for path in paths:
    tokens += pathlib.Path(path).read_text(encoding="utf-8").split()
  if not tokens:
    return None
  pool = pool_from_tokens(tokens)
  for array in (pool.offsets, pool.sizes, pool.stream):
    array.flags.writeable = False
  return pool


def sentence_lengths(
  rng: np.random.Generator, count: int, mean_words: float, ratio: float
) -> tuple[np.ndarray, np.ndarray]:
  """(source, target) words per pair, int64 [count] each, in 1..MAX_WORDS: log-normal source
  lengths of mean `mean_words` (sigma 0.55: a long tail, p99 ~ 3x the mean) and targets of
  `ratio` x the source length with 15% log-normal noise."""
  sigma = 0.55
  source = rng.lognormal(np.log(mean_words) - sigma**2 / 2, sigma, count)
  target = source * ratio * rng.lognormal(-(0.15**2) / 2, 0.15, count)
  clip = lambda x: np.clip(np.rint(x), 1, MAX_WORDS).astype(np.int64)  # noqa: E731
  return clip(source), clip(target)


def heaps_law(pool: WordPool) -> tuple[float, float]:
  """(K, beta) of types = K x tokens^beta fitted on the pool's running text (log-log, types
  counted at 1%, 3%, 10%, 30% and all of it): how fast real text meets new words."""
  counts = []
  for fraction in (0.01, 0.03, 0.1, 0.3, 1.0):
    n = max(1, int(len(pool.stream) * fraction))
    counts.append((n, len(np.unique(pool.stream[:n]))))
  beta, log_k = np.polyfit(*np.log(np.array(counts, np.float64)).T, 1)
  return float(np.exp(log_k)), float(beta)


def novel_rate(pool: WordPool, tokens: int) -> float:
  """The fraction of words to make new compounds so that `tokens` words of generated text hold
  about as many types as Heaps' law fitted on the pool predicts (the pool alone caps them at
  its own types: 75k English words against ~3M extrapolated for 112M tokens)."""
  k, beta = heaps_law(pool)
  missing = k * tokens**beta - len(pool.sizes)
  return float(np.clip(missing / tokens, 0.0, 0.5))


def render(
  pool: WordPool, lengths: np.ndarray, rng: np.random.Generator, novel: float = 0.0
) -> bytes:
  """Sentences of `lengths` words drawn from `pool`, one per line, as UTF-8 bytes. A fraction
  `novel` of the words are compounds of two pool words written together ("Bundestag"-like:
  nearly all of them types met once, as the long tail of real text is)."""
  total = int(lengths.sum())
  ids = pool.stream[rng.integers(0, len(pool.stream), size=total)]
  glued = rng.random(total) < novel if novel else np.zeros(total, bool)
  # Pieces: each word is one pool word, a compound two (the first without its space).
  first = np.arange(total) + np.concatenate([[0], np.cumsum(glued)[:-1]])  # [words]
  pieces = np.empty(total + int(glued.sum()), np.int64)
  pieces[first] = ids
  pieces[first[glued] + 1] = pool.stream[rng.integers(0, len(pool.stream), size=glued.sum())]
  sizes = pool.sizes[pieces]
  sizes[first[glued]] -= 1
  starts = pool.offsets[pieces]
  ends = np.cumsum(sizes)  # [pieces] end of each piece in the output
  gather = np.arange(ends[-1]) + np.repeat(starts - (ends - sizes), sizes)
  out = pool.buffer[gather]
  last_piece = first + glued  # [words]
  out[ends[last_piece[np.cumsum(lengths) - 1]] - 1] = ord("\n")  # each sentence's last space
  return out.tobytes()


def generate_corpus(
  prefix: str | os.PathLike,
  pairs: int,
  seed: int = 0,
  mean_words: float = 25.0,
  data_root: pathlib.Path = DEFAULT_DATA_ROOT,
  chunk: int = 50_000,
  heaps_types: bool = False,
) -> dict:
  """Writes `pairs` line-aligned generated pairs to PREFIX.en / PREFIX.de; returns
  {"pairs", "bytes", "source_words", "target_words", "novel_rate_en", "novel_rate_de"}. With
  `heaps_types`, a share of the words are new compounds (`render`), at the rate per language
  that gives the corpus the types Heaps' law predicts for its size (`novel_rate`); without,
  its types are the pool's (what a tokenizer's merges see is then far too little at WMT
  size)."""
  source_pool = word_pool(SOURCE_LANG, data_root, seed)
  target_pool = word_pool(TARGET_LANG, data_root, seed)
  ratio = len(target_pool.stream) / len(source_pool.stream)
  rng = np.random.default_rng(seed)
  words = pairs * mean_words
  rates = {
    SOURCE_LANG: novel_rate(source_pool, int(words)) if heaps_types else 0.0,
    TARGET_LANG: novel_rate(target_pool, int(words * ratio)) if heaps_types else 0.0,
  }
  stats = {"pairs": pairs, "bytes": 0, "source_words": 0, "target_words": 0}
  stats.update({f"novel_rate_{lang}": round(rate, 5) for lang, rate in rates.items()})
  with (
    open(f"{prefix}.{SOURCE_LANG}", "wb") as source_file,
    open(f"{prefix}.{TARGET_LANG}", "wb") as target_file,
  ):
    for first in range(0, pairs, chunk):
      source_lengths, target_lengths = sentence_lengths(
        rng, min(chunk, pairs - first), mean_words, ratio
      )
      for file, pool, lengths, key, rate in (
        (source_file, source_pool, source_lengths, "source_words", rates[SOURCE_LANG]),
        (target_file, target_pool, target_lengths, "target_words", rates[TARGET_LANG]),
      ):
        text = render(pool, lengths, rng, rate)
        file.write(text)
        stats["bytes"] += len(text)
        stats[key] += int(lengths.sum())
  return stats

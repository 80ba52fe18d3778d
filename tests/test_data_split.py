"""Cutting one corpus into test / validation / train (`data.split_prefixes`)."""

import collections
import hashlib
import pathlib
import random

import pytest
import shared_data

from transformer_mt.config import registry
from transformer_mt.data import sources as data_sources

SHARED = shared_data.DIR
TATOEBA = SHARED / "tatoeba" / "deu-eng"


def corpus_with_duplicates(num_sources=300, seed=1):
  """Sources of which about a third have 2-4 translations, each group's lines scattered."""
  rng = random.Random(seed)
  sources = []
  for i in range(num_sources):
    sources += [f"satz {i}"] * rng.choice([1, 1, 2, 3, 4])
  rng.shuffle(sources)
  return sources


def test_default_data_root_is_the_shared_folder_beside_the_repository(tmp_path, monkeypatch):
  """An experiment run without data.root, from any working directory, reads ../shared/data
  beside the repository root (the package's own location decides, not the cwd)."""
  shared_data.require("tatoeba")
  repository = pathlib.Path(data_sources.__file__).resolve().parents[2]
  assert (repository / "pyproject.toml").is_file()
  assert repository.parent / "shared" / "data" == data_sources.DEFAULT_LOCAL_ROOT
  monkeypatch.chdir(tmp_path)
  config = registry.load_experiment("tatoeba_deen")
  assert config.data.root == ""
  assert data_sources.local_root(config.data) == str(repository.parent / "shared" / "data")
  splits = data_sources.load_pairs(config.data)
  assert len(splits["test"]) == 1000 and len(splits["validation"]) == 500


def test_sizes_are_exact_and_splits_partition_the_lines():
  sources = corpus_with_duplicates()
  split = data_sources.split_indices(sources, 50, 30, seed=0)
  assert (len(split["test"]), len(split["validation"])) == (50, 30)
  everything = split["test"] + split["validation"] + split["train"]
  assert sorted(everything) == list(range(len(sources)))  # each line exactly once


def test_no_source_sentence_is_in_two_splits():
  sources = corpus_with_duplicates()
  split = data_sources.split_indices(sources, 50, 30, seed=0)
  where = collections.defaultdict(set)
  for name, indices in split.items():
    for i in indices:
      where[sources[i]].add(name)
  assert all(len(names) == 1 for names in where.values())
  # Groups of several lines did reach the held-out splits (the check above is not vacuous).
  counts = collections.Counter(sources)
  assert any(counts[sources[i]] > 1 for i in split["test"])


def test_same_seed_same_split_and_another_seed_another():
  sources = corpus_with_duplicates()
  first = data_sources.split_indices(sources, 50, 30, seed=0)
  assert data_sources.split_indices(list(sources), 50, 30, seed=0) == first
  assert data_sources.split_indices(sources, 50, 30, seed=1)["test"] != first["test"]


def test_split_depends_on_the_text_not_the_line_order():
  sources = [f"sentence {i}" for i in range(200)]
  shuffled = sources[::-1]
  by_text = {
    name: {sources[i] for i in indices}
    for name, indices in data_sources.split_indices(sources, 20, 10, seed=3).items()
  }
  by_text_shuffled = {
    name: {shuffled[i] for i in indices}
    for name, indices in data_sources.split_indices(shuffled, 20, 10, seed=3).items()
  }
  assert by_text == by_text_shuffled


def test_unique_sources_take_the_hash_order():
  """With no duplicates the test split is the first test_size sources by SHA-256 of
  "seed<TAB>source", validation the next ones: the documented rule, computed here directly."""
  sources = [f"sentence {i}" for i in range(100)]
  order = sorted(range(100), key=lambda i: hashlib.sha256(f"7\t{sources[i]}".encode()).digest())
  split = data_sources.split_indices(sources, 10, 5, seed=7)
  assert split == {"test": order[:10], "validation": order[10:15], "train": order[15:]}


@pytest.mark.parametrize("sizes", [(100, 100), (290, 0), (-1, 5)])
def test_sizes_that_cannot_be_met_are_an_error(sizes):
  with pytest.raises(ValueError, match="data.test_size"):
    data_sources.split_indices([f"s{i % 150}" for i in range(200)], *sizes, seed=0)


def test_split_prefixes_cannot_be_mixed_with_split_lists(tmp_path):
  (tmp_path / "corpus.de").write_text("a\nb\nc\n", encoding="utf-8")
  (tmp_path / "corpus.en").write_text("x\ny\nz\n", encoding="utf-8")
  config = registry.load_experiment(
    "tatoeba_deen",
    [
      f"data.root='{tmp_path}'",
      "data.source_lang='de'",
      "data.target_lang='en'",
      "data.split_prefixes=['corpus']",
      "data.test_prefixes=['corpus']",
    ],
  )
  with pytest.raises(ValueError, match=r"data.test_prefixes=\[\]"):
    data_sources.load_pairs(config.data)
  config.data.update(test_prefixes=[], test_size=1, validation_size=1)
  pairs = data_sources.load_pairs(config.data)
  assert sorted(pairs["test"] + pairs["validation"] + pairs["train"]) == [
    ("a", "x"),
    ("b", "y"),
    ("c", "z"),
  ]


def _lines(path):
  """The lines of a shared text file, split at "\n" only (two news files hold U+0085, which
  str.splitlines splits on), as the project reads them (written here, not taken from it)."""
  return pathlib.Path(path).read_text(encoding="utf-8").removesuffix("\n").split("\n")


def _sentences(pairs):
  """Every sentence of `pairs`, either side, stripped (written here, not taken from sources)."""
  return {sentence.strip() for pair in pairs for sentence in pair}


@pytest.mark.shared_data("tatoeba/deu-eng.deu", "tatoeba/deu-eng.eng")
def test_tatoeba_deen_split():
  """The experiment's split of the shared Tatoeba file: sizes, every pair used once, no
  German test or validation sentence in training, and the first test lines pinned."""
  config = registry.load_experiment(
    "tatoeba_deen", [f"data.root='{SHARED}'", "data.extra_train_prefixes=[]"]
  )
  splits = data_sources.load_pairs(config.data)
  assert {name: len(pairs) for name, pairs in splits.items()} == {
    "test": 1000,
    "validation": 500,
    "train": 15915,
  }
  german, english = _lines(f"{TATOEBA}.deu"), _lines(f"{TATOEBA}.eng")
  file_pairs = list(zip(german, english))
  held_out_pairs = splits["test"] + splits["validation"]
  held_out = _sentences(held_out_pairs)
  # Every file pair is held out, trained on, or dropped for sharing a held-out sentence (150
  # English ones, translations of other German sentences); training shares no sentence.
  shares = [pair for pair in file_pairs if pair[0] in held_out or pair[1] in held_out]
  assert sorted(held_out_pairs + splits["train"] + shares) == sorted(file_pairs + held_out_pairs)
  assert len(shares) - len(held_out_pairs) == 150
  assert not _sentences(splits["train"]) & held_out
  # Tatoeba repeats German sentences, so the check above is not vacuous.
  assert len(set(german)) < len(german)
  line = {pair: i for i, pair in enumerate(file_pairs)}  # every pair of the file is distinct
  # Golden: lines 7462 and 7463 share their German sentence and are held out together.
  assert [line[pair] for pair in splits["test"][:3]] == [7462, 7463, 12140]
  assert german[7462] == german[7463]


def test_extra_training_pairs_never_share_a_held_out_sentence(tmp_path):
  """data.extra_train_prefixes adds pairs to training only; a pair with a held-out sentence on
  either side (a held-out German source as an extra English target too) is dropped, and the
  held-out splits are the same as without the extra files."""
  lines = [(f"quelle {i}", f"target {i}") for i in range(40)]
  (tmp_path / "corpus.de").write_text("".join(f"{s}\n" for s, _ in lines), encoding="utf-8")
  (tmp_path / "corpus.en").write_text("".join(f"{t}\n" for _, t in lines), encoding="utf-8")
  overrides = [
    f"data.root='{tmp_path}'",
    "data.source_lang='de'",
    "data.target_lang='en'",
    "data.split_prefixes=['corpus']",
    "data.test_size=5",
    "data.validation_size=5",
  ]
  plain = data_sources.load_pairs(registry.load_experiment("tatoeba_deen", overrides).data)
  test_source, test_target = plain["test"][0]
  valid_source, valid_target = plain["validation"][0]
  extra = [
    (f" {test_source} ", "ein neuer satz"),  # held-out source, with stray spaces
    ("noch ein satz", valid_target),  # held-out target
    ("ein dritter satz", valid_source),  # held-out German sentence on the English side
    (test_target, "vierter"),  # held-out English sentence on the German side
    ("sauber", "clean"),
    ("sauber 2", "clean 2"),
  ]
  (tmp_path / "more.deu").write_text("".join(f"{s}\n" for s, _ in extra), encoding="utf-8")
  (tmp_path / "more.eng").write_text("".join(f"{t}\n" for _, t in extra), encoding="utf-8")
  config = registry.load_experiment(
    "tatoeba_deen",
    overrides + ["data.extra_train_prefixes=['more']", "data.extra_train_langs='deu,eng'"],
  )
  splits = data_sources.load_pairs(config.data)
  assert splits["test"] == plain["test"] and splits["validation"] == plain["validation"]
  assert splits["train"] == plain["train"] + [("sauber", "clean"), ("sauber 2", "clean 2")]
  assert not _sentences(splits["train"]) & _sentences(splits["test"] + splits["validation"])
  config.data.split_prefixes = []
  config.data.train_prefixes = ["corpus"]
  with pytest.raises(ValueError, match="data.extra_train_prefixes"):
    data_sources.load_pairs(config.data)
  config.data.update(split_prefixes=["corpus"], train_prefixes=[], extra_train_langs="deu")
  with pytest.raises(ValueError, match="data.extra_train_langs='deu'"):
    data_sources.load_pairs(config.data)


@pytest.mark.shared_data("tatoeba/deu-eng.deu", "tatoeba/eng-fra.fra", "news/en-de/newstest2014.de")
@pytest.mark.parametrize(
  "prefix, langs, kept, dropped",
  [
    # The WMT news test sets: none shares a sentence with the held-out Tatoeba pairs.
    ("news/en-de/*", "de,en", 35_579, 0),
    # Tatoeba's English-French pairs as FR->EN: 140 have a held-out English sentence.
    ("tatoeba/eng-fra", "fra,eng", 12_541, 140),
  ],
)
def test_tatoeba_deen_training_data_shares_no_sentence_with_its_held_out_splits(
  prefix, langs, kept, dropped
):
  """With extra training pairs (data.extra_train_prefixes): no sentence of the held-out
  Tatoeba test or validation pairs, German or English, is trained on, and the held-out
  splits are those of the Tatoeba file alone."""
  extra = [f"data.extra_train_prefixes=['{prefix}']", f"data.extra_train_langs='{langs}'"]
  config = registry.load_experiment("tatoeba_deen", [f"data.root='{SHARED}'"] + extra)
  splits = data_sources.load_pairs(config.data)
  alone = registry.load_experiment(
    "tatoeba_deen", [f"data.root='{SHARED}'", "data.extra_train_prefixes=[]"]
  )
  tatoeba = data_sources.load_pairs(alone.data)
  assert splits["test"] == tatoeba["test"] and splits["validation"] == tatoeba["validation"]
  assert splits["train"][: len(tatoeba["train"])] == tatoeba["train"]
  extra_pairs = splits["train"][len(tatoeba["train"]) :]
  held_out = _sentences(splits["test"] + splits["validation"])
  assert not _sentences(splits["train"]) & held_out
  # Brute force over the raw files: the pairs kept plus those sharing a held-out sentence are
  # every extra pair read.
  assert len(extra_pairs) == kept
  source_lang, target_lang = langs.split(",")
  pattern = pathlib.Path(prefix)
  files = sorted((SHARED / pattern.parent).glob(f"{pattern.name}.{source_lang}"))
  assert files
  raw = []
  for source_file in files:
    sources, targets = _lines(source_file), _lines(source_file.with_suffix("." + target_lang))
    raw += [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)]
  sharing = [pair for pair in raw if {pair[0], pair[1]} & held_out]
  assert len(sharing) == dropped
  assert len(raw) - len(sharing) == kept

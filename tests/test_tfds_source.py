"""TFDS WMT pairs: direction by language code, random access, pickling, and clear errors.

Nothing here touches the network. Most tests run under `tfds.testing.mock_data`,
with records whose text names its language, TFDS config and split, so that a
swapped direction or a wrong config shows in the strings themselves. One module
fixture goes further: it runs the real WMT builder on tiny fake raw files (the
download step is patched to return them) and so writes real ArrayRecord files,
which are then read back through the real `tfds.data_source`.
"""

import importlib
import importlib.resources.abc
import pickle
import shutil
import sys
import types

import numpy as np
import pytest
import requests
import tensorflow_datasets as tfds
import tree

from transformer_mt.data import tfds_source
from transformer_mt.data.text_files import DataError
from transformer_mt.data.tfds_source import DataUnavailableError, TranslationPairs

NUM_RECORDS = 5


def _labelled_records(self, split, decoders=None, deserialize_method=None, **kwargs):
  """Replaces `DatasetBuilder.as_data_source`: text like b"en|wmt14_translate/de-en|train|3"."""
  del decoders, deserialize_method, kwargs
  config = self.builder_config
  return [
    {
      lang: f"{lang}|{self.name}/{config.name}|{split}|{i}".encode()
      for lang in config.language_pair
    }
    for i in range(NUM_RECORDS)
  ]


@pytest.fixture
def labelled_tfds():
  with tfds.testing.mock_data(
    policy=tfds.testing.MockPolicy.USE_CODE, as_data_source_fn=_labelled_records
  ):
    yield


@pytest.mark.parametrize(
  "dataset,source,target,config",
  [
    ("wmt14_translate", "en", "de", "de-en"),
    ("wmt14_translate", "de", "en", "de-en"),
    ("wmt14_translate", "en", "fr", "fr-en"),
    ("wmt17_translate", "en", "de", "de-en"),
    ("wmt_t2t_translate", "en", "de", "de-en"),
  ],
)
def test_direction_is_chosen_by_language_code(labelled_tfds, dataset, source, target, config):
  pairs = tfds_source.load_tfds_pairs(dataset, source, target, "validation", data_dir="/unused")
  assert isinstance(pairs, TranslationPairs)
  assert pairs[2] == (
    f"{source}|{dataset}/{config}|validation|2",
    f"{target}|{dataset}/{config}|validation|2",
  )


def test_length_indexing_and_iteration(labelled_tfds):
  pairs = tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "test")
  assert len(pairs) == NUM_RECORDS
  assert pairs[0] == ("en|wmt14_translate/de-en|test|0", "de|wmt14_translate/de-en|test|0")
  assert pairs[-1] == pairs[NUM_RECORDS - 1] == pairs[np.int64(NUM_RECORDS - 1)]
  assert pairs.__getitems__([3, 1]) == [pairs[3], pairs[1]]
  assert len(list(pairs)) == NUM_RECORDS  # Iteration stops at IndexError.
  with pytest.raises(IndexError):
    pairs[NUM_RECORDS]
  with pytest.raises(IndexError):
    pairs[-NUM_RECORDS - 1]


def test_pickles_for_grain_workers(labelled_tfds):
  pairs = tfds_source.load_tfds_pairs("wmt17_translate", "de", "en", "train")
  restored = pickle.loads(pickle.dumps(pairs))
  assert list(restored) == list(pairs)
  assert (restored.source_lang, restored.target_lang) == ("de", "en")


def test_tfds_default_mock_goes_through_its_array_record_data_source():
  """TFDS's own mock keeps its ArrayRecordDataSource class (random str text); it must pickle."""
  with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
    pairs = tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "train")
    assert type(pairs.records.records).__name__ == "ArrayRecordDataSource"
    assert len(pairs) == 3
    assert all(isinstance(text, str) and text for pair in pairs for text in pair)
    assert list(pickle.loads(pickle.dumps(pairs))) == list(pairs)


def test_requests_array_record_and_passes_the_manual_dir(monkeypatch):
  calls = []
  monkeypatch.setattr(
    tfds, "data_source", lambda name, **kwargs: calls.append((name, kwargs)) or []
  )
  tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "train", data_dir="/d")
  tfds_source.load_tfds_pairs(
    "wmt14_translate", "en", "de", "train", manual_dir="/m", download=False
  )
  (name, plain), (_, manual) = calls
  assert name == "wmt14_translate/de-en"
  assert plain == {
    "split": "train",
    "data_dir": "/d",
    "download": True,
    "builder_kwargs": {"file_format": "array_record"},
  }
  assert manual["download"] is False
  assert manual["download_and_prepare_kwargs"]["download_config"].manual_dir == "/m"


def test_records_of_bytes_str_and_numpy_text():
  records = [
    {"de": b"Haus", "en": "house"},
    {"de": np.bytes_("Straße".encode()), "en": np.str_("street")},
    {"de": np.array("Baum"), "en": np.array(b"tree")},
  ]
  pairs = TranslationPairs(records, "en", "de")
  assert list(pairs) == [("house", "Haus"), ("street", "Straße"), ("tree", "Baum")]
  assert all(type(text) is str for pair in pairs for text in pair)
  with pytest.raises(KeyError, match=r"en->fr.*\['de', 'en'\]"):
    TranslationPairs(records, "en", "fr")[0]
  with pytest.raises(ValueError):
    TranslationPairs(records, "en", "en")


@pytest.mark.parametrize(
  "dataset,source,target,names",
  [
    ("wmt19_translate", "en", "de", "'wmt19_translate'"),
    ("wmt17_translate", "en", "fr", "en->fr"),
    ("wmt14_translate", "en", "cs", "en->cs"),
    ("wmt14_translate", "en", "en", "en->en"),
  ],
)
def test_unsupported_dataset_or_pair_lists_the_choices(monkeypatch, dataset, source, target, names):
  monkeypatch.setattr(tfds, "data_source", _must_not_be_called)
  with pytest.raises(ValueError) as info:
    tfds_source.load_tfds_pairs(dataset, source, target, "train")
  message = str(info.value)
  assert names in message
  for choice in (
    "wmt14_translate",
    "wmt17_translate",
    "wmt_t2t_translate",
    "en->de",
    "de->en",
    "en->fr",
  ):
    assert choice in message


@pytest.mark.parametrize("split", ["dev", "train[foo]", "train+newstest2014"])
def test_unknown_split_fails_before_any_download(monkeypatch, split):
  monkeypatch.setattr(tfds, "data_source", _must_not_be_called)
  with pytest.raises(ValueError, match="split"):
    tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", split)


def _must_not_be_called(*args, **kwargs):
  raise AssertionError("tfds.data_source was called")


def _offline_data_source(name, **kwargs):
  """What TFDS raises offline (after its retries): requests' ConnectionError, an OSError."""
  raise requests.exceptions.ConnectionError(
    "HTTPConnectionPool(host='www.statmt.org', port=80): Max retries exceeded with url: "
    "/wmt13/training-parallel-europarl-v7.tgz (Caused by NameResolutionError(...))"
  )


def test_download_failure_names_dataset_files_and_local_options(monkeypatch):
  monkeypatch.setattr(tfds, "data_source", _offline_data_source)
  with pytest.raises(DataUnavailableError) as info:
    tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "train", data_dir="/data/tfds")
  error = info.value
  assert isinstance(error, DataError)  # reported by the CLI as a one-line error
  assert isinstance(error.__cause__, requests.exceptions.ConnectionError)
  message = str(error)
  assert "wmt14_translate/de-en" in message and "data_dir=/data/tfds" in message
  assert "no network" in message and "ConnectionError" in message
  for url in (
    "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
    "http://data.statmt.org/wmt19/translation-task/dev.tgz",
  ):
    assert url in message
  assert "data.tfds_data_dir=" in message and "data.tfds_manual_dir=" in message
  assert "tfds build wmt14_translate/de-en --file_format=array_record" in message
  assert "Traceback" not in message


@pytest.mark.parametrize(
  "module,expected",
  [
    ("tensorflow", "TensorFlow"),
    ("importlib_resources", "pip install importlib_resources"),
  ],
)
def test_missing_python_module_is_named(monkeypatch, module, expected):
  def data_source(name, **kwargs):
    raise ModuleNotFoundError(f"No module named '{module}'", name=module)

  monkeypatch.setattr(tfds, "data_source", data_source)
  with pytest.raises(DataUnavailableError, match=expected) as info:
    tfds_source.load_tfds_pairs("wmt_t2t_translate", "de", "en", "train")
  assert "wmt_t2t_translate/de-en" in str(info.value)
  assert "data.tfds_data_dir=" in str(info.value)


def test_programming_errors_are_not_relabelled(monkeypatch):
  def data_source(name, **kwargs):
    raise TypeError("unexpected keyword argument")

  monkeypatch.setattr(tfds, "data_source", data_source)
  with pytest.raises(TypeError):
    tfds_source.load_tfds_pairs("wmt14_translate", "en", "de", "train")


def test_not_prepared_and_download_false(tmp_path):
  """The real tfds.data_source on an empty data_dir: nothing to read, and told not to download."""
  with pytest.raises(DataUnavailableError, match="download=False") as info:
    tfds_source.load_tfds_pairs(
      "wmt14_translate", "en", "de", "train", data_dir=str(tmp_path), download=False
    )
  assert f"data_dir={tmp_path}" in str(info.value)
  assert isinstance(info.value.__cause__, KeyError)


# A real (tiny) prepared dataset ------------------------------------------------------------


def _fake_raw_files(root, dataset, config):
  """Extracted-archive folders for each URL the builder downloads; line i of a file is
  "<lang> <sub-corpus> <i>". Returns {url: folder}."""
  from tensorflow_datasets.translate import wmt

  builder = tfds.builder_cls(dataset)(config=config)
  source, target = builder.builder_config.language_pair
  folders = {}
  for names in builder.subsets.values():
    for name in names:
      sub = wmt.DATASET_MAP[name]
      (url,) = sub.get_url(source)
      folder = folders.setdefault(url, root / url.rsplit("/", 1)[-1])
      for path, lang in zip(sub.get_path(source), (source, target)):
        file = folder / path
        file.parent.mkdir(parents=True, exist_ok=True)
        if path.endswith(".sgm"):
          file.write_text("".join(f'<seg id="{i}">{lang} {name} {i}</seg>\n' for i in range(3)))
        else:
          file.write_text("".join(f"{lang} {name} {i}\n" for i in range(3)))
  return {url: str(folder) for url, folder in folders.items()}


@pytest.fixture(scope="module")
def prepared_data_dir(tmp_path_factory):
  """wmt_t2t_translate/de-en prepared by the real builder from fake raw files, as array_record."""
  root = tmp_path_factory.mktemp("tfds")
  folders = _fake_raw_files(root / "raw", "wmt_t2t_translate", "de-en")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(
      tfds.download.DownloadManager,
      "download_and_extract",
      lambda self, urls: tree.map_structure(folders.__getitem__, urls),
    )
    try:
      importlib.import_module("importlib_resources")
    except ImportError:
      # tfds 4.9.10 reaches for importlib_resources.abc.Traversable while preparing any
      # dataset, but neither it nor etils>=1.15 depends on it on Python 3.11; the standard
      # library has the same class.
      mp.setitem(
        sys.modules, "importlib_resources", types.SimpleNamespace(abc=importlib.resources.abc)
      )
    pairs = tfds_source.load_tfds_pairs(
      "wmt_t2t_translate", "en", "de", "validation", data_dir=str(root / "data")
    )
  assert len(pairs) == 3
  return root / "data"


def test_reads_real_array_record_files_in_both_directions(prepared_data_dir):
  en_de = tfds_source.load_tfds_pairs(
    "wmt_t2t_translate", "en", "de", "test", data_dir=str(prepared_data_dir), download=False
  )
  assert type(en_de.records.records).__name__ == "ArrayRecordDataSource"
  assert sorted(en_de) == [(f"en newstest2014 {i}", f"de newstest2014 {i}") for i in range(3)]
  # Already prepared: download=True reuses the files (no download is patched in here).
  de_en = tfds_source.load_tfds_pairs(
    "wmt_t2t_translate", "de", "en", "train", data_dir=str(prepared_data_dir)
  )
  assert len(de_en) == 9
  assert {src.split()[0] for src, _ in de_en} == {"de"}
  assert all(src.replace("de ", "en ", 1) == tgt for src, tgt in de_en)
  assert {src.split()[1] for src, _ in de_en} == {
    "europarl_v7",
    "commoncrawl",
    "newscommentary_v13",
  }
  restored = pickle.loads(pickle.dumps(de_en))
  assert list(restored) == list(de_en)
  assert restored.__getitems__([0, 8]) == [de_en[0], de_en[8]]


class _SpyReader:
  """Delegates to an ArrayRecordReader and records each `read` call's arguments."""

  def __init__(self, reader, calls):
    self.reader, self.calls = reader, calls

  def read(self, *args):
    self.calls.append(args)
    return self.reader.read(*args)


def test_the_range_read_switching_off_is_warned_once(prepared_data_dir, monkeypatch, caplog):
  """If a TFDS or array_record release drops an internal the range read needs, reads still
  work (through TFDS) and one warning says why they are slower, once per process."""
  from transformer_mt.data import array_record_reads

  monkeypatch.setattr(array_record_reads, "_INTERNALS", ("_a_name_no_release_has",))
  monkeypatch.setattr(array_record_reads, "_warned", False)

  def load(name):
    dir_ = str(prepared_data_dir)
    return tfds_source.load_tfds_pairs("wmt_t2t_translate", "de", "en", name, dir_, None, False)

  caplog.set_level("WARNING")
  first, second = load("train"), load("test")
  assert not first.records.fast and not second.records.fast and first[0]
  warnings = [r.getMessage() for r in caplog.records if "range read needs" in r.getMessage()]
  assert len(warnings) == 1 and "array_record" in warnings[0]


@pytest.mark.parametrize("split", ["train", "train[2:7]", "test"])
def test_single_reads_are_range_reads_equal_to_tfds_own(prepared_data_dir, split):
  """One index is read with the shard reader's read(i, i + 1), not array_record's read([i])
  (whose cost grows with the shard), and decodes to exactly what TFDS's own read gives, slices
  (a start inside a shard) included; batches still go through TFDS."""

  def load(name):
    data_dir = str(prepared_data_dir)
    return tfds_source.load_tfds_pairs("wmt_t2t_translate", "de", "en", name, data_dir, None, False)

  pairs = load(split)
  reads = pairs.records
  assert reads.fast, "the installed tfds/array_record lack what the range read needs"
  tfds_own = [tfds_source._text(reads.records[i]["de"]) for i in range(len(pairs))]
  inner = reads.records.data_source
  calls = []
  for k in range(len(inner._readers)):
    inner._ensure_reader_exists(k)
    inner._readers[k] = _SpyReader(inner._readers[k], calls)
  assert [pairs[i][0] for i in range(len(pairs))] == tfds_own
  assert calls and all(len(args) == 2 and args[1] == args[0] + 1 for args in calls)
  if split == "train[2:7]":
    assert tfds_own == [src for src, _ in load("train")][2:7]
  assert pairs.__getitems__([len(pairs) - 1, 0]) == [pairs[len(pairs) - 1], pairs[0]]
  assert pickle.loads(pickle.dumps(pairs))[1] == pairs[1]


def test_tfrecord_copy_is_explained(prepared_data_dir, tmp_path):
  """A data_dir prepared without --file_format=array_record cannot serve tfds.data_source."""
  copy = tmp_path / "data"
  shutil.copytree(prepared_data_dir, copy)
  info_file = copy / "wmt_t2t_translate" / "de-en" / "1.0.0" / "dataset_info.json"
  info_file.write_text(info_file.read_text().replace('"array_record"', '"tfrecord"'))
  with pytest.raises(DataUnavailableError, match="convert_format") as info:
    tfds_source.load_tfds_pairs(
      "wmt_t2t_translate", "en", "de", "train", data_dir=str(copy), download=False
    )
  assert "array_record" in str(info.value) and "wmt_t2t_translate/de-en" in str(info.value)


@pytest.mark.parametrize("source,target", [("en", "de"), ("de", "en")])
def test_experiment_config_reads_tfds_splits_in_its_direction(labelled_tfds, source, target):
  """The config path used by `run.py train`: data.source='tfds' gives all three splits, and the
  Grain training pipeline packs them (through TFDS's random-access data source)."""
  from transformer_mt.config import registry
  from transformer_mt.data import input_pipeline
  from transformer_mt.data import sources as data_sources
  from transformer_mt.data.tokenizer import train_tokenizer

  config = registry.load_experiment(
    "transformer_base_wmt14_ende", [f"data.source_lang='{source}'", f"data.target_lang='{target}'"]
  )
  splits = data_sources.load_pairs(config.data)
  assert set(splits) == {"train", "validation", "test"}
  for split, pairs in splits.items():
    assert pairs[0] == (
      f"{source}|wmt14_translate/de-en|{split}|0",
      f"{target}|wmt14_translate/de-en|{split}|0",
    )
  tokenizer = train_tokenizer(list(splits["train"]) * 20, vocab_size=40, model_type="bpe")
  batches, counts = input_pipeline.training_batches(
    splits["train"], tokenizer, batch_rows=2, grad_accum_steps=1, max_len=32, seed=0
  )
  assert next(batches)["inputs"].shape == (1, 2, 32) and counts.seen > 0

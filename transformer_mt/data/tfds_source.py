"""WMT sentence pairs from TensorFlow Datasets, read through `tfds.data_source`.

`tfds.data_source` opens the prepared ArrayRecord files for random access (a
`Sequence` of records), which is what Grain needs for global shuffling and for
sharding across hosts; `tfds.load` would give a `tf.data` pipeline and need
TensorFlow at training time. Nothing here imports TensorFlow: preparing and
reading WMT in array_record format works without it (tfds 4.9.10 serialises with
its own copy of the tf.Example protos).

The translation direction is chosen explicitly, by language code. A TFDS WMT
config is named after its language pair in TFDS order ("de-en"), its records are
dicts keyed by language code ({"de": ..., "en": ...}), and its `supervised_keys`
are (de, en), the reverse of the paper's EN->DE. So `supervised_keys` are never
used: one config serves both directions, and `TranslationPairs` picks the two
sides by name.

Splits: "train", "validation" and "test" for every supported config. The WMT
builders keep only the sub-corpora that contain the pair, which gives:

  dataset/config           train                                   validation    test
  wmt14_translate/de-en    europarl_v7, commoncrawl,               newstest2013  newstest2014
                           newscommentary_v9
  wmt14_translate/fr-en    europarl_v7, commoncrawl, multiun,      newstest2013  newstest2014
                           newscommentary_v9, gigafren
  wmt17_translate/de-en    europarl_v7, commoncrawl,               newstest2016  newstest2017
                           newscommentary_v12, rapid_2016
  wmt_t2t_translate/de-en  europarl_v7, commoncrawl,               newstest2013  newstest2014
                           newscommentary_v13

(The builders also list newsdev2014, newsdev2017, newstestB2016 and newstestB2017,
which exist only for other pairs and are skipped for these.) TFDS slice syntax
such as "train[:1%]" or "validation+test" is passed through.

The first call prepares the dataset: it downloads the raw WMT archives from
statmt.org (about 1.7 GB for wmt14 de-en) and writes array_record files under the
data directory; later calls reuse them. Where that cannot happen (no network,
missing files or Python modules, a copy prepared as TFRecord), the
`DataUnavailableError` says which dataset, what must be downloaded, and how to
point `data.tfds_data_dir` / `data.tfds_manual_dir` at a local copy. In a multi-process
run only process 0 prepares; the others wait for it at a barrier and then only read.
"""

from __future__ import annotations

import collections.abc
import importlib
import operator
import re
from typing import Any

import jax
import tensorflow_datasets as tfds

from transformer_mt.data import array_record_reads
from transformer_mt.data.text_files import DataError
from transformer_mt.runtime import distributed, errors

# TFDS builder -> configs we support, each named after its pair in TFDS order.
SUPPORTED = {
  "wmt14_translate": ("de-en", "fr-en"),
  "wmt17_translate": ("de-en",),
  "wmt_t2t_translate": ("de-en",),
}
SPLITS = ("train", "validation", "test")

# TFDS registers its legacy builders by importing all dataset packages in a fixed
# order and gives up at the first ImportError; without the optional h5py, the
# `nearest_neighbors` package fails before `translate` is reached and
# `tfds.builder("wmt14_translate")` reports "Dataset not found". Importing the
# builder's own module registers it whatever else is installed.
_BUILDER_MODULES = {
  "wmt14_translate": "tensorflow_datasets.translate.wmt14",
  "wmt17_translate": "tensorflow_datasets.translate.wmt17",
  "wmt_t2t_translate": "tensorflow_datasets.translate.wmt_t2t",
}

# Raised by a broken call rather than by missing data: never relabelled as unavailability.
_PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError)

_MAX_CAUSE_CHARS = 400


class DataUnavailableError(DataError):
  """The requested TFDS dataset could neither be found prepared nor be prepared here.

  A user-facing data problem like any other DataError: the CLI prints its message
  as one line instead of a traceback.
  """


class TranslationPairs(collections.abc.Sequence):
  """(source_text, target_text) pairs over a random-access source of TFDS records.

  The records are dicts keyed by language code whose values are bytes (as read
  from ArrayRecord) or str; the two sides are picked by `source_lang` and
  `target_lang`, so the same records serve both directions. Holds only the
  wrapped source and two strings, so it pickles whenever the source does (as
  TFDS's `ArrayRecordDataSource` does), which Grain's worker processes need.
  """

  def __init__(self, records: collections.abc.Sequence[Any], source_lang: str, target_lang: str):
    if source_lang == target_lang:
      raise errors.BadValue(f"source_lang and target_lang are both {source_lang!r}.")
    self.records = records
    self.source_lang = source_lang
    self.target_lang = target_lang

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, index: int) -> tuple[str, str]:
    return self._pair(self.records[self._check_index(index)])

  def __getitems__(self, indices: collections.abc.Sequence[int]) -> list[tuple[str, str]]:
    """Batched read: ArrayRecord fetches many records in one call much faster than one by one."""
    keys = [self._check_index(i) for i in indices]
    getitems = getattr(self.records, "__getitems__", None)
    records = getitems(keys) if getitems is not None else [self.records[k] for k in keys]
    return [self._pair(record) for record in records]

  def __repr__(self) -> str:
    return (
      f"TranslationPairs({self.source_lang}->{self.target_lang}, {len(self)} pairs, "
      f"records={type(self.records).__name__})"
    )

  def _check_index(self, index: int) -> int:
    # ArrayRecord raises ValueError out of range, but `Sequence.__iter__` (and `in`,
    # `index()`) stop only on IndexError; negative indices count from the end as for a list.
    index = operator.index(index)
    size = len(self.records)
    if index < 0:
      index += size
    if not 0 <= index < size:
      raise IndexError(f"index out of range for {size} pairs")
    return index

  def _pair(self, record: collections.abc.Mapping[str, Any]) -> tuple[str, str]:
    try:
      return _text(record[self.source_lang]), _text(record[self.target_lang])
    except KeyError:
      raise errors.UnknownName(
        f"{self.source_lang}->{self.target_lang}: the record has languages "
        f"{sorted(record)}, not both of these."
      ) from None


def _text(value: Any) -> str:
  if isinstance(value, bytes):  # Also np.bytes_, a subclass.
    return value.decode("utf-8")
  if isinstance(value, str):
    return str(value)
  item = getattr(value, "item", None)  # A 0-d numpy array of either.
  if item is not None:
    return _text(item())
  raise TypeError(f"expected bytes or str text, got {type(value).__name__}")


def supported_choices() -> str:
  """The supported datasets with both directions of each config, for error messages."""
  lines = []
  for dataset, configs in SUPPORTED.items():
    directions = []
    for config in configs:
      a, b = config.split("-")
      directions += [f"{a}->{b}", f"{b}->{a}"]
    lines.append(f"  {dataset} (configs {', '.join(configs)}): {', '.join(directions)}")
  return "\n".join(lines)


def tfds_config(dataset: str, source_lang: str, target_lang: str) -> str:
  """The TFDS config serving `source_lang` -> `target_lang` ("de-en" for en->de and de->en)."""
  if dataset not in SUPPORTED:
    raise errors.BadValue(
      f"Unsupported TFDS dataset {dataset!r} (data.tfds_name). Supported datasets "
      f"and translation directions:\n{supported_choices()}"
    )
  for config in SUPPORTED[dataset]:
    if source_lang != target_lang and set(config.split("-")) == {source_lang, target_lang}:
      return config
  raise errors.BadValue(
    f"{dataset} has no supported config for {source_lang}->{target_lang} "
    f"(data.source_lang / data.target_lang). Supported datasets and translation "
    f"directions:\n{supported_choices()}"
  )


def _check_split(split: str) -> None:
  """Fails before a download of gigabytes if the split could never exist."""
  if not isinstance(split, str):  # e.g. a tfds.core.ReadInstruction: TFDS checks it.
    return
  tfds.core.ReadInstruction.from_spec(split)  # Syntax only (slices): ValueError if malformed.
  for part in re.split(r"\s*\+\s*", split.strip()):
    name = re.match(r"[\w-]*", part).group(0)
    if name not in SPLITS + ("all",):
      raise errors.BadValue(
        f"Unknown split {split!r}: split names are {list(SPLITS)} (TFDS slicing "
        f"such as 'train[:1%]' or 'validation+test' is allowed)."
      )


def load_tfds_pairs(
  dataset: str,
  source_lang: str,
  target_lang: str,
  split: str,
  data_dir: str | None = None,
  manual_dir: str | None = None,
  download: bool = True,
) -> TranslationPairs:
  """`split` of a TFDS WMT dataset as (source, target) pairs in the requested direction.

  `data_dir` is a TFDS data directory (None: TFDS's default, $TFDS_DATA_DIR or
  ~/tensorflow_datasets); with `download`, the dataset is prepared there first if it
  is not yet, from the raw WMT archives, taken from `manual_dir` where they have
  been placed by hand and downloaded otherwise. Raises ValueError for an
  unsupported dataset, direction or split, and DataUnavailableError when the data
  can neither be read nor prepared.
  """
  config = tfds_config(dataset, source_lang, target_lang)
  _check_split(split)
  # `tfds.data_source` asks for array_record itself only when neither data_dir nor
  # builder_kwargs is given; with a data_dir it would prepare TFRecord, which has no
  # random access. So the format is always requested explicitly.
  kwargs: dict[str, Any] = dict(
    split=split,
    data_dir=data_dir,
    download=download,
    builder_kwargs={"file_format": "array_record"},
  )
  if manual_dir:
    kwargs["download_and_prepare_kwargs"] = {
      "download_config": tfds.download.DownloadConfig(manual_dir=manual_dir)
    }
  name = f"{dataset}/{config}"
  if download and jax.process_count() > 1:
    # Several processes preparing one data_dir at once would download the archives N times
    # and write over each other's files: process 0 prepares, the others wait, then all read.
    failure = None
    if distributed.is_primary():
      try:
        _open_records(name, kwargs, dataset, config, split, data_dir, manual_dir)
      except Exception as e:  # Raised after the barrier, so that the others do not hang.
        failure = e
    distributed.barrier(f"tfds_prepared:{name}:{split}")
    if failure is not None:
      raise failure
    kwargs["download"] = False
  records = _open_records(name, kwargs, dataset, config, split, data_dir, manual_dir)
  # One record at a time, as a shuffled pipeline reads, at a cost independent of the shard size.
  return TranslationPairs(array_record_reads.SingleRecordReads(records), source_lang, target_lang)


def _open_records(name, kwargs, dataset, config, split, data_dir, manual_dir):
  """`tfds.data_source(name, **kwargs)`, its failures turned into DataUnavailableError."""
  try:
    importlib.import_module(_BUILDER_MODULES[dataset])
    return tfds.data_source(name, **kwargs)
  except _PROGRAMMING_ERRORS:
    raise
  except Exception as e:  # Network, files, missing modules: see _reason.
    raise DataUnavailableError(
      _unavailable_message(dataset, config, split, data_dir, manual_dir, kwargs["download"], e)
    ) from e


def _reason(error: Exception, download: bool, manual_dir: str | None) -> str:
  """What went wrong, in words; the exception itself is chained and summarised below."""
  name = type(error).__name__
  text = str(error)
  if isinstance(error, ImportError):
    module = error.name or "a module"
    if module.split(".")[0] == "tensorflow":
      return (
        "TFDS needed TensorFlow for this step and it is not installed. Training does not "
        "need it: prepare the dataset on another machine and use data.tfds_data_dir."
      )
    return (
      f"TFDS needs the Python module {module!r} to prepare the dataset and it is not "
      f"installed (pip install {module}); or prepare it elsewhere and use "
      f"data.tfds_data_dir."
    )
  if "File format is already set" in text or (
    isinstance(error, NotImplementedError) and "file format" in text.lower()
  ):
    return (
      "The copy in the data directory was prepared in another file format (TFRecord?), "
      "which has no random access; tfds.data_source needs array_record. Prepare it again "
      "with --file_format=array_record, or convert it with `tfds convert_format "
      "--dataset_version_dir=DIR/<dataset>/<config>/<version> "
      "--out_file_format=array_record`."
    )
  if name == "NonMatchingChecksumError":
    where = f"; check the files in {manual_dir}." if manual_dir else "."
    return (
      "A raw file does not have the size and checksum TFDS expects (truncated download, "
      "or another version of the file)" + where
    )
  if not download:
    return "download=False and no prepared copy was found in the data directory."
  if isinstance(error, AssertionError) and "manual" in text.lower():
    return (
      f"Files that must be downloaded by hand are missing from the manual directory ({manual_dir})."
    )
  if isinstance(error, OSError) or name in ("DownloadError", "ExtractError"):
    return "Downloading or extracting the raw WMT files failed (no network access?)."
  return "Preparing the dataset failed."


def _raw_downloads(dataset: str, config: str) -> list[tuple[str, str, int | None]]:
  """(file name, URL, size in bytes or None) of each raw archive the builder downloads.

  Read from the builder itself (its sub-corpora for this pair and TFDS's recorded
  checksums), so the list is the one TFDS would fetch; the file name is the one
  TFDS looks for in a manual directory.
  """
  from tensorflow_datasets.translate import wmt

  builder = tfds.builder_cls(dataset)(config=config)
  source = builder.builder_config.language_pair[0]
  urls = []
  for names in builder.subsets.values():
    for name in names:
      for url in wmt.DATASET_MAP[name].get_url(source):
        if url not in urls:
          urls.append(url)
  try:
    url_infos = type(builder).url_infos or {}
  except Exception:  # Fails without importlib_resources (tfds 4.9.10 on Python 3.11).
    try:  # The same file, where TFDS keeps the checksums of its legacy builders.
      from tensorflow_datasets.core.download import checksums

      url_infos = checksums.load_url_infos(
        tfds.core.utils.tfds_path() / "url_checksums" / f"{dataset}.txt"
      )
    except Exception:  # Only sizes and names come from it: never fail on it.
      url_infos = {}
  result = []
  for url in urls:
    info = url_infos.get(url)
    filename = (info and info.filename) or url.rsplit("/", 1)[-1]
    result.append((filename, url, info.size if info else None))
  return result


def _unavailable_message(
  dataset: str,
  config: str,
  split: str,
  data_dir: str | None,
  manual_dir: str | None,
  download: bool,
  error: Exception,
) -> str:
  name = f"{dataset}/{config}"
  where = (
    f"data_dir={data_dir}"
    if data_dir
    else "TFDS's default data_dir ($TFDS_DATA_DIR or ~/tensorflow_datasets)"
  )
  cause = f"{type(error).__name__}: {error}".replace("\n", " ")
  if len(cause) > _MAX_CAUSE_CHARS:
    cause = cause[:_MAX_CAUSE_CHARS] + "..."
  lines = [
    f"TFDS dataset {name} (split {split!r}) is not available in {where}.",
    _reason(error, download, manual_dir),
    f"Cause: {cause}",
  ]
  try:
    files = _raw_downloads(dataset, config)
  except Exception:  # The advice below still holds without the list.
    files = []
  if files:
    sizes = [size for _, _, size in files if size]
    total = f", {sum(sizes) / 1e9:.1f} GB in all" if len(sizes) == len(files) else ""
    lines.append(f"Preparing {name} needs these raw WMT files{total}:")
    for filename, url, size in files:
      # TFDS recognises a manually placed file only by the name in its checksums.
      note = (
        f"{size / 1e6:.0f} MB"
        if size
        else "no recorded checksum: downloaded even with a manual dir"
      )
      lines.append(f"  {filename} ({note})  {url}")
  else:
    lines.append(
      f"Preparing {name} needs the raw WMT archives from statmt.org (their URLs are "
      f"in tensorflow_datasets/translate/wmt.py)."
    )
  lines += [
    "To use a local copy instead, set either:",
    f"  data.tfds_data_dir=DIR     a TFDS data directory in which {name} is already prepared "
    f"in array_record format, e.g. built on a machine with internet by `tfds build {name} "
    f"--file_format=array_record --data_dir=DIR` and copied here;",
    f"  data.tfds_manual_dir=DIR   a folder holding the raw files above under those names, "
    f"from which TFDS prepares {name} without downloading them.",
  ]
  return "\n".join(lines)

"""The tokenizer as an Orbax checkpoint item: plain files, loadable without this project.

Our SentencePiece model is stored as the file SentencePiece itself reads; an imported Marian
model's as its source.spm, target.spm and vocab.json; other imported kinds as their own files
beside tokenizer_kind.json naming the kind. `tokenizer_files` says which files an item cannot be
read without, for restoring it and for telling a damaged item from a sound one.
"""

from __future__ import annotations

import dataclasses

import jax
import orbax.checkpoint as ocp
from etils import epath

from transformer_mt.data import tokenizer as tokenizers
from transformer_mt.data.tokenizer import KIND_FILENAME, AnyTokenizer
from transformer_mt.runtime import errors


class TokenizerCheckpointHandler(ocp.CheckpointHandler):
  """Stores the tokenizer as plain files in the checkpoint: our SentencePiece model, an
  imported Marian model's SentencePiece models and vocabulary (which files are there says
  which), or the files of another imported kind beside a marker naming the kind."""

  @classmethod
  def typestr(cls) -> str:
    """The name Orbax records for this item in each step's _CHECKPOINT_METADATA
    (`item_handlers`), pinned to the class's name before it moved here, so new checkpoints'
    metadata stays as it was. Restoring never looks it up: readers pass TokenizerRestore."""
    return "transformer_mt.checkpointing.TokenizerCheckpointHandler"

  def save(self, directory: epath.Path, args: TokenizerSave):
    if jax.process_index() != 0:
      return
    for name, contents in tokenizers.to_files(args.tokenizer).items():
      (directory / name).write_bytes(contents)

  def restore(self, directory: epath.Path, args: TokenizerRestore | None = None) -> AnyTokenizer:
    names = tokenizer_files(directory)
    missing = [name for name in names if not (directory / name).exists()]
    if missing:
      raise errors.MissingFile(f"Checkpoint has no tokenizer: {directory / missing[0]} is missing.")
    return tokenizers.from_files({name: (directory / name).read_bytes() for name in names})

  def metadata(self, directory: epath.Path):
    return None

  def structure(self, directory: epath.Path):
    return None

  def finalize(self, directory: epath.Path):
    pass

  def close(self):
    pass


@ocp.args.register_with_handler(TokenizerCheckpointHandler, for_save=True)
@dataclasses.dataclass
class TokenizerSave(ocp.args.CheckpointArgs):
  tokenizer: AnyTokenizer


@ocp.args.register_with_handler(TokenizerCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class TokenizerRestore(ocp.args.CheckpointArgs):
  pass


def tokenizer_files(directory: epath.Path) -> tuple[str, ...]:
  """The files a tokenizer item cannot be read without: its kind's beside a kind marker, an
  imported Marian model's when any of them is there, else our SentencePiece model."""
  marker = directory / KIND_FILENAME
  if marker.exists():
    try:
      return tokenizers.required_files((), marker.read_bytes())
    except (OSError, ValueError):  # an unreadable marker: reported as the marker's damage
      return (KIND_FILENAME,)
  names = [p.name for p in directory.iterdir()] if directory.exists() else []
  return tokenizers.required_files(names)

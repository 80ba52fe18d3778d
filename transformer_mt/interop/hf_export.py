"""A workdir's model as a Hugging Face MarianMTModel directory: the inverse of `hf_convert`.

`export_hf(workdir, output)` writes what `AutoModelForSeq2SeqLM.from_pretrained(output)` and
`AutoTokenizer.from_pretrained(output)` load with transformers alone (config.json,
generation_config.json, model.safetensors, the tokenizer files) and a model card, README.md.

Which class: MarianMTModel, the one transformers class whose computation equals a post-LN
model of ours exactly. Its layers are the paper's (post-LN, biases everywhere, no embedding
LayerNorm); its positions are sinusoids of pos / 10000^(2i/d_model) from position 0, sines in
the first half of d_model and cosines in the second (our "sinusoidal_halves"); it scales the
embeddings by sqrt(d_model) or not (`scale_embedding`), ties the encoder, decoder and output
embeddings, and adds `final_logits_bias` to the logits. FSMT, the other post-LN class, counts
positions from pad + 1 with fairseq's frequencies, and its tokenizer (Moses and BPE) cannot
hold a SentencePiece model. The paper's interleaved sinusoid ("sinusoidal": sin and cos of
one frequency side by side) is Marian's with the d_model dimensions in another order; every
weight's d_model axis (the "embed" logical axis) is reordered to Marian's, which changes no
value: LayerNorm and every matmul are indifferent to a consistent order of the residual
stream.

Anything else is refused before a file is written, with every difference named
(`marian_differences`): pre-LN, other positions or a position offset, untied embeddings, a
LayerNorm epsilon other than Marian's fixed 1e-5, ...

The tokenizer: MarianTokenizer numbers SentencePiece pieces with vocab.json, so our joint model
becomes source.spm = target.spm and a vocab.json of its own pieces with their own ids (pad 0,
eos 1, bos 2, unk 3): the ids transformers reads are ours. An imported Marian model's files go
back as they came. Nothing is half-written: the directory is made beside `output` under a
temporary name and renamed into place when complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import flax
import flax.linen as nn
import jax
import ml_collections
import numpy as np

from transformer_mt.data import tokenizer as tokenizers
from transformer_mt.interop import hf_names, model_card
from transformer_mt.model import layout
from transformer_mt.model import setup as run_setup
from transformer_mt.model.transformer import Transformer
from transformer_mt.model.transformer_config import TransformerConfig
from transformer_mt.runtime import errors, sharding
from transformer_mt.workdir import checkpointing

# modeling_marian.py builds every LayerNorm as nn.LayerNorm(d_model): torch's default epsilon.
MARIAN_LAYER_NORM_EPSILON = 1e-5
# Our activation -> transformers' ACT2FN name for the same function.
_HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "swish": "swish"}
# Marian's own sinusoid, and the paper's, which is Marian's in another d_model order.
_MARIAN_POSITIONS = ("sinusoidal_halves", "sinusoidal")


def marian_differences(config: TransformerConfig, fixed_epsilon: bool = True) -> list[str]:
  """What of `config` no MarianMTModel computes ([] when one computes exactly ours).

  Args:
    fixed_epsilon: count a LayerNorm epsilon other than Marian's as a difference (False for
      a directory only read by CTranslate2's converter, whose models carry their own).
  """
  differences = []
  if config.layer_norm_position != "post":
    differences.append(
      f"layer_norm_position={config.layer_norm_position!r} (pre-LN): MarianMTModel and FSMT "
      "are post-LN"
    )
  for name in ("use_layer_norm", "use_residual", "use_bias", "attention_output_projection"):
    if not getattr(config, name):
      differences.append(f"{name}=False: Marian's layers always have it")
  if config.embedding_layer_norm:
    differences.append("embedding_layer_norm=True: Marian has no LayerNorm on the embeddings")
  if config.position_encoding not in _MARIAN_POSITIONS:
    differences.append(
      f"position_encoding={config.position_encoding!r}: Marian adds sinusoids of "
      "pos / 10000^(2i/d_model) ('sinusoidal' or 'sinusoidal_halves'); FSMT, which computes "
      "fairseq's, has a Moses+BPE tokenizer that cannot hold our SentencePiece model"
    )
  if config.position_offset:
    differences.append(f"position_offset={config.position_offset}: Marian counts positions from 0")
  if not config.share_embeddings:
    differences.append(
      "share_embeddings=False (untied embeddings and output projection): only tied models "
      "are exported"
    )
  if config.per_head_dim * config.num_heads != config.d_model:
    differences.append(
      f"head_dim={config.head_dim}: Marian's heads are d_model / num_heads = "
      f"{config.d_model // config.num_heads} wide"
    )
  if fixed_epsilon and config.layer_norm_epsilon != MARIAN_LAYER_NORM_EPSILON:
    differences.append(
      f"layer_norm_epsilon={config.layer_norm_epsilon:g}: Marian's LayerNorms use "
      f"{MARIAN_LAYER_NORM_EPSILON:g}, fixed in transformers' code (train with "
      f"model.layer_norm_epsilon={MARIAN_LAYER_NORM_EPSILON:g} to export; --to ctranslate2 "
      "takes any epsilon)"
    )
  return differences


def check_exportable(
  config: TransformerConfig, tokenizer: tokenizers.AnyTokenizer, fixed_epsilon: bool = True
) -> None:
  """Raises BadValue naming every difference of the model or tokenizer from Marian's
  (`fixed_epsilon`: see `marian_differences`)."""
  differences = marian_differences(config, fixed_epsilon)
  if not isinstance(tokenizer, tokenizers.Tokenizer | tokenizers.VocabTokenizer):
    kind = getattr(tokenizer, "kind", type(tokenizer).__name__)
    differences.append(f"the {kind} tokenizer: MarianTokenizer holds SentencePiece models only")
  if differences:
    via = "" if fixed_epsilon else " (CTranslate2's converter reads a MarianMTModel)"
    raise errors.BadValue(
      f"No transformers class computes this model exactly{via}, so it is not exported: "
      + "; ".join(differences)
      + "."
    )


def residual_order(config: TransformerConfig) -> np.ndarray | None:
  """Marian's d_model order as indices into ours (None: the same order).

  The paper's encoding puts sin and cos of frequency i at dims 2i and 2i + 1; Marian's puts
  the sines first (dims 0 .. ceil(d/2) - 1) and the cosines after them.
  """
  if config.position_encoding == "sinusoidal_halves":
    return None
  return np.concatenate([np.arange(0, config.d_model, 2), np.arange(1, config.d_model, 2)])


def embed_axes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
  """Each parameter's ("/"-joined path) axes that run along d_model: those the model names
  "embed" for sharding (model/layout.py)."""
  boxed = layout.logical_params(Transformer(config.replace(deterministic=True)))
  names = jax.tree.map(
    lambda box: box.names, boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)
  )
  flat = flax.traverse_util.flatten_dict(names, sep="/")
  return {path: tuple(i for i, n in enumerate(axes) if n == "embed") for path, axes in flat.items()}


def state_dict(params: Any, config: TransformerConfig) -> dict[str, np.ndarray]:
  """MarianMTModel's state dict (float32 numpy, "model."-prefixed names as `state_dict()`
  gives them; the tied copies of the embedding left out) holding `params`.

  Raises:
    ValueError: a parameter the table has no row for (a bug: the checks let through a model
      whose parameters Marian does not have).
  """
  flat = {
    path: np.asarray(x, np.float32)
    for path, x in flax.traverse_util.flatten_dict(params, sep="/").items()
  }
  order = residual_order(config)
  if order is not None:
    for path, axes in embed_axes(config).items():
      for axis in axes:
        flat[path] = np.take(flat[path], order, axis=axis)
  key_bias = (config.num_heads * config.per_head_dim,)
  state = {}
  for row in hf_names.shared_rows(config):
    # The key bias (no place in ours) is zero: softmax would cancel any value.
    value = np.zeros(key_bias, np.float32) if row.ours is None else flat.pop(row.ours)
    value = value if row.ours is None else hf_names.to_theirs(row, value)
    state[f"model.{row.theirs}"] = value
  # Rows past the vocabulary (a table padded to vocab_pad_multiple) are never produced: cut.
  vocab = config.vocab_size
  embedding = flat.pop(hf_names.TIED_EMBEDDING.ours)[:vocab]  # [vocab, d_model]
  state[f"model.{hf_names.TIED_EMBEDDING.theirs}"] = embedding
  bias = flat.pop(hf_names.LOGITS_BIAS.ours, np.zeros(vocab, np.float32))[:vocab]
  state[hf_names.LOGITS_BIAS.theirs] = hf_names.to_theirs(hf_names.LOGITS_BIAS, bias)
  if flat:
    raise ValueError(f"No Marian name for our parameters {sorted(flat)[:8]}.")
  # Own, writable, C-ordered arrays: torch.from_numpy shares their memory.
  return {name: np.array(x, np.float32, order="C") for name, x in state.items()}


def marian_config(config: TransformerConfig) -> dict:
  """MarianConfig's fields for `config` (checked by `check_exportable`)."""
  return dict(
    vocab_size=config.vocab_size,
    decoder_vocab_size=config.vocab_size,
    d_model=config.d_model,
    encoder_layers=config.num_encoder_layers,
    decoder_layers=config.num_decoder_layers,
    encoder_attention_heads=config.num_heads,
    decoder_attention_heads=config.num_heads,
    encoder_ffn_dim=config.d_ff,
    decoder_ffn_dim=config.d_ff,
    activation_function=_HF_ACTIVATIONS[config.activation],
    # Marian's position table has this many rows; ours computes any position.
    max_position_embeddings=config.max_len,
    scale_embedding=config.scale_embeddings,
    share_encoder_decoder_embeddings=True,
    tie_word_embeddings=True,
    dropout=config.dropout_rate,
    attention_dropout=config.attention_dropout_rate,
    activation_dropout=config.relu_dropout_rate,
    pad_token_id=config.pad_id,
    eos_token_id=config.eos_id,
    decoder_start_token_id=config.decoder_start_id,
    forced_eos_token_id=None,
  )


def generation_config(config: TransformerConfig, decode: ml_collections.ConfigDict) -> dict:
  """generation_config.json: `generate` decoding as our `decode` section does, as far as it
  can. Exactly (beam search with candidate_pool "hf" and length_penalty "power": its
  `length_penalty` is our alpha) but for the length limit, which ours takes per sentence
  (source length + extra_len, at most max_len) and theirs for the batch (max_length, the
  decoder start token included); GNMT's ((5 + len) / 6) ** alpha has no counterpart, and
  len ** alpha stands in for it."""
  beam = int(decode.beam_size)
  # transformers refuses beam-search settings without beams (a greedy run's config).
  search = dict(length_penalty=float(decode.alpha), early_stopping="never") if beam > 1 else {}
  return dict(
    decoder_start_token_id=config.decoder_start_id,
    bos_token_id=config.decoder_start_id,
    eos_token_id=config.eos_id,
    pad_token_id=config.pad_id,
    num_beams=beam,
    # early_stopping="never": ours is exact, a sentence ends when no live beam can win.
    **search,
    max_length=int(decode.max_len) + 1,
    # Ours never emits PAD or a decoder start token that is not EOS, and masks them before
    # the softmax; renormalizing does the same after transformers' mask.
    suppress_tokens=list(config.suppressed_ids),
    renormalize_logits=True,
    forced_eos_token_id=None,
  )


def tokenizer_files(tokenizer: tokenizers.AnyTokenizer) -> tuple[dict[str, bytes], dict]:
  """(MarianTokenizer's files: source.spm, target.spm, vocab.json; its special tokens)."""
  if isinstance(tokenizer, tokenizers.VocabTokenizer):
    files = tokenizer.files()
    return {n: files[n] for n in tokenizers.VOCAB_TOKENIZER_FILES[:3]}, tokenizer.special_tokens
  pieces = tokenizer.pieces(range(tokenizer.vocab_size))
  vocab = {piece: i for i, piece in enumerate(pieces)}
  special = {
    kind: pieces[i]
    for kind, i in (("pad", tokenizers.PAD_ID), ("eos", tokenizers.EOS_ID), ("unk", 3))
  }
  files = {
    tokenizers.SOURCE_SPM: tokenizer.model_proto,
    tokenizers.TARGET_SPM: tokenizer.model_proto,
    tokenizers.VOCAB_FILENAME: json.dumps(vocab, ensure_ascii=False).encode(),
  }
  return files, special


def read_params(workdir: str, step: int, config: ml_collections.ConfigDict, tokenizer) -> Any:
  """The checkpoint's parameters as numpy arrays on the host."""
  mesh = sharding.make_mesh(sharding.inference_mesh_config())
  target = run_setup.model_setup(config, tokenizer, mesh).abstract_params
  return jax.device_get(checkpointing.restore_params(workdir, step, target))


def write_marian(
  directory: str,
  params: Any,
  model_config: TransformerConfig,
  tokenizer: tokenizers.AnyTokenizer,
  config: ml_collections.ConfigDict,
) -> None:
  """Writes the MarianMTModel and MarianTokenizer of our model into `directory` with
  transformers' own `save_pretrained` (the format it reads back)."""
  import torch
  import transformers

  hf_config = transformers.MarianConfig(**marian_config(model_config))
  with torch.device("meta"):  # no random initialization: every weight is ours
    model = transformers.MarianMTModel(hf_config)
  weights = {name: torch.from_numpy(x) for name, x in state_dict(params, model_config).items()}
  missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
  tied = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
  computed = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
  left = set(missing) - tied - computed - {"lm_head.weight"}
  if left or unexpected:
    raise ValueError(f"MarianMTModel's weights differ from the export's: {left} {unexpected}")
  model.tie_weights()
  model.generation_config = transformers.GenerationConfig(
    **generation_config(model_config, config.decode)
  )
  model.save_pretrained(directory)
  files, special = tokenizer_files(tokenizer)
  with tempfile.TemporaryDirectory() as scratch:
    for name, content in files.items():
      with open(os.path.join(scratch, name), "wb") as f:
        f.write(content)
    hf_tokenizer = transformers.MarianTokenizer(
      source_spm=os.path.join(scratch, tokenizers.SOURCE_SPM),
      target_spm=os.path.join(scratch, tokenizers.TARGET_SPM),
      vocab=os.path.join(scratch, tokenizers.VOCAB_FILENAME),
      source_lang=config.data.source_lang,
      target_lang=config.data.target_lang,
      unk_token=special["unk"],
      eos_token=special["eos"],
      pad_token=special["pad"],
      model_max_length=model_config.max_len,
      clean_up_tokenization_spaces=False,
    )
    hf_tokenizer.save_pretrained(directory)


@dataclasses.dataclass(frozen=True)
class Exportable:
  """A checkpoint checked to be exportable: what writing it needs, its parameters aside."""

  workdir: str
  step: int
  config: ml_collections.ConfigDict
  model_config: TransformerConfig
  tokenizer: tokenizers.AnyTokenizer


def require_transformers() -> None:
  """transformers and torch write the export (`save_pretrained`): the `interop` extra."""
  try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
  except ImportError as e:
    raise errors.BadValue(
      f"run.py export needs transformers and torch ({e}): pip install -e '.[interop]'"
    ) from e


def exportable(workdir: str, step: int | None = None, fixed_epsilon: bool = True) -> Exportable:
  """Checkpoint `step` (default: the latest) of `workdir`, checked before anything is read
  but its config and tokenizer (`check_exportable`)."""
  config, tokenizer, step = checkpointing.read_config(workdir, step)
  config = run_setup.runnable_here(config)
  model_config = run_setup.model_config_for(config, tokenizer)
  check_exportable(model_config, tokenizer, fixed_epsilon)
  return Exportable(workdir, step, config, model_config, tokenizer)


def write_export(directory: str, checked: Exportable) -> None:
  """The MarianMTModel, its tokenizer and the model card (README.md) into `directory`."""
  params = read_params(checked.workdir, checked.step, checked.config, checked.tokenizer)
  write_marian(directory, params, checked.model_config, checked.tokenizer, checked.config)
  reports = model_card.eval_reports(checked.workdir, checked.step)
  card = model_card.model_card(
    checked.config, checked.model_config, checked.step, reports, checked.tokenizer
  )
  with open(os.path.join(directory, model_card.FILENAME), "w", encoding="utf-8") as f:
    f.write(card)


@contextlib.contextmanager
def staged(output: str) -> Iterator[str]:
  """A new directory beside `output` to write into, renamed to `output` when the block ends
  without an exception and removed otherwise: `output` is complete or absent.

  Raises:
    AlreadyExists: `output` exists (checked first, and again at the rename).
  """
  if os.path.exists(output):
    raise errors.AlreadyExists(f"{output} already exists; export into a new directory.")
  parent = os.path.dirname(os.path.abspath(output))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.export-", dir=parent)
  try:
    yield staging
    if os.path.exists(output):
      raise errors.AlreadyExists(f"{output} appeared while exporting; nothing was written.")
    os.rename(staging, output)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def export_hf(workdir: str, output: str, step: int | None = None) -> str:
  """Writes the model of `workdir` (checkpoint `step`, default the latest) as a Hugging Face
  MarianMTModel directory `output`, with its tokenizer and model card; returns `output`.

  Raises:
    BadValue: a model or tokenizer Marian does not compute exactly (nothing is written).
    AlreadyExists: `output` exists.
  """
  require_transformers()
  checked = exportable(workdir, step)
  with staged(output) as staging:
    write_export(staging, checked)
  return output

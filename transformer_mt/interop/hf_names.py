"""One table of parameter names, read both ways: our Flax tree <-> a Hugging Face state dict.

The encoder-decoders of transformers (Marian, FSMT, mBART, M2M100) name their layers alike,
so one table covers the weights all four share: every layer's attention, feed-forward and
LayerNorm weights, a pre-LN stack's final LayerNorms, mBART's embedding LayerNorms and learned
position tables, plus the tied token embedding and its logits bias. `hf_convert` (import) reads
it from their names to ours and `hf_export` (export) from ours to theirs. What only an import
meets stays there: the copies of a tied embedding saved under other names, and the untied
embeddings and output projections (FSMT's own, untied Marian's lm_head), which the export
refuses.

Each row names how the array changes between the layouts (`LAYOUTS`), as a pair of functions
that are each other's inverse, so an export of an import gives back every array bit for bit.
A row whose `ours` is None is a weight of theirs we have no place for: the key bias, which
softmax cancels (see attention.py), read and dropped by an import, written as zeros by an
export.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from transformer_mt.model.transformer_config import TransformerConfig


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one kind of weight is laid out on each side.

  to_ours(theirs, heads) -> ours; to_theirs(ours) -> theirs (heads are in our shape).
  """

  to_ours: Callable[[np.ndarray, int], np.ndarray]
  to_theirs: Callable[[np.ndarray], np.ndarray]


LAYOUTS = {
  # LayerNorm scales and biases, the output projection's bias, position tables.
  "copy": Layout(lambda x, heads: x, lambda x: x),
  # torch Linear weight [out, in] <-> Dense kernel [in, out] (fc1, fc2).
  "linear": Layout(lambda x, heads: x.T, lambda x: x.T),
  # q/k/v_proj.weight [heads * head_dim, d_model] <-> kernel [d_model, heads, head_dim].
  "heads_in": Layout(
    lambda x, heads: x.T.reshape(x.shape[1], heads, -1),
    lambda x: x.reshape(x.shape[0], -1).T,
  ),
  # q/v_proj.bias [heads * head_dim] <-> bias [heads, head_dim].
  "heads_bias": Layout(lambda x, heads: x.reshape(heads, -1), lambda x: x.reshape(-1)),
  # out_proj.weight [d_model, heads * head_dim] <-> kernel [heads, head_dim, d_model].
  "heads_out": Layout(
    lambda x, heads: x.T.reshape(heads, -1, x.shape[0]),
    lambda x: x.reshape(-1, x.shape[-1]).T,
  ),
  # final_logits_bias [1, vocab] <-> logits_bias [vocab].
  "row": Layout(lambda x, heads: x.reshape(-1), lambda x: x.reshape(1, -1)),
}


@dataclasses.dataclass(frozen=True)
class Row:
  """One weight: our path ("/"-joined, as flax.traverse_util.flatten_dict(sep="/") names it;
  None: no place in our model), their name (without the "model." prefix), its layout."""

  ours: str | None
  theirs: str
  layout: str


def _attention(ours: str, theirs: str) -> list[Row]:
  return [
    Row(f"{ours}/query/kernel", f"{theirs}.q_proj.weight", "heads_in"),
    Row(f"{ours}/query/bias", f"{theirs}.q_proj.bias", "heads_bias"),
    Row(f"{ours}/key/kernel", f"{theirs}.k_proj.weight", "heads_in"),
    Row(None, f"{theirs}.k_proj.bias", "heads_bias"),  # softmax cancels it: we have none
    Row(f"{ours}/value/kernel", f"{theirs}.v_proj.weight", "heads_in"),
    Row(f"{ours}/value/bias", f"{theirs}.v_proj.bias", "heads_bias"),
    Row(f"{ours}/out/kernel", f"{theirs}.out_proj.weight", "heads_out"),
    Row(f"{ours}/out/bias", f"{theirs}.out_proj.bias", "copy"),
  ]


def _layer_norm(ours: str, theirs: str) -> list[Row]:
  return [
    Row(f"{ours}/scale", f"{theirs}.weight", "copy"),
    Row(f"{ours}/bias", f"{theirs}.bias", "copy"),
  ]


def _ffn(ours: str, theirs: str) -> list[Row]:
  return [
    Row(f"{ours}/wi/kernel", f"{theirs}.fc1.weight", "linear"),
    Row(f"{ours}/wi/bias", f"{theirs}.fc1.bias", "copy"),
    Row(f"{ours}/wo/kernel", f"{theirs}.fc2.weight", "linear"),
    Row(f"{ours}/wo/bias", f"{theirs}.fc2.bias", "copy"),
  ]


def shared_rows(config: TransformerConfig) -> list[Row]:
  """The rows every model type shares for `config`: layers, a pre-LN stack's final
  LayerNorms, and per side its learned position table and embedding LayerNorm (if any)."""
  rows = []
  for i in range(config.num_encoder_layers):
    ours, theirs = f"encoder_layers_{i}", f"encoder.layers.{i}"
    rows += _attention(f"{ours}/self_attention", f"{theirs}.self_attn")
    rows += _layer_norm(f"{ours}/attention_block/norm", f"{theirs}.self_attn_layer_norm")
    rows += _ffn(f"{ours}/ffn", theirs)
    rows += _layer_norm(f"{ours}/ffn_block/norm", f"{theirs}.final_layer_norm")
  for i in range(config.num_decoder_layers):
    ours, theirs = f"decoder_layers_{i}", f"decoder.layers.{i}"
    rows += _attention(f"{ours}/self_attention", f"{theirs}.self_attn")
    rows += _layer_norm(f"{ours}/self_attention_block/norm", f"{theirs}.self_attn_layer_norm")
    rows += _attention(f"{ours}/cross_attention", f"{theirs}.encoder_attn")
    rows += _layer_norm(f"{ours}/cross_attention_block/norm", f"{theirs}.encoder_attn_layer_norm")
    rows += _ffn(f"{ours}/ffn", theirs)
    rows += _layer_norm(f"{ours}/ffn_block/norm", f"{theirs}.final_layer_norm")
  if config.layer_norm_position == "pre":
    rows += _layer_norm("encoder_norm", "encoder.layer_norm")
    rows += _layer_norm("decoder_norm", "decoder.layer_norm")
  for side, embedder in (("encoder", "source_embedder"), ("decoder", "target_embedder")):
    if config.position_encoding == "learned":
      position = f"{embedder}/position_embedding/embedding"
      rows.append(Row(position, f"{side}.embed_positions.weight", "copy"))
    if config.embedding_layer_norm:
      rows += _layer_norm(f"{embedder}/embedding_norm", f"{side}.layernorm_embedding")
  return rows


# The tied token embedding (source, target and output in one array; saved once, as
# "shared.weight", its copies encoder/decoder.embed_tokens and lm_head left out) and the bias
# on the tied output projection (Marian's and mBART's final_logits_bias, a buffer [1, vocab]).
TIED_EMBEDDING = Row("source_embedder/embedding/embedding", "shared.weight", "copy")
LOGITS_BIAS = Row("logits_bias", "final_logits_bias", "row")


def to_ours(row: Row, value: np.ndarray, heads: int) -> np.ndarray:
  return LAYOUTS[row.layout].to_ours(value, heads)


def to_theirs(row: Row, value: np.ndarray) -> np.ndarray:
  return LAYOUTS[row.layout].to_theirs(value)

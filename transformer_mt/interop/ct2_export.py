"""A workdir's model as a CTranslate2 model directory, converted by CTranslate2's own converter.

`export_ctranslate2(workdir, output)` writes the MarianMTModel export of `hf_export` into a
temporary folder and converts it with `ctranslate2.converters.TransformersConverter`: its
Marian loader maps every weight and its serializer writes model.bin (nothing of the format is
written here), optionally quantized (int8, ...). The SentencePiece model travels beside it
(source.spm, target.spm), and the model card.

Two assumptions of that loader hold for OPUS-MT but not for our models, so `ExactMarianLoader`
turns them off, and the converted model computes exactly what ours does (token log-probs
within float32 rounding, tests/test_export.py):
  * OPUS-MT starts the decoder from PAD, whose embedding is zero, so the loader starts every
    model from a zero embedding and drops the last vocabulary row as OPUS-MT's PAD; ours
    starts from BOS (id 2), a trained embedding, and its last row is an ordinary piece;
  * the loader leaves the LayerNorm epsilon at CTranslate2's default (1e-5, Marian's); the
    model config of CTranslate2 carries one, so ours (1e-6 by default) is written there, and
    a model with any epsilon converts, where transformers' Marian fixes 1e-5 (`hf_export`
    refuses the others; its temporary directory here is read only by the converter, which
    takes the epsilon from us).

ctranslate2 is the `ctranslate2` extra (`pip install -e ".[ctranslate2]"`); without it the
export stops with one error line.
"""

from __future__ import annotations

import os
import tempfile

from transformer_mt.interop import hf_export, model_card
from transformer_mt.runtime import errors

# What `--quantization` takes: CTranslate2's weight types that run on CPU and GPU.
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "float16", "bfloat16")
# The files copied from the Marian export beside model.bin: the SentencePiece models that cut
# text into the pieces CTranslate2 takes (the model card is written for CTranslate2).
COPIED_FILES = ("source.spm", "target.spm")


def _require_ctranslate2():
  try:
    import ctranslate2  # noqa: F401
    from ctranslate2.converters import transformers as converters
  except ImportError as e:
    raise errors.BadValue(
      f"--to ctranslate2 needs the ctranslate2 package ({e}): pip install -e '.[ctranslate2]'"
    ) from e
  return converters


def exact_converter(hf_directory: str, layer_norm_epsilon: float):
  """A `TransformersConverter` of the MarianMTModel export in `hf_directory` whose model
  computes ours exactly (see the module docstring), with our LayerNorm epsilon."""
  converters = _require_ctranslate2()
  import torch
  import transformers

  class ExactMarianLoader(converters.MarianMTLoader):
    """CTranslate2's Marian loader without OPUS-MT's PAD conventions, with our epsilon."""

    def get_model_spec(self, model):
      model.config.normalize_before = False  # post-LN
      model.config.normalize_embedding = False  # no embedding LayerNorm
      # BartLoader's spec, without MarianMTLoader's removal of the last vocabulary row.
      return converters.BartLoader.get_model_spec(self, model)

    def set_config(self, config, model, tokenizer):
      super().set_config(config, model, tokenizer)
      start = model.config.decoder_start_token_id
      config.decoder_start_token = tokenizer.convert_ids_to_tokens(start)
      config.layer_norm_epsilon = layer_norm_epsilon

    def set_decoder(self, spec, decoder):
      # The decoder starts from its start token's embedding, not from zeros.
      converters.BartLoader.set_decoder(self, spec, decoder)

    def get_vocabulary(self, model, tokenizer):
      return converters.BartLoader.get_vocabulary(self, model, tokenizer)

  class ExactMarianConverter(converters.TransformersConverter):
    """TransformersConverter with ExactMarianLoader for this one directory."""

    def _load(self):
      with torch.no_grad():
        model = transformers.MarianMTModel.from_pretrained(hf_directory)
        tokenizer = transformers.AutoTokenizer.from_pretrained(hf_directory)
        spec = ExactMarianLoader()(model, tokenizer)
      for name in COPIED_FILES:
        spec.register_file(os.path.join(hf_directory, name))
      return spec

  return ExactMarianConverter(hf_directory)


def export_ctranslate2(
  workdir: str, output: str, step: int | None = None, quantization: str | None = None
) -> str:
  """Writes the model of `workdir` (checkpoint `step`, default the latest) as a CTranslate2
  model directory `output`; returns `output`.

  Args:
    quantization: CTranslate2's weight type (QUANTIZATIONS; None keeps float32).

  Raises:
    BadValue: no ctranslate2, an unknown quantization, or a model that no Marian model
      computes but for its LayerNorm epsilon (nothing is written).
    AlreadyExists: `output` exists.
  """
  if quantization is not None and quantization not in QUANTIZATIONS:
    raise errors.BadValue(
      f"--quantization {quantization}: expected one of {', '.join(QUANTIZATIONS)}."
    )
  _require_ctranslate2()
  checked = hf_export.exportable(workdir, step, fixed_epsilon=False)
  with hf_export.staged(output) as staging, tempfile.TemporaryDirectory() as scratch:
    hf_directory = os.path.join(scratch, "marian")
    os.makedirs(hf_directory)
    hf_export.write_export(hf_directory, checked)
    converter = exact_converter(hf_directory, checked.model_config.layer_norm_epsilon)
    converter.convert(staging, quantization=quantization, force=True)
    reports = model_card.eval_reports(workdir, checked.step)
    card = model_card.model_card(
      checked.config,
      checked.model_config,
      checked.step,
      reports,
      checked.tokenizer,
      target="ctranslate2",
    )
    with open(os.path.join(staging, model_card.FILENAME), "w", encoding="utf-8") as f:
      f.write(card)
  return output

"""`run.py score` of an imported Marian model == transformers' teacher-forced log-probabilities.

test_hf_import.py's tiny random MarianMTModel and real MarianTokenizer are imported with the
CLI; `score` of real sentence pairs is compared with the log-softmax of transformers' own
forward pass given the labels its tokenizer makes (`text_target`), summed per sentence. As in
our decoder, PAD (which is also Marian's decoder start) is never generated, so it is masked
before the softmax on the transformers side too (test_hf_beam.py: `renormalize_logits`).

Select with `-m interop`; skipped without transformers (>= 5), torch, or the shared news data.
"""

from __future__ import annotations

import hf_fakes
import numpy as np
import pytest

torch, transformers = hf_fakes.require_interop()

from transformer_mt import cli  # noqa: E402

pytestmark = pytest.mark.interop

marian_dir = hf_fakes.marian_dir  # the fixture: test_hf_import.py's tiny Marian model


def _transformers_log_probs(directory, sources, targets) -> tuple[np.ndarray, np.ndarray]:
  """(summed log-probs, token counts) of each target given its source, by transformers."""
  tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
  model = transformers.MarianMTModel.from_pretrained(directory).eval()
  batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
  labels = batch.pop("labels")  # [batch, tgt_len], padded with PAD
  with torch.no_grad():
    logits = model(**batch, labels=labels).logits.double()  # [batch, tgt_len, vocab]
  logits[..., tokenizer.pad_token_id] = -torch.inf
  log_probs = torch.log_softmax(logits, dim=-1)
  counted = labels != tokenizer.pad_token_id
  picked = log_probs.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
  sums = torch.where(counted, picked, torch.zeros_like(picked)).sum(-1)
  return sums.numpy(), counted.sum(-1).numpy()


def test_score_equals_transformers_forward(marian_dir, tmp_path, capsys):  # noqa: F811
  workdir = tmp_path / "imported"
  rc = cli.main(["import", "--from", f"hf:{marian_dir}", "--workdir", str(workdir)])
  assert rc == 0, capsys.readouterr().err
  sources, targets = hf_fakes.news_lines("en", 2000, 2012), hf_fakes.news_lines("de", 2000, 2012)
  (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
  (tmp_path / "tgt.txt").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
  output = tmp_path / "scores.tsv"
  argv = ["score", "--workdir", str(workdir), "--source", str(tmp_path / "src.txt")]
  rc = cli.main(argv + ["--target", str(tmp_path / "tgt.txt"), "--output", str(output)])
  assert rc == 0, capsys.readouterr().err
  rows = [line.split("\t") for line in output.read_text(encoding="utf-8").splitlines()]
  expected, counts = _transformers_log_probs(marian_dir, sources, targets)
  assert [int(r[2]) for r in rows] == counts.tolist()
  # Summed over ~30-60 tokens from float32 logits: within 1e-4 relative of float64 PyTorch's.
  np.testing.assert_allclose([float(r[1]) for r in rows], expected, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose([float(r[3]) for r in rows], expected / counts, rtol=1e-4, atol=1e-4)

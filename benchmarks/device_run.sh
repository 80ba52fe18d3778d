#!/usr/bin/env bash
# The prepared device call of issue 42, on one H100/H200 (benchmarks/device_prepare.sh first):
#   1. benchmarks/accelerator.py, every section (or ACCELERATOR_SECTIONS=a,b for a rerun);
#   2. the published Multi30k row from data to BLEU: `run.py reproduce` of
#      transformer_tiny_multi30k_ende, timed as a whole command (its log gives the steps/s,
#      the input wait share and test2016 BLEU), unless SKIP_REPRODUCE=1.
# Everything is also written under $OUT (logs, results.json), which comes back with the reply.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/device_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  git rev-parse --short HEAD 2>/dev/null || echo "commit: (no .git)"
  python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
} 2>&1 | tee "$OUT/machine.txt"
python3 benchmarks/accelerator.py ${ACCELERATOR_SECTIONS:+--sections "$ACCELERATOR_SECTIONS"} \
  2>&1 | tee "$OUT/accelerator.txt"
if [ "${SKIP_REPRODUCE:-0}" != 1 ]; then
  start=$(date +%s)
  python3 run.py reproduce --experiment transformer_tiny_multi30k_ende --workdir /tmp/m30k \
    data.root=device_data 2>&1 | tee "$OUT/reproduce.txt"
  echo "reproduce: $(( $(date +%s) - start )) s for the whole command" | tee -a "$OUT/reproduce.txt"
  cp /tmp/m30k/results.json /tmp/m30k/metrics.jsonl "$OUT/" 2>/dev/null
  # The input pipeline's share of the training wall time (metrics.jsonl's input_wait_share,
  # weighted by steps) and the step rate.
  python3 - <<'PY' 2>&1 | tee -a "$OUT/reproduce.txt"
import json
rows = [json.loads(line) for line in open("/tmp/m30k/metrics.jsonl")]
rows = [r for r in rows if "input_wait_share" in r]
print(f"input wait share {sum(r['input_wait_share'] for r in rows) / max(len(rows), 1):.1%} over "
      f"{len(rows)} steps; median target tokens/s "
      f"{sorted(r['tokens_per_second'] for r in rows)[len(rows) // 2] if rows else 0:,.0f}")
PY
fi

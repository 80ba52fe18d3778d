#!/usr/bin/env bash
# The prepared device call of issue 42, on one H100/H200 (benchmarks/device_prepare.sh first):
#   1. benchmarks/accelerator.py, the sections of ACCELERATOR_SECTIONS (default: the train
#      steps and decoding, what the PyTorch reference is compared with);
#   2. benchmarks/torch_reference.py, the same Base and Big steps in PyTorch, in its own
#      process (JAX's process would hold most of the GPU's memory), unless SKIP_TORCH=1;
#   3. the published Multi30k row from data to BLEU: `run.py reproduce` of
#      transformer_tiny_multi30k_ende, timed as a whole command (its log gives the steps/s,
#      the input wait share and test2016 BLEU), unless SKIP_REPRODUCE=1; stopped after
#      REPRODUCE_LIMIT seconds (default 330: the goal is 300), so the sections after it run;
#   4. benchmarks/accelerator.py again for ACCELERATOR_LATER (default: every other section);
#      a section named nowhere is not run, and "none" runs none.
# The order puts what the acceptance compares first: a call cut by its time limit loses the end.
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
first="${ACCELERATOR_SECTIONS:-base,big,decode,generate}"
later="${ACCELERATOR_LATER:-combined,attention,bf16,cudnn,packed,xla_flags,levers}"
if [ "$first" != none ]; then
  python3 benchmarks/accelerator.py --sections "$first" 2>&1 | tee "$OUT/accelerator.txt"
fi
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  timeout "${TORCH_LIMIT:-240}" python3 benchmarks/torch_reference.py 2>&1 | tee "$OUT/torch_reference.txt"
fi
if [ "${SKIP_REPRODUCE:-0}" != 1 ]; then
  start=$(date +%s)
  # JAX_LOG_COMPILES: each compilation and its seconds in the log (on the first GPU run, 2026-11-28,
  # training paused for over a minute after the first epoch's step: compiles were suspected).
  JAX_LOG_COMPILES=1 timeout "${REPRODUCE_LIMIT:-330}" python3 run.py reproduce \
    --experiment transformer_tiny_multi30k_ende --workdir /tmp/m30k data.root=device_data 2>&1 | tee "$OUT/reproduce.txt"
  echo "reproduce: $(( $(date +%s) - start )) s for the whole command" | tee -a "$OUT/reproduce.txt"
  grep -o "Finished XLA compilation of .* in [0-9.]* sec" "$OUT/reproduce.txt" \
    | awk '{n++; s+=$(NF-1)} END {printf "compilations: %d, %.1f s in all\n", n, s}' \
    | tee -a "$OUT/reproduce.txt"
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
if [ "$later" != none ]; then
  python3 benchmarks/accelerator.py --sections "$later" 2>&1 | tee "$OUT/accelerator_later.txt"
fi

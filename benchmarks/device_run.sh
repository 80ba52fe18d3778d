#!/usr/bin/env bash
# The GPU check, from the repository root, on a machine with one NVIDIA GPU (H100/H200 class):
#   bash benchmarks/device_run.sh            # everything below, ~8 minutes on an H200
#   bash benchmarks/device_run.sh prepare    # first, on a machine with internet access, when the
#                                            # GPU machine has none: see "prepare" below
# The run takes its packages and data from the tree: the wheels in .whl/ (installed into
# /tmp/site, when .whl/ exists; otherwise the Python environment must have the project
# installed) and Multi30k from device_data/multi30k/ (otherwise from data.root's default,
# ../shared/data). It runs, in this order (a run cut short loses the end):
#   1. benchmarks/accelerator.py, the sections of ACCELERATOR_SECTIONS (default: the train
#      steps, what the PyTorch reference is compared with, and beam 4 with the decode
#      defaults users run, alone and against transformers' generate);
#   2. benchmarks/torch_reference.py, the same Base and Big steps in PyTorch, in its own
#      process (JAX's process would hold most of the GPU's memory), unless SKIP_TORCH=1;
#   3. the published Multi30k row from data to BLEU: `run.py reproduce` of
#      transformer_tiny_multi30k_ende, timed as a whole command (its log gives the steps/s,
#      the input wait share and test2016 BLEU), unless SKIP_REPRODUCE=1; stopped after
#      REPRODUCE_LIMIT seconds (default 330: the goal is 300), so the sections after it run;
#   4. benchmarks/accelerator.py again for ACCELERATOR_LATER (default: every other section,
#      the decode defaults against each decode lever on and off, "decode_levers", second);
#      "none" runs none.
# Everything is also written under $OUT (default /tmp/device_out): logs, results.json.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = prepare ]; then
  # What a GPU machine without internet lacks, put into two ignored folders of the tree:
  #   .whl/               wheels for Python 3.12 of the packages a CUDA image of jax, flax,
  #                       optax, orbax, torch, transformers, sacrebleu and sentencepiece lacks
  #                       (the versions this checkout is tested with);
  #   device_data/multi30k/  Multi30k's lowercased, tokenized files.
  set -e
  mkdir -p .whl device_data/multi30k
  cp ../shared/data/multi30k/{train,val,test_2016_flickr}.lc.norm.tok.{en,de} device_data/multi30k/
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl grain==0.2.18 array-record==0.8.6 \
    ml-collections==1.1.0 sacremoses==0.2.0 tensorboardX==2.6.5 portpicker==1.6.0
  du -sh .whl device_data
  exit 0
fi

OUT="${OUT:-/tmp/device_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH="/tmp/site:$PWD"
fi
data_root=()
if [ -d device_data/multi30k ]; then data_root=(data.root=device_data); fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  git rev-parse --short HEAD 2>/dev/null || echo "commit: (no .git)"
  python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
} 2>&1 | tee "$OUT/machine.txt"
first="${ACCELERATOR_SECTIONS:-base,big,decode,generate}"
later="${ACCELERATOR_LATER:-combined,decode_levers,attention,bf16,cudnn,packed,xla_flags,levers}"
if [ "$first" != none ]; then
  python3 benchmarks/accelerator.py --sections "$first" 2>&1 | tee "$OUT/accelerator.txt"
fi
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  timeout "${TORCH_LIMIT:-240}" python3 benchmarks/torch_reference.py 2>&1 | tee "$OUT/torch_reference.txt"
fi
if [ "${SKIP_REPRODUCE:-0}" != 1 ]; then
  start=$(date +%s)
  # JAX_LOG_COMPILES: each compilation and its seconds in the log, summed below.
  JAX_LOG_COMPILES=1 timeout "${REPRODUCE_LIMIT:-330}" python3 run.py reproduce \
    --experiment transformer_tiny_multi30k_ende --workdir /tmp/m30k "${data_root[@]}" 2>&1 | tee "$OUT/reproduce.txt"
  echo "reproduce: $(( $(date +%s) - start )) s for the whole command" | tee -a "$OUT/reproduce.txt"
  grep -o "Finished XLA compilation of .* in [0-9.]* sec" "$OUT/reproduce.txt" \
    | awk '{n++; s+=$(NF-1)} END {printf "compilations: %d, %.1f s in all\n", n, s}' \
    | tee -a "$OUT/reproduce.txt"
  cp /tmp/m30k/results.json /tmp/m30k/metrics.jsonl "$OUT/" 2>/dev/null
  # The input pipeline's share of the training wall time (metrics.jsonl's input_wait_share,
  # weighted by steps) and the step rate.
  python3 - <<'PY' 2>&1 | tee -a "$OUT/reproduce.txt"
import json
records = [json.loads(line) for line in open("/tmp/m30k/metrics.jsonl")]
for r in records:
    if "compile/programs" in r:  # the run's programs compiled ahead (runtime/ahead_of_time.py)
        print(f"compiled ahead: {r['compile/programs']:.0f} programs, {r['compile/seconds']:.1f} s; "
              f"the loop waited {r['compile/waited_after_first_step_s']:.1f} s for them after step 1")
rows = [r for r in records if "input_wait_share" in r]
print(f"input wait share {sum(r['input_wait_share'] for r in rows) / max(len(rows), 1):.1%} over "
      f"{len(rows)} steps; median target tokens/s "
      f"{sorted(r['tokens_per_second'] for r in rows)[len(rows) // 2] if rows else 0:,.0f}")
PY
fi
if [ "$later" != none ]; then
  python3 benchmarks/accelerator.py --sections "$later" 2>&1 | tee "$OUT/accelerator_later.txt"
fi

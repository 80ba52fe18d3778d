#!/usr/bin/env bash
# Run here, from the repository root, before the device call of issue 42 (benchmarks/device_run.sh):
# what the GPU machine lacks travels with the tree, in two ignored folders that the call carries.
#   .whl/               wheels for its Python 3.12 of the packages its image does not hold (the
#                       versions this checkout is tested with; its jax, flax, optax, orbax, torch,
#                       transformers, sacrebleu and sentencepiece are its own);
#   device_data/multi30k/  Multi30k's lowercased, tokenized files (../shared does not travel).
# Then: run(command="bash benchmarks/device_run.sh", carry=[".whl", "device_data"], timeout_s=480)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl device_data/multi30k
cp ../shared/data/multi30k/{train,val,test_2016_flickr}.lc.norm.tok.{en,de} device_data/multi30k/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl grain==0.2.18 array-record==0.8.6 ml-collections==1.1.0 sacremoses==0.2.0 \
  tensorboardX==2.6.5 portpicker==1.6.0
du -sh .whl device_data

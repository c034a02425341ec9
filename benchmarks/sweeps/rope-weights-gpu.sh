#!/usr/bin/env bash
# After rotary embeddings entered the executor's dense blocks: the whole-model peaks of
# whole-model-h200.sh again (the rotation is in place, so they should not move), and a transformers-
# written checkpoint executed with --weights beside transformers' own loss. On an nvidia-h200 machine,
# from the repository root; results under $OUT:
#   bash benchmarks/sweeps/rope-weights-gpu.sh
set -u
export PYTHONPATH=$PWD
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'FutureWarning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
t python benchmarks/weights_check.py --out "$OUT/weights-check-h200.json"
for spec in "dense-7b 16384" "llama3-8b 16384" "dense-7b 131072"; do
  set -- $spec
  t torchrun --standalone --nproc-per-node 1 benchmarks/memory_peak.py --whole --model "$1" --layers 2 --seq "$2" \
      --layouts single --top 12 --out "$OUT/memory-peak-whole-rope-$1-2L-$2-h200.json"
done

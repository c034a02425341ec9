#!/usr/bin/env bash
# The whole model (embedding, layers, final norm, LM head, cross-entropy) training on one H200 beside
# the memory model's prediction, with what is live at the peak; and an execute whose predicted peak
# exceeds the GPU, to show its out-of-memory recorded as a result. Run from the repository root on an
# nvidia-h200 machine; results under $OUT:
#   bash benchmarks/sweeps/whole-model-h200.sh
set -u
export PYTHONPATH=$PWD
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'FutureWarning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
for spec in "dense-7b 16384" "dense-7b 131072" "llama3-8b 16384" "mamba2-1.3b 16384" "mamba2-1.3b 131072"; do
  set -- $spec
  t torchrun --standalone --nproc-per-node 1 benchmarks/memory_peak.py --whole --model "$1" --layers 2 --seq "$2" \
      --layouts single --top 12 --out "$OUT/memory-peak-whole-$1-2L-$2-h200.json"
done
t python -m meshplan execute --model mamba2-1.3b --layout single --seq 128k --nproc 1 --device cuda --steps 2 \
    --out "$OUT/execute-oom-mamba2-1.3b-128k-h200.json"

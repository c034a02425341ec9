#!/usr/bin/env bash
# Session 25 on one H200: the executor's cross-entropy through its Triton kernels against its torch path
# (benchmarks/bench_loss.py), then the whole model on one GPU (the five memory_peak runs of
# whole-model-h200.sh) with the kernels in the loss.
#   bash benchmarks/sweeps/s25-loss-kernels.sh
set -u
export PYTHONPATH=$PWD
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | tail -${TAIL:-30}; echo "[$(( SECONDS - s )) s] $*"; }
t timeout 200 python benchmarks/bench_loss.py --rated-tb-per-s 4.8 --out "$OUT/loss-kernels-h200.json"
for spec in "dense-7b 16384" "dense-7b 131072" "llama3-8b 16384" "mamba2-1.3b 16384" "mamba2-1.3b 131072"; do
  set -- $spec
  TAIL=2 t timeout 150 torchrun --standalone --nproc-per-node 1 benchmarks/memory_peak.py --whole --model "$1" --layers 2 \
      --seq "$2" --layouts single --top 12 --out "$OUT/memory-peak-whole-$1-2L-$2-h200.json"
done

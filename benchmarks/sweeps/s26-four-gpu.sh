#!/usr/bin/env bash
# Session 26, 4 GPUs: today's executor at degree 4 (whole model, graphed where it can be), against the preset's
# prediction; benchmarks/compare_validation.py re-scores the run files on measured collectives afterwards.
#   bash benchmarks/sweeps/s26-four-gpu.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s26-four-gpu}
mkdir -p "$OUT"
t() { local s=$SECONDS; timeout -k 5 ${LIMIT:-120} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | grep -e "step time" -e "peak memory" -e "exposed" -e "error"; echo "[$(( SECONDS - s )) s] $*"; }
for seq in 4096 16384; do
  for layout in tp=4 tsp=4 sp=4 tp=2,sp=2; do
    t python -m meshplan execute --model dense-7b --layers 2 --layout $layout --seq $seq --device cuda --nproc 4 \
        --out "$OUT/execute-dense-7b-${layout//[=,]/}-$seq.json" --compare --timeout 110
  done
done
t python -m meshplan execute --model mamba2-2.7b --layers 2 --layout tsp=4 --seq 16384 --device cuda --nproc 4 \
    --out "$OUT/execute-mamba2-2.7b-tsp4-16384.json" --compare --timeout 110

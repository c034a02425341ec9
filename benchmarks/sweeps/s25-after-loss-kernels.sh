#!/usr/bin/env bash
# Session 25, 2 GPUs: the TSP and tp=2 rows of s25-tsp-final.sh and s25-tsp-hybrid.sh again, once the loss ran as
# meshplan/kernels/cross_entropy.py's Triton passes, against the model that prices them.
#   bash benchmarks/sweeps/s25-after-loss-kernels.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s25-after-loss-kernels}
mkdir -p "$OUT"
t() { local s=$SECONDS; timeout -k 5 ${LIMIT:-150} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | grep -e "step time" -e "peak memory" -e "exposed"; echo "[$(( SECONDS - s )) s] $*"; }
for seq in 4096 16384; do
  t python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq $seq --device cuda --nproc 2 \
      --out "$OUT/execute-dense-7b-tsp2-$seq.json" --compare --timeout 120
  t python -m meshplan execute --model mamba2-2.7b --layers 2 --layout tsp=2 --seq $seq --device cuda --nproc 2 \
      --out "$OUT/execute-mamba2-2.7b-tsp2-$seq.json" --compare --timeout 120
done
t python -m meshplan execute --model dense-7b --layers 2 --layout tp=2 --seq 4096 --device cuda --nproc 2 \
    --out "$OUT/execute-dense-7b-tp2-4096.json" --compare --timeout 120

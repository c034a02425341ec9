#!/usr/bin/env bash
# Session 25, 2 GPUs: dense TSP with session 24's last byte savings (13.5 GB a 4K step on rank 0, counted on the
# CPU by benchmarks/tsp_bytes.py, never timed), two rounds, as a user runs it; tp=2 beside it on the same lease.
#   bash benchmarks/sweeps/s25-tsp-final.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s25-tsp-final}
mkdir -p "$OUT"
t() { local s=$SECONDS; timeout -k 5 ${LIMIT:-150} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | tail -${TAIL:-6}; echo "[$(( SECONDS - s )) s] $*"; }
for round in 1 2; do
  for seq in 4096 16384; do
    t python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq $seq --device cuda --nproc 2 \
        --out "$OUT/execute-dense-7b-tsp2-$seq-r$round.json" --compare --timeout 120
  done
done
t python -m meshplan execute --model dense-7b --layers 2 --layout tp=2 --seq 4096 --device cuda --nproc 2 \
    --out "$OUT/execute-dense-7b-tp2-4096.json" --compare --timeout 120

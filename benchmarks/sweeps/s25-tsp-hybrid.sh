#!/usr/bin/env bash
# Session 25, 2 GPUs: TSP over Mamba-2 and a hybrid Mamba-2/attention/MoE stack, profiled, against the cost model
# with TSP's motion priced for Mamba-2 and MoE blocks (costmodel/axes/tsp.py).
#   bash benchmarks/sweeps/s25-tsp-hybrid.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s25-tsp-hybrid}
mkdir -p "$OUT"
t() { local s=$SECONDS; timeout -k 5 ${LIMIT:-170} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | tail -${TAIL:-16}; echo "[$(( SECONDS - s )) s] $*"; }
for seq in 16384 4096; do
  t python -m meshplan execute --model mamba2-2.7b --layers 2 --layout tsp=2 --seq $seq --device cuda --nproc 2 \
      --out "$OUT/execute-mamba2-2.7b-tsp2-$seq.json" --compare --profile --timeout 150
done
t python -m meshplan execute --model nemotron-3-nano --layers 6 --layout tsp=2,ep=2 --seq 8192 --device cuda --nproc 2 \
    --out "$OUT/execute-nemotron-3-nano-6L-tsp2-ep2-8192.json" --compare --profile --timeout 150

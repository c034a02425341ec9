#!/usr/bin/env bash
# Session 24, 2 GPUs: dense TSP after its backward writes weight gradients straight into the reduce-scatter
# rows (no cat, copy or zero-fill), as a user runs it, and the graph-vs-eager weights check.
#   bash benchmarks/sweeps/s24-tsp-rows.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s24-tsp-rows}
mkdir -p "$OUT"
t() { local s=$SECONDS; timeout -k 5 ${LIMIT:-150} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | tail -${TAIL:-8}; echo "[$(( SECONDS - s )) s] $*"; }
for seq in 4096 16384; do
  t python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq $seq --device cuda --nproc 2 \
      --out "$OUT/execute-dense-7b-tsp2-$seq.json" --compare --timeout 120
done
t env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NCCL_GRAPH_REGISTER=0 torchrun --nproc-per-node 2 \
    benchmarks/probes/s22_tsp_graph_probe.py --layout tsp=2 --seq 4096 --out "$OUT/graph-check-dense-7b-tsp_2-4096.json"

#!/usr/bin/env bash
# Session 21 on two GPUs: steps with collectives replayed as CUDA graphs (meshplan.executor.graphs) —
# packed documents on sequence shards (issue #34's sp=2 / tsp=2 / tpssm=2 rows, graphed by default now)
# and the dense tp=2 peers case (meshplan graphed and eager beside DTensor TP compiled).
# From the repository root on a 2-GPU machine, results under $OUT:   bash benchmarks/sweeps/s21-two-gpu.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z' | sed 's/nvidia//; s/80gbhbm3//; s/141gbhbm3e//; s/hbm3e//; s/nvl//')
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'Warning' -e 'return func' -e '_warn_once'; echo "[$(( SECONDS - s )) s] $*"; }
mkdir -p "$OUT/packed" && t bash benchmarks/packed_docs_run.sh "$OUT/packed"
t torchrun --nproc-per-node 2 benchmarks/peers.py --peers dtensor-tp-compile --out "$OUT/peers-${gpu}x2-tp-graph.json"

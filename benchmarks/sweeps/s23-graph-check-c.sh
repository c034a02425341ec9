#!/usr/bin/env bash
# Session 23, two GPUs: the Mamba-2 graph-vs-eager probe again after the state passings were cut into segments
# (the probe trains at 2,048 tokens: 32 chunks, 12 heads a rank under tpssm=2, so both directions are cut).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
for layout in tpssm=2 sp=2; do
  timeout 100 torchrun --nproc-per-node 2 benchmarks/probes/s22_tsp_graph_probe.py --model mamba2-130m \
      --layout $layout --seq 16384 --out "$OUT/graph-check-mamba2-130m-${layout/=/_}-segmented.json" 2>&1 | grep -E "eager|graph|check"
done

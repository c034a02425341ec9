#!/usr/bin/env bash
# Session 23, two GPUs: the Mamba-2 probe with how far training moved the weights, and whole-model dense
# TSP captured (s23-graph-execute.sh ran past the call limit after Mamba-2 tsp=2 hung, whole model, packed documents)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
for layout in tsp=2 tpssm=2; do
  timeout 100 torchrun --nproc-per-node 2 benchmarks/probes/s22_tsp_graph_probe.py --model mamba2-130m \
      --layout $layout --seq 16384 --out "$OUT/graph-check-mamba2-130m-${layout/=/_}-16384-moved.json" 2>&1 | grep -E "eager|graph|check"
done
python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq 4096 --device cuda --nproc 2 \
    --out "$OUT/execute-dense-7b-tsp2-4096.json" --compare --timeout 90 2>&1 | tail -5
python -m meshplan execute --model dense-7b --layers 2 --layout tp=2 --seq 4096 --device cuda --nproc 2 \
    --out "$OUT/execute-dense-7b-tp2-4096.json" --compare --timeout 90 2>&1 | tail -3

#!/usr/bin/env bash
# Session 23, two GPUs: the Mamba-2 probe with how far training moved the weights, and whole-model dense
# TSP captured (s23-graph-execute.sh ran past the call limit after Mamba-2 tsp=2 hung, whole model, packed documents).
#   bash benchmarks/sweeps/s23-graph-check-b.sh             # graph-check-*-moved.json, execute-dense-7b-*-4096.json
#   bash benchmarks/sweeps/s23-graph-check-b.sh segmented   # the probe again once the state passings were cut into
#     segments (2,048 tokens: tpssm=2's 12 heads cut both directions, sp=2's 24 the forward): *-segmented.json
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
probe() {  # layout suffix
  timeout 100 torchrun --nproc-per-node 2 benchmarks/probes/s22_tsp_graph_probe.py --model mamba2-130m \
      --layout "$1" --seq 16384 --out "$OUT/graph-check-mamba2-130m-${1/=/_}-$2.json" 2>&1 | grep -E "eager|graph|check"
}
if [ "${1:-}" = segmented ]; then
  probe tpssm=2 segmented
  probe sp=2 segmented
  exit 0
fi
probe tsp=2 16384-moved
probe tpssm=2 16384-moved
python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq 4096 --device cuda --nproc 2 \
    --out "$OUT/execute-dense-7b-tsp2-4096.json" --compare --timeout 90 2>&1 | tail -5
python -m meshplan execute --model dense-7b --layers 2 --layout tp=2 --seq 4096 --device cuda --nproc 2 \
    --out "$OUT/execute-dense-7b-tp2-4096.json" --compare --timeout 90 2>&1 | tail -3

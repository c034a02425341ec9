#!/usr/bin/env bash
# Session 24, 2 GPUs: whole-model TSP steps captured as CUDA graphs as a user runs them (`meshplan execute`,
# which now turns NCCL's graph buffer registration off for TSP: meshplan/executor/graphs.py ring_env), against
# the eager step, and the graph's numerics against eager training (the session-22 probe, with the allocator's
# expandable segments on as execute has them).
#   bash benchmarks/sweeps/s24-tsp-execute-graph.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s24-tsp-execute}
mkdir -p "$OUT"
t() { local s=$SECONDS; timeout -k 5 ${LIMIT:-150} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | tail -${TAIL:-8}; echo "[$(( SECONDS - s )) s] $*"; }
for seq in 4096 16384; do
  t python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq $seq --device cuda --nproc 2 \
      --out "$OUT/execute-dense-7b-tsp2-$seq-graph.json" --compare --timeout 120
  t python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq $seq --device cuda --nproc 2 \
      --out "$OUT/execute-dense-7b-tsp2-$seq-eager.json" --compare --timeout 120 --no-cuda-graph
done
docs=$(mktemp --suffix .npz)
python benchmarks/packed_docs.py "$docs"
t python -m meshplan execute --model mamba2-130m --layout tsp=2 --seq 16384 --device cuda --nproc 2 \
    --tokens "$docs" --out "$OUT/packed-tsp2-graph.json" --compare --timeout 120
t env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NCCL_GRAPH_REGISTER=0 torchrun --nproc-per-node 2 \
    benchmarks/probes/s22_tsp_graph_probe.py --layout tsp=2 --seq 4096 --out "$OUT/graph-check-dense-7b-tsp_2-4096.json"

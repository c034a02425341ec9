#!/usr/bin/env bash
# Session 23 on two GPUs: the packed-documents rows (mamba2-130m, 16K, 6 documents) after the state passings
# cut few-head rows into segments (meshplan.kernels.launch: 24 heads the forward's, 12 heads both directions),
# against the same rows the same day before it (benchmarks/results/s23-h200x2-graphs/execute/).
#   bash benchmarks/sweeps/s23-segments-execute.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
docs=$(mktemp --suffix .npz)
python benchmarks/packed_docs.py "$docs"
for layout in tpssm=2 single sp=2 tsp=2; do
  nproc=$([ "$layout" = single ] && echo 1 || echo 2)
  python -m meshplan execute --model mamba2-130m --layout "$layout" --seq 16384 --device cuda --nproc "$nproc" \
    --tokens "$docs" --out "$OUT/packed-${layout/=/}-segments.json" --compare --timeout 150 2>&1 | grep -E "step time|peak|error" | head -4
done

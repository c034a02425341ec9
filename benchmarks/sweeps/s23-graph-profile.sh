#!/usr/bin/env bash
# Session 23 on two GPUs: where the graphed small-model steps' time goes (mamba2-130m packed documents, 16K,
# 6 documents: one GPU, sp=2, tpssm=2 graphed ran +12%, +63%, +50% over prediction), one profiled step each
# (kernels by category, the top 25, the timeline's idle), to set against the model's item list.
#   bash benchmarks/sweeps/s23-graph-profile.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
docs=$(mktemp --suffix .npz)
python benchmarks/packed_docs.py "$docs"
for layout in tpssm=2 sp=2 single; do
  nproc=$([ "$layout" = single ] && echo 1 || echo 2)
  python -m meshplan execute --model mamba2-130m --layout "$layout" --seq 16384 --device cuda --nproc "$nproc" \
    --tokens "$docs" --out "$OUT/packed-${layout/=/}-profile.json" --compare --timeout 150 --profile 2>&1 | tail -3
done

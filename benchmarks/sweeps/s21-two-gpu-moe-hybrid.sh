#!/usr/bin/env bash
# Session 21 on two GPUs, after issue #32's expert tensor parallelism and Zamba2 hybrids in the executor: each
# beside its prediction (`meshplan execute … --compare`). Mixtral-8x7B's first 2 layers on random hidden states
# with its experts split by etp over the tensor ranks (tp=2: etp=2 by default) and over the data-parallel ranks
# (dp=2,etp=2: the copies gathered and reduce-scattered over etp); Zamba2-7B's first 6 layers (5 Mamba-2, one
# hybrid invoking a shared block), the whole model, on one GPU, tp=2 and sp=2.
# From the repository root on a 2-GPU machine, results under $OUT:   bash benchmarks/sweeps/s21-two-gpu-moe-hybrid.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
t() { local s=$SECONDS; timeout 150 "$@" 2>&1 | grep -e "bytes" -e "peak" -e "step time" -e "rror" -e "note:" | cut -c1-160; echo "[$(( SECONDS - s )) s] $*"; }
for lay in tp=2 dp=2,etp=2; do
  t python -m meshplan execute --model mixtral-8x7b --layers 2 --layers-only --layout "$lay" --seq 4096 --device cuda \
    --nproc 2 --out "$OUT/moe-mixtral-2L-${lay//[=,]/}.json" --compare
done
for lay in single tp=2 sp=2; do
  n=$([ "$lay" = single ] && echo 1 || echo 2)
  t python -m meshplan execute --model zamba2-7b --layers 6 --layout "$lay" --seq 4096 --device cuda --nproc "$n" \
    --out "$OUT/zamba2-7b-6L-${lay//[=,]/}.json" --compare
done

#!/usr/bin/env bash
# Mamba-2 on 2 H200s with the current scan (bf16 operands and state buffers): the grid at degrees 1 and
# 2 (training, prefill, decode) and long-context training 128K-1M. Run from the repository root;
# results under $OUT:   bash benchmarks/sweeps/h200x2-mamba2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD

t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
t torchrun --nproc-per-node 2 benchmarks/gpu_validation.py --family mamba2 --out "$OUT/validation-x2-mamba2.json"
t torchrun --nproc-per-node 2 benchmarks/gpu_validation.py --family mamba2 --modes train \
    --seqs 131072,524288,1048576 --steps 1 --warmup 1 --no-exposed --only "single;tpssm=2;sp=2" \
    --out "$OUT/validation-x2-mamba2-long.json"

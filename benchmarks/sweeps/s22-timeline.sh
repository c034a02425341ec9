#!/usr/bin/env bash
# Session 22 on two GPUs: one profiled step a layout with its timeline (executor/profiling.timeline: the
# GPU idle inside the step, communication beside no compute), where the model's step misses — dense and
# Mamba-2 sequence and tensor shards at 16K, a mixture of experts under ep.
#   bash benchmarks/sweeps/s22-timeline.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z' | sed 's/nvidia//; s/80gbhbm3//; s/141gbhbm3e//; s/hbm3e//')
cluster=$([ "${gpu#h100}" != "$gpu" ] && echo h100-sxm-8 || echo h200-8)
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' -e '^ *[0-9.]* ms  '; echo "[$(( SECONDS - s )) s] $*"; }
v() { t timeout 200 torchrun --nproc-per-node 2 benchmarks/gpu_validation.py --cluster "$cluster" --profile 8 --no-exposed "$@"; }
v --family dense --only "single;tp=2;sp=2;tsp=2" --seqs 16384 --out "$OUT/timeline-dense16k-${gpu}x2.json"
v --family mamba2 --only "single;tpssm=2;sp=2;tsp=2" --seqs 16384 --out "$OUT/timeline-mamba2-16k-${gpu}x2.json"
v --family moe --only "single;dp=2,ep=2" --out "$OUT/timeline-moe-${gpu}x2.json"

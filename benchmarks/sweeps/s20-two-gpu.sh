#!/usr/bin/env bash
# Session 20 on two GPUs, after the executor's one-pass Adam, SwiGLU and rotary kernels: the kernel
# benchmark and step profile on this GPU kind, the mixtures of experts (issue #32) and the dense grid's
# training rows beside their predictions, packed documents on sequence shards, and peers' tp=2 case.
# From the repository root on a 2-GPU machine, results under $OUT:   bash benchmarks/sweeps/s20-two-gpu.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z' | sed 's/nvidia//; s/80gbhbm3//; s/hbm3e//; s/nvl//')
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'Warning' -e 'return func' -e '_warn_once'; echo "[$(( SECONDS - s )) s] $*"; }
t python benchmarks/bench_adam.py --out "$OUT/adam-$gpu.json"
t python benchmarks/profile_step.py --out "$OUT/profile-step-$gpu-fused.json"
t torchrun --nproc-per-node 2 benchmarks/gpu_validation.py --family moe --cluster h200-8 --out "$OUT/validation-moe-${gpu}x2-s20.json"
t torchrun --nproc-per-node 2 benchmarks/gpu_validation.py --family dense --cluster h200-8 --seqs 4096,16384 --modes train \
    --out "$OUT/validation-dense-${gpu}x2-s20.json"
mkdir -p "$OUT/packed" && t bash benchmarks/packed_docs_run.sh "$OUT/packed"
t torchrun --nproc-per-node 2 benchmarks/peers.py --peers dtensor-tp dtensor-tp-compile --out "$OUT/peers-${gpu}x2-tp.json"

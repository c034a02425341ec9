#!/usr/bin/env bash
# The validation grid at degrees 1 and 2 with today's kernels, each run profiled (kernels launched a
# step, by category) and its host time taken (seconds to issue a step); the int8 all-reduce on 2 GPUs
# (its merged dequantize-sum kernel). Run from the repository root on 2 x H200; results under $OUT:
#   bash benchmarks/sweeps/h200x2-profiled.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD

t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'Warning' -e 'return func' \
    -e '_warn_once'; echo "[$(( SECONDS - s )) s] $*"; }
t torchrun --nproc-per-node 2 benchmarks/gpu_validation.py --profile 3 --out "$OUT/validation-x2.json"
t torchrun --nproc-per-node 2 benchmarks/bench_quant_allreduce.py --out "$OUT/quant-allreduce-x2.json"

#!/usr/bin/env bash
# Session 22 on two GPUs: `meshplan execute --compare` as a user runs it, one process group a run, so each
# run's outside_allocator_bytes is its own plan's (the CUDA context and its communicators, against
# costmodel/runtime.py), whole models (embedding, LM head and loss) at 2 layers.
#   bash benchmarks/sweeps/s22-two-gpu.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z' | sed 's/nvidia//; s/80gbhbm3//; s/141gbhbm3e//; s/hbm3e//')
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
run() {  # model layout [processes]
  t python -m meshplan.cli execute --model "$1" --layers 2 --layout "$2" --seq 4096 --nproc "${3:-2}" --device cuda \
      --out "$OUT/execute-$1-${2//[=,]/_}-${gpu}.json" --compare --timeout 240
}
run dense-7b single 1
run dense-7b tp=2
run dense-7b pp=2
run dense-7b tsp=2
run mixtral-8x7b dp=2,ep=2
run qwen3-30b-a3b dp=2,zero=1

#!/usr/bin/env bash
# Session 22 on four GPUs (nvidia-h100-x4, or the H200s it may give): what a rank holds outside the
# caching allocator (benchmarks/probe_runtime_memory.py: the CUDA context, NCCL's buffers by group size
# and use — meshplan/costmodel/runtime.py's figures), then the validation grid with the training step
# graphed where it can be (the executor now records its peak reserved and outside-allocator bytes),
# dense + Mamba-2 at degrees 1/2/4 and the MoE models at ep = 2 and 4.
# Part b: `meshplan calibrate` on the same kind of machine after sessions 20-21's kernels, the Mamba-2
# grid at 16K that part a's time limit cut off, and the MoE layouts profiled once (kernels a step: the
# executor's launch floor for expert blocks).
#   bash benchmarks/sweeps/s22-four-gpu.sh      bash benchmarks/sweeps/s22-four-gpu.sh b
set -u
part=${1:-a}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z' | sed 's/nvidia//; s/80gbhbm3//; s/141gbhbm3e//; s/hbm3e//')
cluster=$([ "${gpu#h100}" != "$gpu" ] && echo h100-sxm-8 || echo h200-8)
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
nvidia-smi topo -m > "$OUT/topology-$gpu.txt" 2>&1
if [ "$part" = b ]; then
  t python -m meshplan.cli calibrate --nproc 4 --quick --out "$OUT/${gpu}-4gpu.toml"
  t timeout 200 torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --family moe --cluster "$cluster" \
      --only "single;dp=2,ep=2;dp=4,ep=4;dp=2,tp=2,ep=2" --profile 3 --no-exposed --out "$OUT/profile-moe-${gpu}x4-s22.json"
  t timeout 270 torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --family mamba2 --cluster "$cluster" \
      --seqs 16384 --out "$OUT/validation-mamba2-${gpu}x4-s22.json"
  exit 0
fi
t python benchmarks/probe_runtime_memory.py --out "$OUT/runtime-memory-${gpu}x4.json"
t timeout 300 torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --cluster "$cluster" \
    --out "$OUT/validation-${gpu}x4-s22.json"
t timeout 150 torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --family moe --cluster "$cluster" \
    --out "$OUT/validation-moe-${gpu}x4-s22.json"

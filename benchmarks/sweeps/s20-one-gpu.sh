#!/usr/bin/env bash
# Session 20 on one GPU, after the executor's one-pass Adam, SwiGLU and rotary kernels: their benchmarks
# against the torch paths they replace, the step profiles that set the eager elementwise factors
# (meshplan/costmodel/device.py), and, as stage "peers", benchmarks/peers.py with mamba_ssm's Triton
# kernels vendored (python benchmarks/vendor_mamba_ssm.py; carry benchmarks/third_party).
#   bash benchmarks/sweeps/s20-one-gpu.sh kernels     bash benchmarks/sweeps/s20-one-gpu.sh peers
set -u
export PYTHONPATH=$PWD
stage=${1:?kernels or peers}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z' | sed 's/nvidia//; s/80gbhbm3//; s/141gbhbm3e//; s/hbm3e//')
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
if [ "$stage" = kernels ]; then
  t python benchmarks/bench_adam.py --tune --out "$OUT/adam-$gpu.json"
  t python benchmarks/bench_elementwise.py --out "$OUT/elementwise-$gpu.json"
  t python benchmarks/profile_step.py --out "$OUT/profile-step-$gpu-fused.json"
  t python benchmarks/profile_step.py --model mamba2-2.7b --out "$OUT/profile-step-mamba2-$gpu-fused.json"
else
  t torchrun --nproc-per-node 1 benchmarks/peers.py --out "$OUT/peers-$gpu.json"
fi

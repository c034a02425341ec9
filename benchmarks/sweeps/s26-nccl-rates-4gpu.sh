#!/usr/bin/env bash
# Session 26, 4 GPUs: NCCL's collective rates over four GPUs of one host under its default tuning
# (benchmarks/probes/s26_nccl_rates.py), and `meshplan calibrate --nproc 4 --quick` with the all-gather as the
# executor runs it (groups of 2 and 4).
#   bash benchmarks/sweeps/s26-nccl-rates-4gpu.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s26-nccl-rates-4gpu}
mkdir -p "$OUT"
torchrun --nproc-per-node 4 benchmarks/probes/s26_nccl_rates.py --out "$OUT/nccl-rates-4gpu-default.json" --label default \
    2>&1 | grep -v -e '^W1' -e OMP_NUM -e Warning -e 'return func'
timeout 400 python -m meshplan calibrate --nproc 4 --quick --out "$OUT/calibration-s26-h200-4gpu.toml" 2>&1 | tail -2

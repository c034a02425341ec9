#!/usr/bin/env bash
# Session 25 on one H100: benchmarks/peers.py with the scan case timed as CUDA-graph replays on both sides, the graphed
# mamba_ssm block and torch.compile's reduce-overhead mode as peers (mamba_ssm vendored by
# python benchmarks/vendor_mamba_ssm.py; carry benchmarks/third_party).
#   bash benchmarks/sweeps/s25-one-gpu.sh
# (The probe benchmarks/probes/s25_scan_gpu_time.py and bench_ssd.py ran in a call of their own before it:
#  their commands are in benchmarks/results/s25-h100-scan/*.json.)
set -u
export PYTHONPATH=$PWD
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'warn' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
t timeout 540 torchrun --nproc-per-node 1 benchmarks/peers.py --out "$OUT/peers-h100.json"

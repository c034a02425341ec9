#!/usr/bin/env bash
# Session 21 on one GPU: the executor's training step replayed as a CUDA graph (meshplan.executor.graphs) —
# the probe that checks it computes what the eager step does and times both, then benchmarks/peers.py
# (meshplan's step as `meshplan execute` runs it: graphed on one GPU), mamba_ssm vendored
# (python benchmarks/vendor_mamba_ssm.py; carry benchmarks/third_party).
#   bash benchmarks/sweeps/s21-one-gpu.sh
set -u
export PYTHONPATH=$PWD
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z' | sed 's/nvidia//; s/80gbhbm3//; s/141gbhbm3e//; s/hbm3e//')
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
t python benchmarks/probes/s21_graph_probe.py --out "$OUT/graph-probe-$gpu.json"
t torchrun --nproc-per-node 1 benchmarks/peers.py --out "$OUT/peers-$gpu.json"

#!/usr/bin/env bash
# Session 26, 4 GPUs, part c: does turning NCCL's graph registration off (what lets tp=2,sp=2 replay; s26-four-gpu-b.sh)
# cost the layouts that replay with it on? tp=4 and sp=4 at 16K with NCCL_GRAPH_REGISTER=0, against part b's runs.
#   bash benchmarks/sweeps/s26-four-gpu-c.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD NCCL_GRAPH_REGISTER=0
OUT=${OUT:-/tmp/s26-four-gpu-c}
mkdir -p "$OUT"
for layout in tp=4 sp=4; do
  timeout -k 5 100 python -m meshplan execute --model dense-7b --layers 2 --device cuda --nproc 4 --compare --timeout 90 \
      --layout $layout --seq 16384 --out "$OUT/execute-dense-7b-${layout//[=,]/}-16384-noregister.json" 2>&1 | grep -e "step time"
  pkill -9 -f meshplan.executor.worker; sleep 2
done

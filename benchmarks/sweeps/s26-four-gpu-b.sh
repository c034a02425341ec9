#!/usr/bin/env bash
# Session 26, 4 GPUs, part b: s26-four-gpu.sh's tp=2,sp=2 run at 4K hung (stopped at 110 s) and its orphaned workers
# slowed every later run. Here every run is followed by killing what is left of its workers (the GPUs' compute
# processes counted before and after); tp=2,sp=2 at 4K as before, with NCCL's graph registration off, and not
# graphed; then the 16K rows again.
#   bash benchmarks/sweeps/s26-four-gpu-b.sh [missing]
# ("missing": only the runs a first call of this script skipped — it passed a shell function to timeout, so the
# runs started through "run" never ran; the three started through env did.)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s26-four-gpu-b}
mkdir -p "$OUT"
apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l; }
t() {
  local s=$SECONDS
  echo "[gpu processes before: $(apps)]"
  timeout -k 5 ${LIMIT:-100} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | grep -e "step time" -e "exposed" -e "error" -e "Error"
  echo "[$(( SECONDS - s )) s] $*"
  pkill -9 -f meshplan.executor.worker; pkill -9 -f torchrun; sleep 3
  echo "[gpu processes after cleanup: $(apps)]"
}
run=(python -m meshplan execute --model dense-7b --layers 2 --device cuda --nproc 4 --compare --timeout 90)
LIMIT=95 t "${run[@]}" --layout tp=2,sp=2 --seq 4096 --out "$OUT/execute-dense-7b-tp2sp2-4096-default.json"
[ "${1:-all}" = missing ] || t env NCCL_GRAPH_REGISTER=0 python -m meshplan execute --model dense-7b --layers 2 --device cuda --nproc 4 --compare \
    --timeout 90 --layout tp=2,sp=2 --seq 4096 --out "$OUT/execute-dense-7b-tp2sp2-4096-noregister.json"
t "${run[@]}" --layout tp=2,sp=2 --seq 4096 --no-cuda-graph --out "$OUT/execute-dense-7b-tp2sp2-4096-eager.json"
for layout in tp=4 tsp=4 sp=4; do
  t "${run[@]}" --layout $layout --seq 16384 --out "$OUT/execute-dense-7b-${layout//[=,]/}-16384.json"
done
[ "${1:-all}" = missing ] || t env NCCL_GRAPH_REGISTER=0 python -m meshplan execute --model dense-7b --layers 2 --device cuda --nproc 4 --compare \
    --timeout 90 --layout tp=2,sp=2 --seq 16384 --out "$OUT/execute-dense-7b-tp2sp2-16384-noregister.json"
[ "${1:-all}" = missing ] || t python -m meshplan execute --model mamba2-2.7b --layers 2 --layout tsp=4 --seq 16384 --device cuda --nproc 4 \
    --compare --timeout 90 --out "$OUT/execute-mamba2-2.7b-tsp4-16384.json"

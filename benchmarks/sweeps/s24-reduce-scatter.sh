#!/usr/bin/env bash
# Session 24, 2 GPUs: NCCL reduce-scatter's list form against its tensor form (the probe), then the layouts
# whose backward reduce-scatters whole rows — dense TSP (weight gradients, dK/dV) and SP (the K/V gather's
# backward) — executed as a user runs them, after comm.reduce_scatter moved to the tensor form.
#   bash benchmarks/sweeps/s24-reduce-scatter.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s24-reduce-scatter}
mkdir -p "$OUT"
t() { local s=$SECONDS; timeout -k 5 ${LIMIT:-150} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | tail -${TAIL:-8}; echo "[$(( SECONDS - s )) s] $*"; }
t torchrun --nproc-per-node 2 benchmarks/probes/s24_reduce_scatter_forms.py --out "$OUT/reduce-scatter-forms.json"
for run in "tsp=2 4096" "tsp=2 16384" "sp=2 16384"; do
  set -- $run
  t python -m meshplan execute --model dense-7b --layers 2 --layout "$1" --seq "$2" --device cuda --nproc 2 \
      --out "$OUT/execute-dense-7b-${1/=/}-$2.json" --compare --timeout 120
done
docs=$(mktemp --suffix .npz)
python benchmarks/packed_docs.py "$docs"
t python -m meshplan execute --model mamba2-130m --layout tsp=2 --seq 16384 --device cuda --nproc 2 \
    --tokens "$docs" --out "$OUT/packed-tsp2.json" --compare --timeout 120

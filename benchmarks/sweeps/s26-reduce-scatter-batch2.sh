#!/usr/bin/env bash
# Session 26, 2 GPUs: TSP at batch 2, where a batch's rows put each rank's chunk of K/V gradients in pieces.
# comm.reduce_scatter as committed (one rank-major copy, NCCL's tensor form) against the list form before it
# (benchmarks/sweeps/s26/reduce-scatter-tensor-form.patch applied in reverse: comm.py at 0909c10~1, each chunk
# copied contiguous, then c10d's own copy into a flat buffer), interleaved, two rounds; every run against the
# model's prediction.
#   bash benchmarks/sweeps/s26-reduce-scatter-batch2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s26-reduce-scatter-batch2}
mkdir -p "$OUT"
P=benchmarks/sweeps/s26/reduce-scatter-tensor-form.patch
command -v patch >/dev/null || { echo "no patch(1) here"; exit 1; }
t() { local s=$SECONDS; timeout -k 5 ${LIMIT:-150} "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | grep -e "step time" -e "peak memory" -e "exposed"; echo "[$(( SECONDS - s )) s] $*"; }
for round in 1 2; do
  for form in tensor list; do
    if [ $form = list ]; then patch -s -R -p1 < $P; fi
    t python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq 4096 --batch 2 --device cuda --nproc 2 \
        --out "$OUT/execute-dense-7b-tsp2-4096-b2-$form-r$round.json" --compare --timeout 120
    if [ $form = list ]; then patch -s -p1 < $P; fi
  done
done

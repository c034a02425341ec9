#!/usr/bin/env bash
# Session 23 on two GPUs: the steps graphs.limits refused by measurement in session 21 (TSP; Mamba-2 under a
# tensor axis), captured again as a user runs them (`meshplan execute --compare`, whole models), now that the
# probe (s23-graph-check.sh) found their replays agree with eager runs: the packed-documents rows of issue #34
# (mamba2-130m, 16K tokens, 6 documents: benchmarks/packed_docs_run.sh's data) and dense TSP at 2 layers.
#   bash benchmarks/sweeps/s23-graph-execute.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func' | tail -6; echo "[$(( SECONDS - s )) s] $*"; }
docs=$(mktemp --suffix .npz)
python benchmarks/packed_docs.py "$docs"
for layout in tsp=2 tpssm=2 sp=2 single; do
  nproc=$([ "$layout" = single ] && echo 1 || echo 2)
  t python -m meshplan execute --model mamba2-130m --layout "$layout" --seq 16384 --device cuda --nproc "$nproc" \
    --tokens "$docs" --out "$OUT/packed-${layout/=/}.json" --compare --timeout 240
done
t python -m meshplan execute --model mamba2-130m --layout tsp=2 --seq 16384 --device cuda --nproc 2 \
    --tokens "$docs" --out "$OUT/packed-tsp2-eager.json" --compare --timeout 240 --no-cuda-graph
for seq in 4096 16384; do
  t python -m meshplan execute --model dense-7b --layers 2 --layout tsp=2 --seq $seq --device cuda --nproc 2 \
    --out "$OUT/execute-dense-7b-tsp2-$seq.json" --compare --timeout 240
done
# the probe again on Mamba-2 with how far 3 steps move the weights (its first run read 0 for both differences)
for layout in tsp=2 tpssm=2; do
  t timeout 150 torchrun --nproc-per-node 2 benchmarks/probes/s22_tsp_graph_probe.py --model mamba2-130m \
      --layout $layout --seq 16384 --out "$OUT/graph-check-mamba2-130m-${layout/=/_}-16384-moved.json"
done

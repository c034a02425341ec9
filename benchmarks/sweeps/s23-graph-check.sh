#!/usr/bin/env bash
# Session 23 on two GPUs: the graph-vs-eager check again now that run._graphed puts Adam's bias corrections
# on the device (session 22's probe captured them as host constants), on the layouts graphed by default and
# on the ones refused by measurement (dense TSP, Mamba-2 TSP and TP-SSM), each under a timeout (a hang is an answer).
#   bash benchmarks/sweeps/s23-graph-check.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
probe() {  # model layout seq
  t timeout 150 torchrun --nproc-per-node 2 benchmarks/probes/s22_tsp_graph_probe.py --model "$1" --layout "$2" \
      --seq "$3" --out "$OUT/graph-check-$1-${2//[=,]/_}-$3.json"
}
probe dense-7b tp=2 4096
probe dense-7b sp=2 4096
probe dense-7b tsp=2 4096
probe dense-7b tsp=2 16384
probe mamba2-130m tsp=2 16384
probe mamba2-130m tpssm=2 16384

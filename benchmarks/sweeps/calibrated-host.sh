#!/usr/bin/env bash
# A calibrated profile (with the host's time per launched kernel) and, on the same machine, the
# Mamba-2 and dense grids at 4K and 16K tokens, to predict with that profile afterwards
# (python benchmarks/compare_validation.py RUN.json --cluster PROFILE.toml). Run from the repository
# root on an N-GPU machine (N = 2 or 4); results under $OUT:   bash benchmarks/sweeps/calibrated-host.sh 2
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
n=${1:?GPUs: 2 or 4}
only=${2:-}  # "calibrate": the profile twice (how much the host probes move), no grids

t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
t python -m meshplan.cli calibrate --nproc "$n" --quick --out "$OUT/h200-${n}gpu-host.toml"
grep -e host -e '^#' "$OUT/h200-${n}gpu-host.toml"
if [ "$only" = calibrate ]; then
  t python -m meshplan.cli calibrate --nproc "$n" --quick --out "$OUT/h200-${n}gpu-host-again.toml"
  grep -e host -e '^#' "$OUT/h200-${n}gpu-host-again.toml"
  exit 0
fi
if [ "$n" = 4 ]; then
  m2="single;tpssm=2;tpssm=4;sp=2;sp=4"; dense="single;tp=2;tp=4;sp=4;tsp=4;tp=2,sp=2"
else
  m2="single;tpssm=2;sp=2"; dense="single;tp=2;sp=2;tsp=2"
fi
t torchrun --nproc-per-node "$n" benchmarks/gpu_validation.py --family mamba2 --only "$m2" --modes train \
    --seqs 4096,16384 --out "$OUT/validation-x$n-mamba2.json"
t torchrun --nproc-per-node "$n" benchmarks/gpu_validation.py --family dense --only "$dense" --modes train,prefill \
    --seqs 4096,16384 --prefill-seqs 16384 --out "$OUT/validation-x$n-dense.json"

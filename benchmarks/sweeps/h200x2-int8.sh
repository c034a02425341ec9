#!/usr/bin/env bash
# The two-rank int8 all-reduce (one all-gather of the int8 tensors, then dequantize-sum) on 2 H200s,
# over NVLink and through host memory (NCCL_P2P_DISABLE=1), and TP-SSM 2 with it against the model.
# Run from the repository root; results under $OUT:   bash benchmarks/sweeps/h200x2-int8.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD

t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
t torchrun --nproc-per-node 2 benchmarks/bench_quant_allreduce.py --out "$OUT/quant-allreduce-x2.json"
t env NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 2 benchmarks/bench_quant_allreduce.py \
    --out "$OUT/quant-allreduce-x2-host-memory.json"
t torchrun --nproc-per-node 2 benchmarks/gpu_validation.py --family mamba2 --only "single;tpssm=2" \
    --modes train,prefill --seqs 16384 --int8-allreduce --out "$OUT/validation-x2-tpssm-int8.json"

#!/usr/bin/env bash
# The 8-GPU int8 sweep (run from the repository root on an 8 x H200 machine; results under $OUT):
#   bash benchmarks/sweeps/h200x8.sh
# int8 against bf16 all-reduce on 8 GPUs (both int8 paths: over NCCL collectives and over peer-mapped
# memory), over NVLink and through host memory; TP-SSM 2/4/8 with and without int8.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD

t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*' -e 'Warning' -e 'return func'; echo "[$(( SECONDS - s )) s] $*"; }
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
t torchrun --nproc-per-node 8 benchmarks/bench_quant_allreduce.py --out "$OUT/quant-allreduce-x8.json"
t env NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 8 benchmarks/bench_quant_allreduce.py \
    --out "$OUT/quant-allreduce-x8-host-memory.json"
for q in "" --int8-allreduce; do
  t torchrun --nproc-per-node 8 benchmarks/gpu_validation.py --family mamba2 --only "single;tpssm=2;tpssm=4;tpssm=8" \
      --modes train,prefill --seqs 16384 --prefill-seqs 16384 $q --out "$OUT/validation-x8-tpssm${q:+-int8}.json"
done

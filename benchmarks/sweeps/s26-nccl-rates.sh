#!/usr/bin/env bash
# Session 26, 2 GPUs: NCCL's collective rates between two GPUs of one host under its default tuning and with each
# protocol forced (benchmarks/probes/s26_nccl_rates.py); NCCL's own pick of algorithm and protocol logged
# (NCCL_DEBUG_SUBSYS=TUNING); `meshplan calibrate --quick` with the all-gather as the executor runs it; the
# dense tsp=2 4K step under the default and the fastest forced protocol.
#   bash benchmarks/sweeps/s26-nccl-rates.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/s26-nccl-rates}
mkdir -p "$OUT"
p() { torchrun --nproc-per-node 2 benchmarks/probes/s26_nccl_rates.py "$@" 2>&1 | grep -v -e '^W1' -e OMP_NUM -e Warning; }
p --out "$OUT/nccl-rates-default.json" --label default
for proto in Simple LL128 LL; do NCCL_PROTO=$proto p --out "$OUT/nccl-rates-$proto.json" --label $proto; done
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING torchrun --nproc-per-node 2 benchmarks/probes/s26_nccl_rates.py \
    --out "$OUT/nccl-rates-tuning.json" --label tuning --reps 2 > "$OUT/nccl-tuning.log" 2>&1
grep -i -E "algo|proto" "$OUT/nccl-tuning.log" | grep -v "^W1" | sort | uniq -c | sort -rn | head -60 > "$OUT/nccl-tuning-picks.txt"
rm -f "$OUT/nccl-tuning.log"
timeout 400 python -m meshplan calibrate --nproc 2 --quick --out "$OUT/calibration-s26-h200-2gpu.toml" 2>&1 | tail -3

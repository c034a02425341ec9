#!/usr/bin/env bash
# Kernel work on one H200 (run from the repository root; results under $OUT):
#   bash benchmarks/sweeps/h200-kernels.sh a   # conv1d bench, SSD bench with per-kernel bandwidth, forward tune, Mamba-2 steps
#   bash benchmarks/sweeps/h200-kernels.sh b   # SSD backward on bf16 operands: tune, bench, Mamba-2 steps and memory peaks
#   bash benchmarks/sweeps/h200-kernels.sh c   # SSD with the output kernel's head loop: bench, step profile, Mamba-2 grid, packing
#   bash benchmarks/sweeps/h200-kernels.sh d   # conv1d four rows a step, SSD grid order: both benches, Mamba-2 steps, packing
#   bash benchmarks/sweeps/h200-kernels.sh e   # SSD state passings in segments against whole rows (sets
#                                              # launch.PASS_PROGRAM_TARGET and ssd_bwd.SEGMENT_BACKWARD), then the SSD bench
set -u
export PYTHONPATH=$PWD
part=${1:?a, b, c, d or e}

t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*'; echo "[$(( SECONDS - s )) s] $*"; }
if [ "$part" = a ]; then
  t python benchmarks/bench_conv1d.py --out "$OUT/conv1d.json"
  t python benchmarks/bench_ssd.py --tune-forward --out "$OUT/ssd-fwd-tune.json"
  t python benchmarks/bench_ssd.py --out "$OUT/ssd.json"
  t torchrun --nproc-per-node 1 benchmarks/gpu_validation.py --family mamba2 --only single --modes train,prefill \
      --seqs 16384 --out "$OUT/validation-x1-mamba2.json"
fi
if [ "$part" = b ]; then
  t python benchmarks/bench_ssd.py --tune --out "$OUT/ssd-bwd-tune.json"
  t python benchmarks/bench_ssd.py --out "$OUT/ssd.json"
  t torchrun --nproc-per-node 1 benchmarks/gpu_validation.py --family mamba2 --only single --modes train,prefill \
      --seqs 16384 --out "$OUT/validation-x1-mamba2.json"
  t torchrun --nproc-per-node 1 benchmarks/memory_peak.py --model mamba2-2.7b --mode train --layouts single \
      --seq 16384 --out "$OUT/memory-peak-mamba2-train.json"
fi
if [ "$part" = c ]; then
  t python benchmarks/bench_ssd.py --out "$OUT/ssd.json"
  t python benchmarks/profile_step.py --model mamba2-2.7b --out "$OUT/profile-mamba2.json"
  t torchrun --nproc-per-node 1 benchmarks/gpu_validation.py --family mamba2 --only single \
      --out "$OUT/validation-x1-mamba2.json"
  t torchrun --nproc-per-node 1 benchmarks/memory_peak.py --model mamba2-2.7b --mode prefill --layouts single \
      --seq 16384 --out "$OUT/memory-peak-mamba2-prefill.json"
  t python benchmarks/bench_packing.py --out "$OUT/packing.json"
fi
if [ "$part" = d ]; then
  t python benchmarks/bench_conv1d.py --march --out "$OUT/conv1d.json"
  t python benchmarks/bench_ssd.py --out "$OUT/ssd.json"
  t torchrun --nproc-per-node 1 benchmarks/gpu_validation.py --family mamba2 --only single --modes train,prefill \
      --seqs 16384 --out "$OUT/validation-x1-mamba2.json"
  t python benchmarks/profile_step.py --model mamba2-2.7b --out "$OUT/profile-mamba2.json"
  t python benchmarks/bench_packing.py --out "$OUT/packing.json"
fi
if [ "$part" = e ]; then
  t python benchmarks/bench_ssd.py --segments --out "$OUT/ssd-segments.json"
  t python benchmarks/bench_ssd.py --out "$OUT/ssd.json"
fi

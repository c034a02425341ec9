#!/usr/bin/env bash
# The 4-GPU sweep, in parts that each fit one 10-minute device call (run from the repository root on
# a 4 x H200 machine; results under $OUT):
#   bash benchmarks/sweeps/h200x4.sh a   # validation grid at degrees 1/2/4, TP-SSM with int8, int8 all-reduce on 2 and 4, calibrate
#   bash benchmarks/sweeps/h200x4.sh b   # dense memory curves at long context on 4 GPUs, SSD kernel bench
#   bash benchmarks/sweeps/h200x4.sh c   # what is live at the memory peak; recalibration; int8 all-reduce over host memory
#   bash benchmarks/sweeps/h200x4.sh d   # memory curves and the grid again, after the Triton RMSNorm
#   bash benchmarks/sweeps/h200x4.sh e   # int8 all-reduce and TP-SSM 1/2/4 with GPUs talking through host memory; conv1d
#   bash benchmarks/sweeps/h200x4.sh f   # current kernels at degree 4: int8 all-reduce (merged dequantize kernels) over
#                                        # NVLink and host memory, Mamba-2 single / TP-SSM / SP at 16K
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD
part=${1:?a, b, c, d, e or f}

t() { local s=$SECONDS; "$@" 2>&1 | grep -v -e '^W1' -e 'OMP_NUM_THREADS' -e '^\*\*\*'; echo "[$(( SECONDS - s )) s] $*"; }
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
if [ "$part" = a ]; then
  t torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --out "$OUT/validation-x4.json"
  t torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --family mamba2 --only "single;tpssm=2;tpssm=4" \
      --modes train,prefill --int8-allreduce --out "$OUT/validation-x4-int8.json"
  t torchrun --nproc-per-node 4 benchmarks/bench_quant_allreduce.py --out "$OUT/quant-allreduce-x4.json"
  t python -m meshplan.cli calibrate --nproc 4 --quick --out "$OUT/h200-4gpu.toml"
elif [ "$part" = b ]; then
  t torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --family dense --only "tp=4;tsp=4;tp=2,sp=2;sp=4" \
      --seqs 16384,65536,131072,262144 --steps 2 --warmup 1 --no-exposed --out "$OUT/memory-curves-x4.json"
  t python benchmarks/bench_ssd.py --out "$OUT/ssd.json" --chunk 64
fi
if [ "$part" = c ]; then  # bash benchmarks/sweeps/h200x4.sh c: memory at the peak, recalibration, int8 over host memory
  t torchrun --nproc-per-node 4 benchmarks/memory_peak.py --layouts "tp=4;tsp=4;sp=4;tp=2,sp=2;tp=2" --seq 65536 \
      --out "$OUT/memory-peak-dense.json"
  t torchrun --nproc-per-node 4 benchmarks/memory_peak.py --model mamba2-2.7b --mode decode --batch 8 \
      --layouts "single;tpssm=4" --seq 16384 --out "$OUT/memory-peak-mamba2-decode.json"
  t python -m meshplan.cli calibrate --nproc 4 --quick --out "$OUT/h200-4gpu.toml"
  t torchrun --nproc-per-node 4 benchmarks/bench_quant_allreduce.py --out "$OUT/quant-allreduce-x4.json"
  t env NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 4 benchmarks/bench_quant_allreduce.py --out "$OUT/quant-allreduce-x4-nop2p.json"
fi
if [ "$part" = d ]; then  # after the Triton RMSNorm and the memory model's attention phase
  t torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --family dense --only "tp=4;tsp=4;tp=2,sp=2;sp=4" \
      --seqs 16384,65536,131072,262144 --steps 2 --warmup 1 --no-exposed --out "$OUT/memory-curves-x4.json"
  t torchrun --nproc-per-node 4 benchmarks/memory_peak.py --layouts "tp=4;tsp=4" --seq 65536 --out "$OUT/memory-peak-dense.json"
  t torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --out "$OUT/validation-x4.json"
fi
if [ "$part" = e ]; then  # int8 over host memory (no NVLink: NCCL_P2P_DISABLE=1) on 2 and 4 GPUs; TP-SSM 1/2/4 there
  t env NCCL_P2P_DISABLE=1 CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 benchmarks/bench_quant_allreduce.py \
      --out "$OUT/quant-allreduce-x2-host-memory.json"
  for q in "" --int8-allreduce; do
    t env NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --family mamba2 \
        --only "single;tpssm=2;tpssm=4" --modes train,prefill --seqs 16384 $q --out "$OUT/tpssm-host-memory${q:+-int8}.json"
  done
  t python benchmarks/bench_conv1d.py --out "$OUT/conv1d.json"
fi
if [ "$part" = f ]; then  # today's kernels at degree 4
  t torchrun --nproc-per-node 4 benchmarks/bench_quant_allreduce.py --out "$OUT/quant-allreduce-x4.json"
  t env NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 4 benchmarks/bench_quant_allreduce.py \
      --out "$OUT/quant-allreduce-x4-host-memory.json"
  t torchrun --nproc-per-node 4 benchmarks/gpu_validation.py --family mamba2 \
      --only "single;tpssm=2;tpssm=4;sp=2;sp=4" --modes train,prefill --seqs 16384 --prefill-seqs 16384 \
      --out "$OUT/validation-x4-mamba2.json"
fi

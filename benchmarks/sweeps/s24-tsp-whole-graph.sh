#!/usr/bin/env bash
# Session 24, 2 GPUs: which piece of a whole model's TSP step hangs a CUDA graph replay
# (benchmarks/probes/s24_tsp_whole_graph_probe.py; each variant under its own timeout, logs kept).
set -u
export PYTHONPATH=${PYTHONPATH:-}:$PWD
OUT=${OUT:-/tmp/s24-tsp-graph}
mkdir -p "$OUT"
for v in ${VARIANTS:-layers head-gather emb-gather both whole}; do
  echo "== $v"
  NCCL_DEBUG=WARN timeout -k 5 ${LIMIT:-95} torchrun --nproc-per-node 2 benchmarks/probes/s24_tsp_whole_graph_probe.py \
    --variant "$v" --dump ${DUMP:-55} ${ARGS:-} --out "$OUT/tsp-whole-graph-$v${SUFFIX:-}.json" > "$OUT/tsp-whole-graph-$v${SUFFIX:-}.log" 2>&1
  echo "rc $?"
  grep -v "UserWarning\|warn_once\|^\s*$" "$OUT/tsp-whole-graph-$v${SUFFIX:-}.log" | tail -${TAIL:-25}
done

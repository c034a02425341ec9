#!/usr/bin/env bash
# Packed documents on sequence shards (issue #34): mamba2-130m, one 16K-token row of 6 documents, trained
# whole (embedding to loss) on one GPU and on two as sp=2, tsp=2 and tpssm=2, each beside its prediction.
# Run on a 2-GPU machine: bash benchmarks/packed_docs_run.sh $OUT
set -euo pipefail
out=${1:?usage: packed_docs_run.sh OUT_DIR}
docs=$(mktemp --suffix .npz)
python benchmarks/packed_docs.py "$docs"
for layout in single sp=2 tsp=2 tpssm=2; do
  nproc=$([ "$layout" = single ] && echo 1 || echo 2)
  python -m meshplan execute --model mamba2-130m --layout "$layout" --seq 16384 --device cuda --nproc "$nproc" \
    --tokens "$docs" --out "$out/packed-${layout/=/}.json" --compare 2>&1 | tail -4
done

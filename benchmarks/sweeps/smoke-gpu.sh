#!/usr/bin/env bash
# One GPU, a few minutes: `meshplan execute` end to end after a refactor of the executor (whole model
# and layer stack, dense and Mamba-2, packed documents, --profile, a checkpoint with --weights), each
# run file under $OUT and its summary line printed. From the repository root:
#   bash benchmarks/sweeps/smoke-gpu.sh
set -u
export PYTHONPATH=$PWD
python - <<'PY'
import numpy as np, os
rng = np.random.default_rng(0)
np.savez(os.environ["OUT"] + "/packed.npz", tokens=rng.integers(0, 50000, 2 * 16385),
         documents=np.repeat(np.arange(8), 2 * 16385 // 8 + 1)[: 2 * 16385])
PY
run() { python -m meshplan execute --nproc 1 --device cuda --steps 3 "$@" 2>&1 | grep -v -e '^W1' -e Warning | tail -3; }
run --model dense-7b --layers 2 --layout single --seq 16k --profile --out "$OUT/smoke-dense-whole.json"
run --model dense-7b --layers 2 --layout single --seq 16k --layers-only --out "$OUT/smoke-dense-layers.json"
run --model mamba2-1.3b --layers 2 --layout single --seq 16k --out "$OUT/smoke-mamba2-whole.json"
run --model mamba2-1.3b --layers 2 --layout single --seq 16k --batch 2 --tokens "$OUT/packed.npz" \
    --out "$OUT/smoke-mamba2-packed.json"
run --model mamba2-1.3b --layers 2 --layout single --seq 16k --mode decode --out "$OUT/smoke-mamba2-decode.json"
python benchmarks/weights_check.py --out "$OUT/weights-check-smoke.json" 2>&1 | tail -4
rm -f "$OUT/packed.npz"

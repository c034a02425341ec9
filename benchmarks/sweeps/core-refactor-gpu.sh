#!/usr/bin/env bash
# The GPU check after #30's executor refactor — a layer built from its sublayers (TSP's attention
# broadcast and MLP weight ring now TSPAttention and TSPMLP), the process groups placed by
# meshplan/rank_order.py, the run's record handed to the workers (meshplan/executor/runspec.py) —
# which the CPU tests cannot time:
#   (a) one GPU: the smoke sweep, benchmarks/sweeps/smoke-gpu.sh;
#   (b) two GPUs: 16K-token training of dense-7b/2L on tp=2, tsp=2, sp=2 and of mamba2-2.7b/2L on
#       tpssm=2, sp=2, tsp=2, the layer stack (--layers-only, as docs/validation.md's 2-GPU grids),
#       and of the whole model on tsp=2 (the head's norm scale summed over tsp too).
# Each run file under $OUT, one summary line a run. Where this is a git checkout, each run of (b) is
# followed by the same run of BASE (default 69a945e, the commit before the refactor; BASE= skips it),
# exported to a temporary folder, on the same machine: the before/after to compare.
# From the repository root, on a machine with two GPUs:
#   bash benchmarks/sweeps/core-refactor-gpu.sh          (ONLY=b: skip the smoke sweep)
set -u
export NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD
HERE=$PWD
OUT=$(cd "${OUT:?set OUT to the folder for the run files}" && pwd)
BASE=${BASE-69a945e}

if [ "${ONLY:-}" != b ]; then
  echo "== (a) one GPU: benchmarks/sweeps/smoke-gpu.sh"
  CUDA_VISIBLE_DEVICES=0 bash benchmarks/sweeps/smoke-gpu.sh
fi

base_tree=""
if [ -n "$BASE" ] && git cat-file -e "$BASE^{commit}" 2>/dev/null; then
  base_tree=$(mktemp -d)
  git archive "$BASE" | tar -x -C "$base_tree"
  trap 'rm -rf "$base_tree"' EXIT
elif [ -n "$BASE" ]; then
  echo "(no commit $BASE here: the runs of BASE are skipped)"
fi

# One line a run: what it ran, then the CLI's own summary (step, peak, bytes moved, each beside the
# prediction) and the exposed communication.
summary() {
  python - "$1" "$2" <<'PY'
import json, sys
from meshplan.cli import run_summary
tag, path = sys.argv[1], sys.argv[2]
try:
    run = json.load(open(path))
except (OSError, ValueError) as exc:
    print(f"{tag}: no run file ({exc})")
    raise SystemExit
m = run.get("measured", {})
exposed = f", exposed comm {m['exposed_comm_s'] * 1e3:.2f} ms" if "exposed_comm_s" in m else ""
print(f"{tag}: {run_summary(run)}{exposed}")
PY
}

# execute TREE TAG OPTIONS…: one 2-GPU run of the code in TREE, its run file $OUT/core-refactor-TAG.json.
execute() {
  local tree=$1 tag=$2 out="$OUT/core-refactor-$2.json"
  shift 2
  (cd "$tree" && PYTHONPATH=$tree python -m meshplan execute --nproc 2 --device cuda --steps 5 --out "$out" "$@" \
    2>&1 | grep -v -e '^W1' -e Warning -e 'return func' | tail -4 | grep -i -e error -e failed)
  summary "$tag" "$out"
}

echo "== (b) two GPUs, training at 16K tokens"
for run in "dense-7b tp=2 --layers-only" "dense-7b tsp=2 --layers-only" "dense-7b sp=2 --layers-only" \
  "mamba2-2.7b tpssm=2 --layers-only" "mamba2-2.7b sp=2 --layers-only" "mamba2-2.7b tsp=2 --layers-only" \
  "dense-7b tsp=2" "mamba2-2.7b tsp=2"; do
  set -- $run
  model=$1 layout=$2
  shift 2
  what=$([ $# -gt 0 ] && echo layers || echo whole) tag=${model##*/}
  execute "$HERE" "$tag-$layout-$what-16k" --model "$model" --layers 2 --layout "$layout" --seq 16k "$@"
  if [ -n "$base_tree" ]; then
    execute "$base_tree" "$tag-$layout-$what-16k-base" --model "$model" --layers 2 --layout "$layout" --seq 16k "$@"
  fi
done

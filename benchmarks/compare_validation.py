"""Score committed GPU measurements against the cost model as it is now.

    python benchmarks/compare_validation.py benchmarks/results/validation-h200-run1.json [--json OUT]
    python benchmarks/compare_validation.py RUN.json ... --cluster PROFILE.toml [--collectives-only]

The files are gpu_validation.py's (a "runs" list) or `meshplan execute` run files (one run each). `--cluster`
predicts on another preset or a calibrated profile; `--collectives-only` keeps the preset's rates but the
profile's measured collectives (which part of a calibration moves a prediction).

The measurements are fixed (the file and the command that made them are committed); the predictions
are recomputed from the current code, so a model change is judged against the same runs. Prints
measured/predicted for peak memory, step time and exposed communication, and whether collective
bytes match exactly.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

from meshplan.layout import parse_layout
from meshplan.models import PRESETS
from meshplan.predict import predict_run
from meshplan.topologies import load_cluster
from meshplan.topologies.cluster import Calibration


def model_for(name: str):
    base, _, layers = name.partition("/")
    return replace(PRESETS[base], layers=int(layers.rstrip("L")), name=name, param_dtype="bf16")


def rescore(path: str, cluster_name: str = "", collectives_only: bool = False) -> list[dict]:
    """`cluster_name`: predict on this cluster or calibrated profile instead of the one the run names;
    `collectives_only`: the run's own cluster with only that profile's measured collectives."""
    data = json.load(open(path))
    single = "runs" not in data  # an execute run file: one run, predicted where it says (predicted_on)
    runs = [data] if single else data["runs"]
    own = load_cluster(data.get("cluster_for_predictions", "h200-8"))
    if single and (named := (data.get("predicted_on") or {}).get("cluster")):
        own = load_cluster(named)
    cluster = load_cluster(cluster_name) if cluster_name else own
    if collectives_only and cluster.calibration is not None:
        cluster = replace(own, calibration=Calibration(collectives=cluster.calibration.collectives))
    rows = []
    for run in runs:
        m = run["measured"]
        if "step_time_s" not in m:
            continue
        # The executor has dealt SP's tokens in zigzag since run 36, whose files say so (execute's own run files
        # all come after it); the runs before it split SP contiguously and are predicted as they ran.
        p = predict_run(
            model_for(run["model"]),
            parse_layout(run["layout"]),
            run["seq"],
            run.get("batch", 1),
            run["mode"],
            cluster,
            int8_allreduce=run.get("int8_allreduce", False),
            act_dtype="fp32" if run.get("dtype") == "fp32" else "bf16",
            sp_zigzag=single or data.get("sp_split") == "zigzag",
            launch_floor=not m.get("cuda_graph", False),  # replayed as a CUDA graph (session 21 on): no host floor
            whole=run.get("whole_model", False),
        )
        keys = set(m["comm_bytes"]) | set(p["comm_bytes"])
        exact = all(
            abs(m["comm_bytes"].get(k, 0) - p["comm_bytes"].get(k, 0)) <= 1e-9 * max(1, p["comm_bytes"].get(k, 0))
            for k in keys
        )
        rows.append(
            {
                "model": run["model"],
                "mode": run["mode"],
                "layout": run["layout"],
                "seq": run["seq"],
                "memory_ratio": m["peak_bytes"] / p["peak_bytes"],
                "time_ratio": m["step_time_s"] / p["step_time_s"],
                "exposed_measured_s": m.get("exposed_comm_s"),
                "exposed_predicted_s": p["exposed_comm_s"],
                "comm_bytes_exact": exact,
                "saved_ratio": (m["saved_bytes"] / p["saved_bytes"]) if p.get("saved_bytes") else None,
                "predicted": p,
                "measured": m,
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--json")
    ap.add_argument("--model", default="")
    ap.add_argument("--cluster", default="", help="a preset or calibrated profile to predict with")
    ap.add_argument("--collectives-only", action="store_true", help="only the profile's measured collectives")
    args = ap.parse_args()
    rows = [
        r
        for path in args.results
        for r in rescore(path, args.cluster, args.collectives_only)
        if args.model in r["model"]
    ]
    print(
        f"{'model':16} {'mode':7} {'layout':12} {'seq':>6} {'mem m/p':>8} {'time m/p':>8} {'exposed m/p ms':>16} bytes"
    )
    for r in rows:
        exp = (
            f"{r['exposed_measured_s'] * 1e3:6.1f}/{r['exposed_predicted_s'] * 1e3:6.1f}"
            if r["exposed_measured_s"] is not None
            else "-"
        )
        print(
            f"{r['model']:16} {r['mode']:7} {r['layout']:12} {r['seq']:6} {r['memory_ratio']:8.3f} "
            f"{r['time_ratio']:8.2f} {exp:>16} {'exact' if r['comm_bytes_exact'] else 'DIFF'}"
        )
    for fam in sorted({r["model"] for r in rows}):
        sub = [r for r in rows if r["model"] == fam]
        mem = [abs(r["memory_ratio"] - 1) for r in sub]
        tim = [abs(r["time_ratio"] - 1) for r in sub]
        print(
            f"{fam}: memory |error| median {statistics.median(mem):.1%} max {max(mem):.1%}; "
            f"time |error| median {statistics.median(tim):.1%} max {max(tim):.1%}; "
            f"{sum(r['comm_bytes_exact'] for r in sub)}/{len(sub)} byte counts exact"
        )
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Predicted against measured for one run file (pure: the CLI renders and sets the exit code)."""

from __future__ import annotations

from meshplan.errors import MeshplanError


def compare_run(run: dict, tolerance: float = 0.05) -> tuple[list[dict], bool]:
    """Rows of (quantity, predicted, measured, relative error, ok). A CPU run compares what a CPU run
    can measure: collective bytes per kind and axis, and saved activations; a GPU run adds peak
    memory and step time."""
    try:
        pred, meas = run["predicted"], run["measured"]
    except (KeyError, TypeError):
        raise MeshplanError(
            "run file: expected an object with 'predicted' and 'measured' (from meshplan execute)"
        ) from None
    if run.get("oom") or "error" in meas:
        raise MeshplanError(
            f"run file: the run did not complete ({'out of memory' if run.get('oom') else meas['error'][:200]})"
        )
    rows = []

    def add(name, p, m, tol):
        err = (m - p) / p if p else (0.0 if m == 0 else float("inf"))
        rows.append({"quantity": name, "predicted": p, "measured": m, "relative_error": err, "ok": abs(err) <= tol})

    for key in sorted(set(pred["comm_bytes"]) | set(meas["comm_bytes"])):
        add(f"bytes {key}", pred["comm_bytes"].get(key, 0.0), meas["comm_bytes"].get(key, 0.0), 1e-9)
    if run.get("mode") == "train" and "saved_bytes" in meas:
        add("saved activations", pred["saved_bytes"], meas["saved_bytes"], tolerance)
    if run.get("device") == "cuda":
        add("peak memory", pred["peak_bytes"], meas["peak_bytes"], tolerance)
        if "outside_allocator_bytes" in pred and "outside_allocator_bytes" in meas:
            # the CUDA context and NCCL's buffers (costmodel/runtime.py): what the fit check adds to the peak
            add("beside the allocator", pred["outside_allocator_bytes"], meas["outside_allocator_bytes"], 0.10)
        if "step_time_s" in pred:
            add("step time", pred["step_time_s"], meas["step_time_s"], tolerance)
        if "exposed_comm_s" in pred and "exposed_comm_s" in meas:
            rows.append(
                {
                    "quantity": "exposed communication (s)",
                    "predicted": pred["exposed_comm_s"],
                    "measured": meas["exposed_comm_s"],
                    "relative_error": None,
                    "ok": True,
                }
            )
    return rows, all(r["ok"] for r in rows)

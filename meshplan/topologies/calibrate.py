"""A calibrated profile from what `meshplan calibrate` measured: each collective's time = α + message /
bandwidth fitted per group size (scipy.optimize, non-negative least squares), and the preset's TOML with
a [calibration] table that `--cluster` accepts. The measuring itself — GEMM, HBM, attention and host
launch rates, every collective over group sizes 2, 4, … N — runs on GPUs under torchrun:
meshplan.executor.calibrate_run.
"""

from __future__ import annotations

from datetime import date

from meshplan.topologies.cluster import HOST_KEYS


def fit_alpha_bandwidth(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares fit of t = α + M / β over (message bytes, seconds); α ≥ 0, β > 0."""
    import numpy as np
    from scipy.optimize import nnls

    m = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    # Relative errors: weight each point by 1/t so small messages count as much as large ones.
    a = np.stack([np.ones_like(m), m], axis=1) / t[:, None]
    (alpha, inv_bw), _ = nnls(a, np.ones_like(t))
    return float(alpha), float(1 / inv_bw) if inv_bw > 0 else float("inf")


def profile_toml(base_toml: str, measured: dict, command: str) -> str:
    """The preset's TOML with a [calibration] table appended."""
    lines = [base_toml.rstrip(), "", "[calibration]", f'date = "{date.today().isoformat()}"', f'command = "{command}"']
    if "gemm_efficiency" in measured:
        lines += [
            f"gemm_efficiency = {measured['gemm_efficiency']:.4f}",
            f"hbm_tb_per_s = {measured['hbm_bytes_per_s'] / 1e12:.4f}",
            "attention_causal = [" + ", ".join(f"[{k}, {e:.4f}]" for k, e in measured["attention_causal"]) + "]",
            "attention_prefix = [" + ", ".join(f"[{k}, {e:.4f}]" for k, e in measured["attention_prefix"]) + "]",
        ]
    lines += [
        f"# {p['model']} {p['mode']} at {p['seq']} tokens, batch {p['batch']}: {p['kernels']:.0f} kernels "
        f"issued in {p['host_enqueue_s'] * 1e3:.2f} ms (step {p['step_time_s'] * 1e3:.2f} ms)"
        for p in measured.get("host_probes", [])
    ]
    lines += [
        f"{key} = {measured[key.replace('_us', '_s')] * 1e6:.2f}"
        for key in HOST_KEYS
        if key.replace("_us", "_s") in measured
    ]
    if measured.get("collectives"):
        lines += ["", "[calibration.collectives]"]
        for key, points in sorted(measured["collectives"].items()):
            alpha, bw = fit_alpha_bandwidth(points)
            pts = ", ".join(f"[{b}, {t:.6g}]" for b, t in points)
            lines.append(
                f'"{key}" = {{ alpha_us = {alpha * 1e6:.3f}, algbw_gb_per_s = {bw / 1e9:.3f}, points = [{pts}] }}'
            )
    return "\n".join(lines) + "\n"

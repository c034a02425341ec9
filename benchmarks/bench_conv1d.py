"""Achieved HBM bandwidth of the Triton causal conv1d (forward, and backward) against the roofline.

    python benchmarks/bench_conv1d.py --out $OUT/conv1d.json

Bytes counted as the least the kernel must move: forward reads x and writes out (bf16); backward
reads x and dy and writes dx (bf16) — it rebuilds the pre-activation in registers. Roofline: a large
device-to-device copy measured in the same run. Two times per call: the whole call's (CUDA events
around it: its launches and the small torch ops around the kernel — the seq_idx cast, the dw and db
partial sums — included), and the kernel's own (torch.profiler), over which the backward's bytes also
count the fp32 dw, db partial sums it writes — as benchmarks/bench_ssd.py counts the scan's. The main rows run the
module's settings (the
time-marching kernels for d_conv ≤ 4); --tiles also times the tiled kernels' tiles, --march the
marching kernels' settings.
"""

from __future__ import annotations

import argparse
import json

import torch

from meshplan.executor.run import copy_roofline_bytes_per_s, kernel_times, median_time_s
from meshplan.kernels import conv1d
from meshplan.kernels.conv1d import causal_conv1d, causal_conv1d_bwd, causal_conv1d_fwd, causal_conv1d_update
from meshplan.kernels.reference import causal_conv1d_ref, causal_conv1d_update_ref


def decode_rows() -> list[dict]:
    """One decode step of the conv (mamba2-2.7b's 5376 channels, d_conv 4): the Triton update (one
    launch, state in place) against the torch ops the reference runs, per call."""
    rows = []
    for b in (1, 8, 64):
        c, k = 5376, 4
        x = torch.randn(b, c, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(c, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(c, device="cuda", dtype=torch.bfloat16)
        state, state_ref = (torch.randn(b, k - 1, c, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        state_ref.copy_(state)
        err = causal_conv1d_update(x, state, w, bias).float() - causal_conv1d_update_ref(x, state_ref, w, bias).float()
        tri = median_time_s(lambda: causal_conv1d_update(x, state, w, bias), reps=50, warmup=5)
        ref = median_time_s(lambda: causal_conv1d_update_ref(x, state_ref, w, bias), reps=50, warmup=5)
        rows.append(
            {
                "b": b,
                "channels": c,
                "triton_s": tri,
                "torch_ops_s": ref,
                "max_abs_err": err.abs().max().item(),
                "state_equal": bool(torch.equal(state, state_ref)),
            }
        )
        print(f"decode b {b}: triton update {tri * 1e6:.1f} us, torch ops {ref * 1e6:.1f} us", flush=True)
    return rows


# Time-marching settings timed by --march: forward (rows, channels, warps, stages) and backward (rows,
# channels, warps, prefetch, register cap; 0 = uncapped). Sweeps of 18, 16 and 5 settings
# (benchmarks/results/conv1d-fast-silu-*-h200.json) put 128 × 128, 1 warp, first for the forward and
# 256 × 256, 2 warps, rows a step ahead for the backward; maxnreg-h200.json the cap at 168.
MARCH_FWD_SWEEP = [(128, 128, 1, 1), (128, 128, 1, 2), (128, 256, 2, 1), (256, 128, 1, 1)]
MARCH_BWD_SWEEP = [(256, 256, 2, True, cap) for cap in (0, 144, 168, 192, 208)] + [
    (128, 256, 2, True, 168),
    (256, 128, 1, True, 168),
    (256, 256, 2, False, 168),
    (256, 256, 4, True, 168),
    (512, 256, 2, True, 168),
]


def conv_inputs(b: int, t: int, c: int):
    """bf16 x (b, t, c), 4-tap weights and bias, and seq_idx starting a new sequence every 1000 tokens."""
    x = torch.randn(b, t, c, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(c, 4, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(c, device="cuda", dtype=torch.bfloat16)
    return x, w, bias, (torch.arange(t, device="cuda") // 1000).expand(b, t).contiguous()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiles", action="store_true", help="also time the forward over tile shapes")
    ap.add_argument("--march", action="store_true", help="also time the time-marching kernels' settings")
    args = ap.parse_args()
    copy_bw = copy_roofline_bytes_per_s(reps=20, warmup=3)
    rows = []
    for b, t, c in ((4, 16384, 5376), (1, 65536, 5376), (8, 4096, 3328)):
        x, w, bias, seq_idx = conv_inputs(b, t, c)
        err = (
            (causal_conv1d(x, w, bias, seq_idx).float() - causal_conv1d_ref(x, w, bias, seq_idx=seq_idx).float())
            .abs()
            .max()
            .item()
        )
        fwd = median_time_s(lambda: causal_conv1d_fwd(x, w, bias, seq_idx), reps=20, warmup=3)
        g = torch.randn_like(x)
        bwd = median_time_s(lambda: causal_conv1d_bwd(g, x, w, bias, seq_idx), reps=20, warmup=3)
        n = b * t * c
        fwd_bytes = 2 * n * 2
        bwd_bytes = 3 * n * 2  # x, dy read; dx written
        k_fwd = kernel_times(lambda: causal_conv1d_fwd(x, w, bias, seq_idx), ("_conv_fwd_march",))
        k_bwd = kernel_times(lambda: causal_conv1d_bwd(g, x, w, bias, seq_idx), ("_conv_bwd_march",))
        partials = b * -(-t // conv1d.MARCH_ROWS) * c * 5 * 4  # fp32 dw (4 taps) and db per program's rows
        rows.append(
            {
                "b": b,
                "t": t,
                "c": c,
                "max_abs_err_vs_ref": err,
                "fwd_s": fwd,
                "bwd_s": bwd,
                "fwd_bandwidth_fraction": fwd_bytes / fwd / copy_bw,
                "bwd_bandwidth_fraction": bwd_bytes / bwd / copy_bw,
                "kernels_s": {"forward": k_fwd, "backward": k_bwd},
                "fwd_kernel_bandwidth_fraction": fwd_bytes / k_fwd["_conv_fwd_march"] / copy_bw,
                "bwd_kernel_bytes": bwd_bytes + partials,
                "bwd_kernel_bandwidth_fraction": (bwd_bytes + partials) / k_bwd["_conv_bwd_march"] / copy_bw,
            }
        )
    flags = "".join(f" --{k}" for k in ("tiles", "march") if getattr(args, k))
    out = {
        "command": f"python benchmarks/bench_conv1d.py{flags} --out $OUT/conv1d.json",
        "gpu": torch.cuda.get_device_name(0),
        "copy_bytes_per_s": copy_bw,
        "runs": rows,
        "decode": decode_rows(),
    }
    if args.tiles:
        b, t, c = 4, 16384, 5376
        x, w, bias, seq_idx = conv_inputs(b, t, c)
        out["tiles"] = []
        for bt, bc in ((64, 32), (32, 128), (64, 128), (16, 256), (32, 256), (128, 64), (8, 512)):
            s = median_time_s(
                lambda: causal_conv1d_fwd(x, w, bias, seq_idx, bt=bt, bc=bc, march=False), reps=20, warmup=3
            )
            out["tiles"].append(
                {"bt": bt, "bc": bc, "fwd_s": s, "fwd_bandwidth_fraction": 2 * b * t * c * 2 / s / copy_bw}
            )
        g = torch.randn_like(x)
        out["bwd_tiles"] = []
        for two_pass in (False, True):
            for idx in (seq_idx, None):
                for bt, bc, steps in (
                    (32, 128, 16),
                    (64, 64, 8),
                    (32, 64, 16),
                    (16, 128, 32),
                    (16, 64, 32),
                    (8, 128, 64),
                ):
                    s = median_time_s(
                        lambda: causal_conv1d_bwd(
                            g, x, w, bias, idx, bt=bt, bc=bc, steps=steps, two_pass=two_pass, march=False
                        ),
                        reps=20,
                        warmup=3,
                    )
                    out["bwd_tiles"].append(
                        {
                            "two_pass": two_pass,
                            "seq_idx": idx is not None,
                            "bt": bt,
                            "bc": bc,
                            "steps": steps,
                            "bwd_s": s,
                            "bwd_bandwidth_fraction": 3 * b * t * c * 2 / s / copy_bw,
                        }
                    )
                    print(
                        f"bwd {'two-pass' if two_pass else 'fused'}{' seq_idx' if idx is not None else ''} tile "
                        f"{bt}x{bc}, {steps} steps: {s * 1e3:.3f} ms",
                        flush=True,
                    )
    if args.march:
        b, t, c = 4, 16384, 5376
        x, w, bias, seq_idx = conv_inputs(b, t, c)
        g = torch.randn_like(x)
        n = b * t * c
        out["march"] = []
        for nrows, channels, warps, stages in MARCH_FWD_SWEEP:
            kw = dict(march=True, rows=nrows, channels=channels, warps=warps, stages=stages)
            f = median_time_s(lambda: causal_conv1d_fwd(x, w, bias, seq_idx, **kw), reps=20, warmup=3)
            out["march"].append(
                {"kernel": "forward", **kw, "fwd_s": f, "fwd_bandwidth_fraction": 2 * n * 2 / f / copy_bw}
            )
            print(
                f"march forward {nrows} x {channels}, {warps} warps, {stages} stages: {f * 1e3:.3f} ms "
                f"({2 * n * 2 / f / copy_bw:.0%})",
                flush=True,
            )
        for nrows, channels, warps, prefetch, cap in MARCH_BWD_SWEEP:
            kw = dict(march=True, rows=nrows, channels=channels, warps=warps, prefetch=prefetch, maxnreg=cap)
            bw = median_time_s(lambda: causal_conv1d_bwd(g, x, w, bias, seq_idx, **kw), reps=20, warmup=3)
            out["march"].append(
                {"kernel": "backward", **kw, "bwd_s": bw, "bwd_bandwidth_fraction": 3 * n * 2 / bw / copy_bw}
            )
            print(
                f"march backward {nrows} x {channels}, {warps} warps, prefetch {prefetch}, maxnreg {cap or '-'}: "
                f"{bw * 1e3:.3f} ms ({3 * n * 2 / bw / copy_bw:.0%})",
                flush=True,
            )
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"copy roofline {copy_bw / 1e12:.2f} TB/s")
    for r in rows:
        kf, kb = r["kernels_s"]["forward"]["_conv_fwd_march"], r["kernels_s"]["backward"]["_conv_bwd_march"]
        print(
            f"b {r['b']} t {r['t']} c {r['c']}: fwd {r['fwd_s'] * 1e3:.3f} ms ({r['fwd_bandwidth_fraction']:.0%} of "
            f"roofline; "
            f"kernel {kf * 1e3:.3f} ms, {r['fwd_kernel_bandwidth_fraction']:.0%}), bwd {r['bwd_s'] * 1e3:.3f} ms "
            f"({r['bwd_bandwidth_fraction']:.0%}; kernel {kb * 1e3:.3f} ms, {r['bwd_kernel_bandwidth_fraction']:.0%}), "
            f"max |err| {r['max_abs_err_vs_ref']:.2e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

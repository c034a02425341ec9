"""Achieved HBM bandwidth of the Triton causal conv1d (forward, and backward) against the roofline.

    python benchmarks/bench_conv1d.py --out $OUT/conv1d.json

Bytes counted as the least the kernel must move: forward reads x and writes out (bf16); backward
reads x and dy, writes dx (bf16), and in this implementation also writes and reads the fp32
pre-activation gradient. Roofline: a large device-to-device copy measured in the same run.
"""

from __future__ import annotations

import argparse
import json

import torch

from meshplan.executor.run import median_time_s
from meshplan.kernels.conv1d import causal_conv1d, causal_conv1d_fwd
from meshplan.kernels.reference import causal_conv1d_ref


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiles", action="store_true", help="also time the forward over tile shapes")
    args = ap.parse_args()
    big = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    copy_s = median_time_s(lambda: big.clone(), reps=20, warmup=3)
    copy_bw = 2 * big.numel() / copy_s  # read + write
    rows = []
    for b, t, c in ((4, 16384, 5376), (1, 65536, 5376), (8, 4096, 3328)):
        x = torch.randn(b, t, c, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(c, 4, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(c, device="cuda", dtype=torch.bfloat16)
        seq_idx = (torch.arange(t, device="cuda") // 1000).expand(b, t).contiguous()
        err = (causal_conv1d(x, w, bias, seq_idx).float() - causal_conv1d_ref(x, w, bias, seq_idx=seq_idx).float()).abs().max().item()
        fwd = median_time_s(lambda: causal_conv1d_fwd(x, w, bias, seq_idx), reps=20, warmup=3)
        xg = x.clone().requires_grad_(True)
        out = causal_conv1d(xg, w, bias, seq_idx)
        g = torch.randn_like(out)
        bwd = median_time_s(lambda: torch.autograd.grad(causal_conv1d(xg, w, bias, seq_idx), xg, g), reps=20,
                            warmup=3) - fwd
        n = b * t * c
        fwd_bytes = 2 * n * 2
        bwd_bytes = 3 * n * 2 + 2 * n * 4 + n * 4  # x, dy, dx; dpre written and read; recomputed pre
        rows.append({"b": b, "t": t, "c": c, "max_abs_err_vs_ref": err, "fwd_s": fwd, "bwd_s": bwd,
                     "fwd_bandwidth_fraction": fwd_bytes / fwd / copy_bw,
                     "bwd_bandwidth_fraction": bwd_bytes / bwd / copy_bw})
    out = {"command": "python benchmarks/bench_conv1d.py --out $OUT/conv1d.json", "gpu": torch.cuda.get_device_name(0),
           "copy_bytes_per_s": copy_bw, "runs": rows}
    if args.tiles:
        b, t, c = 4, 16384, 5376
        x = torch.randn(b, t, c, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(c, 4, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(c, device="cuda", dtype=torch.bfloat16)
        seq_idx = (torch.arange(t, device="cuda") // 1000).expand(b, t).contiguous()
        out["tiles"] = []
        for bt, bc in ((64, 32), (32, 128), (64, 128), (16, 256), (32, 256), (128, 64), (8, 512)):
            s = median_time_s(lambda: causal_conv1d_fwd(x, w, bias, seq_idx, bt=bt, bc=bc), reps=20, warmup=3)
            out["tiles"].append({"bt": bt, "bc": bc, "fwd_s": s, "fwd_bandwidth_fraction": 2 * b * t * c * 2 / s / copy_bw})
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"copy roofline {copy_bw / 1e12:.2f} TB/s")
    for r in rows:
        print(f"b {r['b']} t {r['t']} c {r['c']}: fwd {r['fwd_s'] * 1e3:.3f} ms ({r['fwd_bandwidth_fraction']:.0%} of roofline), "
              f"bwd {r['bwd_s'] * 1e3:.3f} ms ({r['bwd_bandwidth_fraction']:.0%}), max |err| {r['max_abs_err_vs_ref']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

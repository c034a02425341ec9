"""Mamba-2's gated RMSNorm on one GPU: the Triton kernels against autograd through the torch
reference (fp32 intermediates), forward + backward, and achieved bandwidth against the copy roofline.

    python benchmarks/bench_gated_norm.py --out $OUT/gated-norm.json

Bytes counted as the kernels move them: the one-pass kernels (every row here) read y and z once and
write the output forward, read y, z and dout once and write dy and dz backward (bf16). z is a column
slice of a wider tensor, as the executor passes it (the in_proj output's z columns).
"""

from __future__ import annotations

import argparse
import json

import torch

from meshplan.executor.blocks import gated_rmsnorm
from meshplan.executor.run import copy_roofline_bytes_per_s, median_time_s
from meshplan.kernels.gated_norm import gated_rmsnorm_triton


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    copy_bw = copy_roofline_bytes_per_s()
    rows = []
    for tokens, channels, group in ((16384, 5120, 5120), (16384, 5120, 640), (65536, 2560, 2560)):
        y, g = (torch.randn(1, tokens, channels, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        z = torch.randn(1, tokens, 2 * channels + 336, device="cuda", dtype=torch.bfloat16)[..., :channels]
        w = torch.rand(channels, device="cuda", dtype=torch.bfloat16) + 0.5
        out = {}
        for name, fn in (("triton", gated_rmsnorm_triton), ("torch", gated_rmsnorm)):
            leaves = [t.clone().requires_grad_() for t in (y, z, w)]

            def step():
                fn(*leaves, group).backward(g)

            out[name] = median_time_s(step, reps=10, warmup=2)
        with torch.no_grad():
            err = (
                (
                    gated_rmsnorm_triton(y, z, w, group).float()
                    - gated_rmsnorm(y.double(), z.double(), w.double(), group)
                )
                .abs()
                .max()
                .item()
            )
        n = tokens * channels * 2
        rows.append(
            {
                "tokens": tokens,
                "channels": channels,
                "group": group,
                "triton_fwd_bwd_s": out["triton"],
                "torch_fwd_bwd_s": out["torch"],
                "speedup": out["torch"] / out["triton"],
                "max_abs_err_vs_fp64": err,
                "bandwidth_fraction": (3 * n + 5 * n) / out["triton"] / copy_bw,
            }
        )
        r = rows[-1]
        print(
            f"{tokens} x {channels} (group {group}): triton {r['triton_fwd_bwd_s'] * 1e3:.3f} ms, torch "
            f"{r['torch_fwd_bwd_s'] * 1e3:.3f} ms ({r['speedup']:.1f}x), {r['bandwidth_fraction']:.0%} of roofline, "
            f"max |err| {err:.1e}",
            flush=True,
        )
    json.dump(
        {
            "command": "python benchmarks/bench_gated_norm.py --out $OUT/gated-norm.json",
            "gpu": torch.cuda.get_device_name(0),
            "copy_bytes_per_s": copy_bw,
            "runs": rows,
        },
        open(args.out, "w"),
        indent=1,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

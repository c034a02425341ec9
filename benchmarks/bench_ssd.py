"""Triton chunked SSD forward on one GPU: accuracy against the float64 recurrence, time against the
torch chunked reference, and achieved bandwidth against the copy roofline.

    python benchmarks/bench_ssd.py --out $OUT/ssd.json

Bytes counted as the least the forward must move: x, dt, B, C read and y written (bf16), plus each
chunk's state written and read twice (fp32).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from meshplan.executor.run import median_time_s
from meshplan.kernels.reference import ssd_chunked_ref
from meshplan.kernels.ssd import ssd_chunked


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    big = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    copy_bw = 2 * big.numel() / median_time_s(lambda: big.clone(), reps=10, warmup=2)
    rows = []
    for b, s, h, p, g, n in ((1, 16384, 80, 64, 1, 128), (4, 4096, 80, 64, 1, 128), (1, 16384, 40, 64, 1, 128)):
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(b, s, h, p, device="cuda", dtype=torch.bfloat16, generator=gen)
        dt = F.softplus(torch.randn(b, s, h, device="cuda", generator=gen) - 3)
        A = -torch.rand(h, device="cuda", generator=gen) * 4 - 0.5
        B = torch.randn(b, s, g, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        C = torch.randn(b, s, g, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        D = torch.randn(h, device="cuda", generator=gen)
        with torch.no_grad():
            y, _ = ssd_chunked(x, dt, A, B, C, D)
            ref, _ = ssd_chunked_ref(x.double(), dt.double(), A.double(), B.double(), C.double(), D.double())
            err = ((y.double() - ref).norm() / ref.norm()).item()
            t_tri = median_time_s(lambda: ssd_chunked(x, dt, A, B, C, D), reps=10, warmup=2)
            t_ref = median_time_s(lambda: ssd_chunked_ref(x, dt, A, B, C, D), reps=3, warmup=2)
        nc = s // 64
        bytes_min = (2 * b * s * h * p + 4 * b * s * h + 2 * 2 * b * s * g * n + 2 * b * s * h * p) + 3 * 4 * b * nc * h * p * n
        rows.append({"b": b, "s": s, "heads": h, "headdim": p, "ngroups": g, "d_state": n, "rel_err_vs_fp64": err,
                     "triton_s": t_tri, "torch_reference_s": t_ref, "speedup_over_reference": t_ref / t_tri,
                     "bandwidth_fraction": bytes_min / t_tri / copy_bw})
    # Packed rows: boundaries every 700 tokens, against the float64 reference with the same seq_idx.
    gen = torch.Generator(device="cuda").manual_seed(1)
    b, s, h, p, g, n = 2, 4096, 16, 64, 1, 128
    x = torch.randn(b, s, h, p, device="cuda", dtype=torch.bfloat16, generator=gen)
    dt = F.softplus(torch.randn(b, s, h, device="cuda", generator=gen) - 3)
    A = -torch.rand(h, device="cuda", generator=gen) * 4 - 0.5
    B = torch.randn(b, s, g, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    C = torch.randn(b, s, g, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    sid = (torch.arange(s, device="cuda") // 700).expand(b, s).contiguous()
    with torch.no_grad():
        y, _ = ssd_chunked(x, dt, A, B, C, seq_idx=sid)
        ref, _ = ssd_chunked_ref(x.double(), dt.double(), A.double(), B.double(), C.double(), seq_idx=sid)
    packed_err = ((y.double() - ref).norm() / ref.norm()).item()
    print(f"packed rows (seq_idx): rel err {packed_err:.1e}")
    out = {"command": "python benchmarks/bench_ssd.py --out $OUT/ssd.json", "gpu": torch.cuda.get_device_name(0),
           "copy_bytes_per_s": copy_bw, "runs": rows, "packed_rel_err_vs_fp64": packed_err}
    json.dump(out, open(args.out, "w"), indent=1)
    for r in rows:
        print(f"b {r['b']} s {r['s']} h {r['heads']}: triton {r['triton_s'] * 1e3:.2f} ms, torch reference "
              f"{r['torch_reference_s'] * 1e3:.1f} ms ({r['speedup_over_reference']:.1f}×), "
              f"{r['bandwidth_fraction']:.0%} of roofline, rel err {r['rel_err_vs_fp64']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

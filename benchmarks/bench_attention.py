"""Achieved attention rate of torch SDPA on this GPU, forward + backward, for the two ways the
executor calls it: the fused causal kernel (is_causal, queries and keys aligned: single GPU, TP) and
a lower-right causal bias over a key prefix (SP and TSP shards), plus a large bf16 GEMM.

    python benchmarks/bench_attention.py --out $OUT/attention.json

FLOPs counted as the cost model counts them (meshplan/costmodel/blocks/attention.py): causal attention
4·q·k·(a·d) × the visible fraction forward, 2.5× that backward.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from meshplan.executor.run import median_time_s


def attention_rate(q_len: int, kv_len: int, heads: int = 32, d: int = 128, lower_right: bool = False) -> dict:
    dev = "cuda"
    q = torch.randn(1, heads, q_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, heads, kv_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, heads, kv_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    go = torch.randn(1, heads, q_len, d, device=dev, dtype=torch.bfloat16)

    def step():
        if lower_right:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q_len, kv_len))
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(go)

    t = median_time_s(step)
    visible = (kv_len - q_len / 2) / kv_len  # average share of keys a query sees
    flops = 4 * q_len * kv_len * heads * d * visible * 3.5
    return {
        "q_len": q_len,
        "kv_len": kv_len,
        "heads": heads,
        "head_dim": d,
        "lower_right": lower_right,
        "seconds": t,
        "tflops": flops / t / 1e12,
    }


def gemm_rate(n: int = 8192) -> dict:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = median_time_s(lambda: a @ b)
    return {"n": n, "seconds": t, "tflops": 2 * n**3 / t / 1e12}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    peak = 989.4e12  # H100/H200 dense bf16 datasheet peak (meshplan/topologies/presets/h200-8.toml)
    rows = [attention_rate(s, s) for s in (4096, 16384, 32768)]
    rows += [attention_rate(s // 2, s, lower_right=True) for s in (8192, 32768)]
    rows += [attention_rate(s // 4, s, lower_right=True) for s in (16384, 32768)]
    gemm = gemm_rate()
    out = {
        "command": "python benchmarks/bench_attention.py --out $OUT/attention.json",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "peak_tflops": peak / 1e12,
        "gemm": gemm,
        "attention": rows,
    }
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"GEMM 8192³ bf16: {gemm['tflops']:.0f} TFLOP/s ({gemm['tflops'] * 1e12 / peak:.2f} of peak)")
    for r in rows:
        kind = "lower-right bias" if r["lower_right"] else "is_causal"
        print(
            f"{kind:17} q {r['q_len']:6} kv {r['kv_len']:6}: {r['tflops']:6.0f} TFLOP/s "
            f"({r['tflops'] * 1e12 / peak:.2f} of peak), {r['seconds'] * 1e3:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

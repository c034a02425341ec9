"""Achieved rates a production stack runs at on this GPU: causal attention by SDPA backend (FlashAttention-2,
cuDNN, memory-efficient), whole-sequence and on a sequence shard's key prefix, and FP8 GEMMs
(torch._scaled_mm, e4m3 inputs, per-tensor and row-wise scales) beside bf16 at transformer layer shapes.

Attention's useful FLOPs: causal forward 4·s²·d·heads/2 a sequence, backward 2.5× (FlashAttention-2's 5
matmuls to 2), so forward + backward counts 3.5× the forward. A shard's prefix attention: q queries, the
last q of k keys, lower-right causal: 4·d·heads·(q·k − q²/2) forward. The same shard as Transformer
Engine's context-parallel attention runs it (backend "cudnn-blocks": AttnFuncWithCPAndKVP2P attends each
step's K/V block apart, unmasked off the diagonal and causal on it, with cuDNN's fused kernel): a full
q × (k − q) block plus a causal q × q block, timed together, at the same useful FLOPs.

    python benchmarks/bench_rates.py --out $OUT/rates-h100.json
    python benchmarks/bench_rates.py --only attention --out $OUT/attention-blocks-h100.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from meshplan.executor.run import median_time_s

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
# (seq, query heads, KV heads, head dim, batch): Llama-3-8B/70B heads per rank at TP 1-8, 2K-32K tokens.
ATTENTION_SHAPES = [
    (2048, 24, 24, 128, 4),
    (4096, 32, 8, 128, 2),
    (8192, 32, 8, 128, 1),
    (8192, 16, 4, 128, 1),
    (8192, 8, 1, 128, 1),
    (16384, 32, 8, 128, 1),
    (32768, 32, 8, 128, 1),
    (8192, 64, 8, 128, 1),
]
# (name, m, n, k): layer GEMMs at 8K tokens for hidden 4096 / 8192 (TP 1 and 8), and a square one.
GEMM_SHAPES = [
    ("h4096 qkv", 8192, 6144, 4096),
    ("h4096 fc1", 8192, 28672, 4096),
    ("h4096 fc2", 8192, 4096, 14336),
    ("h8192 qkv tp8", 8192, 1280, 8192),
    ("h8192 fc1 tp8", 8192, 7168, 8192),
    ("h8192 fc2 tp8", 8192, 8192, 3584),
    ("h8192 fc1", 8192, 57344, 8192),
    ("square 8192", 8192, 8192, 8192),
]


def attention_rate(seq, heads, kv, d, batch, backend, prefix_q=0):
    """Forward + backward TFLOP/s of causal SDPA (GQA K/V repeated to the query heads, as the
    executor passes them), or of a shard's `prefix_q` queries over all `seq` keys (lower-right)."""
    q_len = prefix_q or seq
    q = torch.randn(batch, heads, q_len, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(batch, kv, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (x.repeat_interleave(heads // kv, dim=1).requires_grad_() for x in (k, v))
    go = torch.randn_like(q)
    if prefix_q:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q_len, seq)
        flops = 4 * d * heads * batch * (q_len * seq - q_len * q_len / 2)
    else:
        mask = None
        flops = 4 * d * heads * batch * seq * seq / 2

    def step():
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.backward(go)

    with sdpa_kernel([BACKENDS[backend]]):
        try:
            t = median_time_s(step, reps=10, warmup=3)
        except RuntimeError as exc:  # the backend does not take this shape or mask
            return None, str(exc).splitlines()[0][:160]
    return flops * 3.5 / t / 1e12, None


def blockwise_rate(seq, heads, kv, d, batch, prefix_q):
    """Forward + backward TFLOP/s of a shard's `prefix_q` queries over `seq` keys run as two cuDNN calls:
    the unmasked block of the keys before the shard and the causal block of its own keys."""
    q = torch.randn(batch, heads, prefix_q, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(batch, kv, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (x.repeat_interleave(heads // kv, dim=1).requires_grad_() for x in (k, v))
    go = torch.randn_like(q)
    split = seq - prefix_q
    flops = 4 * d * heads * batch * (prefix_q * seq - prefix_q * prefix_q / 2)

    def step():
        # The two blocks' backward runs apart here; TE merges their outputs by log-sum-exp, which costs
        # an elementwise pass over the output (not timed).
        off = F.scaled_dot_product_attention(q, k[:, :, :split], v[:, :, :split])
        diag = F.scaled_dot_product_attention(q, k[:, :, split:], v[:, :, split:], is_causal=True)
        torch.autograd.backward((off, diag), (go, go))

    with sdpa_kernel([BACKENDS["cudnn"]]):
        try:
            t = median_time_s(step, reps=10, warmup=3)
        except RuntimeError as exc:
            return None, str(exc).splitlines()[0][:160]
    return flops * 3.5 / t / 1e12, None


def gemm_rates(m, n, k):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    flops = 2 * m * n * k
    out = {"bf16": flops / median_time_s(lambda: a @ b.t(), reps=20, warmup=5) / 1e12}
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    scales = {
        "fp8_tensorwise": (torch.tensor(1.0, device="cuda"), torch.tensor(1.0, device="cuda")),
        "fp8_rowwise": (torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")),
    }
    for name, (sa, sb) in scales.items():
        try:
            t = median_time_s(
                lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
                reps=20,
                warmup=5,
            )
            out[name] = flops / t / 1e12
        except RuntimeError as exc:  # the GPU or this torch has no such FP8 GEMM
            out[f"{name}_error"] = str(exc).splitlines()[0][:160]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=("attention", "gemm"), default=None, help="one half of the sweep")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    rows = []
    for seq, heads, kv, d, batch in ATTENTION_SHAPES if args.only != "gemm" else ():
        shape = {"seq": seq, "heads": heads, "kv_heads": kv, "head_dim": d, "batch": batch}
        runs = [("cudnn-blocks", seq // 4)] + [(b, prefix) for b in BACKENDS for prefix in (0, seq // 4)]
        for backend, prefix in runs:
            if backend == "cudnn-blocks":
                rate, err = blockwise_rate(seq, heads, kv, d, batch, prefix)
            else:
                rate, err = attention_rate(seq, heads, kv, d, batch, backend, prefix)
            row = {"backend": backend, "prefix_queries": prefix, "tflops": rate, "error": err}
            rows.append({"case": "attention", **shape, **row})
            what = f"attention s {seq} h {heads}/{kv} {backend:9} prefix {prefix:5}"
            print(f"{what}: {rate or 0:7.1f} TFLOP/s", flush=True)
            torch.cuda.empty_cache()
    for name, m, n, k in GEMM_SHAPES if args.only != "attention" else ():
        r = gemm_rates(m, n, k)
        rows.append({"case": "gemm", "name": name, "m": m, "n": n, "k": k, **r})
        print(f"gemm {name:14}: " + ", ".join(f"{k} {v:.0f}" for k, v in r.items() if isinstance(v, float)), flush=True)
    out = {
        "command": " ".join(
            ["python benchmarks/bench_rates.py", *([f"--only {args.only}"] if args.only else []), f"--out {args.out}"]
        ),
        "gpu": torch.cuda.get_device_name(0),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

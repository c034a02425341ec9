"""The executor's attention paths before and after #34 on this GPU, forward + backward in bf16, with the
tensors laid out as the executor hands them over (q, k, v views of one fused QKV projection; a shard's
K/V a slice of the all-gathered sequence):

- causal (one GPU, TP): SDPA is_causal on its default backend, against
  meshplan.executor.attention.causal_attention (cuDNN first on Hopper);
- prefix (SP, TSP shards: the last q of k keys, lower-right causal): one SDPA call with a lower-right
  causal bias and GQA's K/V repeated (masked_shard_attention), against shard_attention (off-diagonal
  and diagonal blocks merged by their log-sum-exps).

Each path's efficiency is its useful FLOPs over time over the peak, as meshplan.executor.calibrate_run
counts them — 4·a·d·(q·k − q²/2) forward, 3.5× that forward + backward — at the keys of
meshplan/costmodel/device.py's ATTENTION_EFFICIENCY_CAUSAL / _PREFIX tables (32 query heads, 8 KV heads,
head dim 128: Llama-3-8B at TP 1), so `tables` holds what those tables would read with the new paths.
Before timing, `check` holds each fused kernel's shard blocks against the float64 plain-torch blocks.

    python benchmarks/bench_attention_paths.py --out $OUT/attention-paths-h100.json
    python benchmarks/bench_attention_paths.py --device cpu --quick --out /tmp/paths.json   (the plumbing only)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from meshplan.executor.attention import (
    CUDNN_BLOCKS,
    FLASH_BLOCKS,
    MATH_BLOCKS,
    _cudnn_takes,
    _flash_takes,
    _ShardAttention,
    causal_attention,
    masked_shard_attention,
    shard_attention,
    shard_blocks,
)
from meshplan.executor.run import timed

# H100 SXM dense bf16, the peak meshplan.executor.calibrate_run divides by (MESHPLAN_PEAK_TFLOPS)
PEAK_TFLOPS = 989.4
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
CAUSAL_KEYS = (4096, 16384, 32768)  # ATTENTION_EFFICIENCY_CAUSAL's
PREFIX_KEYS = (8192, 16384, 32768)  # ATTENTION_EFFICIENCY_PREFIX's, at keys / 2 queries as calibrate_run
SHARD_SPLITS = (2, 4, 8)  # a contiguous SP split's last shard: keys / splits queries
QUICK = {"heads": 4, "kv_heads": 2, "head_dim": 32, "causal": (256,), "prefix": (512,), "splits": (2, 4)}


def useful_flops(queries: int, keys: int, heads: int, head_dim: int) -> float:
    """Forward + backward FLOPs of lower-right causal attention of `queries` over `keys`."""
    return 3.5 * 4 * heads * head_dim * (queries * keys - queries * queries / 2)


def executor_tensors(queries, keys, heads, kv_heads, head_dim, device, dtype=torch.bfloat16):
    """q (1, a, queries, d) a view of a fused QKV projection; k, v (1, a_kv, keys, d) slices of a
    gathered (1, keys, a_kv, d) sequence, as the executor's layouts pass them; all requiring grad."""
    q_w, kv_w = heads * head_dim, kv_heads * head_dim
    qkv = torch.randn(1, queries, q_w + 2 * kv_w, device=device, dtype=dtype, requires_grad=True)
    q = qkv[..., :q_w].view(1, queries, heads, head_dim).transpose(1, 2)
    k, v = (torch.randn(1, keys, kv_heads, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    if queries == keys:  # whole sequence: K/V from the same projection
        k = qkv[..., q_w : q_w + kv_w].view(1, keys, kv_heads, head_dim)
        v = qkv[..., q_w + kv_w :].view(1, keys, kv_heads, head_dim)
        return q, k.transpose(1, 2), v.transpose(1, 2), [qkv]
    return q, k.transpose(1, 2), v.transpose(1, 2), [qkv, k, v]


def step_seconds(fn, queries, keys, heads, kv_heads, head_dim, device, reps) -> float:
    q, k, v, leaves = executor_tensors(queries, keys, heads, kv_heads, head_dim, device)
    go = torch.randn_like(q)

    def step():
        fn(q, k, v).backward(go)
        for leaf in leaves:
            leaf.grad = None

    cuda = device == "cuda"
    timed(step, 3, cuda)  # warm-up: cuDNN builds its graphs, caches settle
    return statistics.median(timed(step, reps, cuda))


def compare(path, old, new, queries, keys, shape, device, reps, peak) -> dict:
    heads, kv_heads, head_dim = shape
    flops = useful_flops(queries, keys, heads, head_dim)
    old_s = step_seconds(old, queries, keys, heads, kv_heads, head_dim, device, reps)
    new_s = step_seconds(new, queries, keys, heads, kv_heads, head_dim, device, reps)
    q, k, v, _ = executor_tensors(queries, keys, heads, kv_heads, head_dim, device)
    if queries == keys:
        picked = "cudnn" if _cudnn_takes(q, k, v, True) else "sdpa-default"
    else:
        blocks = shard_blocks(q, k, v)
        picked = blocks.name if blocks else "masked"
    return {
        "path": path,
        "queries": queries,
        "keys": keys,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "new_kernel": picked,
        "old_ms": old_s * 1e3,
        "new_ms": new_s * 1e3,
        "speedup": old_s / new_s,
        "old_efficiency": flops / old_s / peak,
        "new_efficiency": flops / new_s / peak,
    }


def _sdpa_default(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


def check(device: str, shape, queries: int, keys: int) -> list[dict]:
    """Each blocks kernel that takes this shard on `device` against the float64 plain-torch blocks: the
    largest error of the output and each gradient over the largest magnitude of the reference."""
    heads, kv_heads, head_dim = shape
    torch.manual_seed(0)
    q, k, v, _ = executor_tensors(queries, keys, heads, kv_heads, head_dim, device)
    inputs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    go = torch.randn_like(q)
    exact = [t.detach().double().requires_grad_(True) for t in inputs]
    ref_out = _ShardAttention.apply(*exact, MATH_BLOCKS)
    ref = [ref_out, *torch.autograd.grad(ref_out, exact, go.double())]
    kinds = [MATH_BLOCKS]
    if device == "cuda":
        past = keys - queries
        diag, off = (q, k[:, :, past:], v[:, :, past:]), (q, k[:, :, :past], v[:, :, :past])
        for blocks, takes in ((CUDNN_BLOCKS, _cudnn_takes), (FLASH_BLOCKS, _flash_takes)):
            if takes(*diag, True) and takes(*off, False):
                kinds.append(blocks)
    rows = []
    for blocks in kinds:
        out = _ShardAttention.apply(*inputs, blocks)
        got = [out, *torch.autograd.grad(out, inputs, go)]
        errors = {
            name: ((g.double() - r).abs().max() / r.abs().max()).item()
            for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref)
        }
        rows.append({"blocks": blocks.name, "queries": queries, "keys": keys, "dtype": "bfloat16", **errors})
    return rows


def run(device: str, quick: bool, reps: int, peak_tflops: float) -> dict:
    if quick:
        shape = (QUICK["heads"], QUICK["kv_heads"], QUICK["head_dim"])
        causal_keys, prefix_keys, splits = QUICK["causal"], QUICK["prefix"], QUICK["splits"]
    else:
        shape, causal_keys, prefix_keys, splits = (HEADS, KV_HEADS, HEAD_DIM), CAUSAL_KEYS, PREFIX_KEYS, SHARD_SPLITS
    peak = peak_tflops * 1e12
    checks = check(device, shape, 256 if quick else 1024, 768 if quick else 4096)
    cases = [("causal", _sdpa_default, causal_attention, keys, keys) for keys in causal_keys]
    for keys in prefix_keys:
        for split in sorted({2, *splits}):
            cases.append(("prefix", masked_shard_attention, shard_attention, keys // split, keys))
    rows = []
    for path, old, new, queries, keys in cases:
        r = compare(path, old, new, queries, keys, shape, device, reps, peak)
        rows.append(r)
        print(
            f"{path:6} q {queries:6} k {keys:6}  old {r['old_ms']:8.2f} ms {r['old_efficiency']:.3f}"
            f"  new ({r['new_kernel']}) {r['new_ms']:8.2f} ms {r['new_efficiency']:.3f}  ×{r['speedup']:.2f}",
            flush=True,
        )
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"check": checks, "rows": rows, "tables": efficiency_tables(rows)}


def efficiency_tables(rows: list[dict]) -> dict:
    """The new paths' efficiencies as device.py's tables read: causal by keys, prefix at keys / 2 queries."""
    causal = [(r["keys"], round(r["new_efficiency"], 3)) for r in rows if r["path"] == "causal"]
    prefix = [
        (r["keys"], round(r["new_efficiency"], 3))
        for r in rows
        if r["path"] == "prefix" and 2 * r["queries"] == r["keys"]
    ]
    return {"ATTENTION_EFFICIENCY_CAUSAL": causal, "ATTENTION_EFFICIENCY_PREFIX": prefix}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="tiny shapes: the plumbing, not a measurement")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    args = ap.parse_args(argv)
    result = run(args.device, args.quick, args.reps, args.peak_tflops)
    meta = {"command": "python benchmarks/bench_attention_paths.py " + " ".join(argv or sys.argv[1:])}
    meta["torch"] = torch.__version__
    meta["cudnn"] = torch.backends.cudnn.version() if args.device == "cuda" else None
    meta["gpu"] = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    meta["peak_tflops"] = args.peak_tflops
    with open(args.out, "w") as f:
        json.dump({**meta, **result}, f, indent=1)
    for c in result["check"]:
        print(f"check {c['blocks']:5}: " + ", ".join(f"{k} {c[k]:.1e}" for k in ("out", "dq", "dk", "dv")))
    print(json.dumps(result["tables"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

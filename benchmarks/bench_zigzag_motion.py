"""The rate of the zigzag shard's data motion on one GPU: meshplan.executor.layouts.common.attend_zigzag forward
+ backward with its attention kernels stubbed (outputs allocated, not computed) timed on the GPU as a CUDA-graph
replay (call by call beside it: `call_ms`, where the host issuing its small ops shows), over the bytes
benchmarks/zigzag_bytes.py counts for the same call on the CPU — as a fraction of the rated HBM rate, what
blocks/attention.shard_motion_s prices the motion at (device.ZIGZAG_MOTION_HBM_FRACTION).

    PYTHONPATH=. python benchmarks/bench_zigzag_motion.py --rated-tb-per-s 4.8 --out $OUT/zigzag-motion-h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import zigzag_bytes  # noqa: E402

import meshplan.executor.attention as attention  # noqa: E402
import meshplan.executor.layouts.common as common  # noqa: E402
from meshplan.executor.run import graph_replay_s, median_time_s  # noqa: E402

# (tokens of the sequence, ranks, heads, kv heads): dense-7b's and Llama-3-8B's attention at 16K-64K over 2-4 shards
SHAPES = ((16384, 2, 32, 32), (16384, 2, 32, 8), (32768, 4, 32, 8), (65536, 2, 32, 8))


def gpu_call(seq: int, parts: int, index: int, heads: int, kv_heads: int, d: int = 128):
    """Rank `index`'s attend_zigzag forward and backward on the GPU, the kernels stubbed (as zigzag_bytes.count)."""
    t = seq // parts
    q = torch.randn(1, t, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, seq, kv_heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dy = torch.randn(1, t, heads * d, device="cuda", dtype=torch.bfloat16)
    keys = common.ZigzagKeys(seq, parts, index)

    def call():
        common.attend_zigzag(q, k, v, keys).reshape(1, t, heads * d).backward(dy)
        q.grad = k.grad = v.grad = None

    return call


def _stub_forward(q, k, v, causal):
    """zigzag_bytes' stub on q's device: outputs allocated, nothing computed."""
    return torch.empty_like(q), torch.empty(q.shape[:3], device=q.device), None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rated-tb-per-s", type=float, required=True)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    rated = args.rated_tb_per_s * 1e12
    stub = attention.Blocks("stub", _stub_forward, zigzag_bytes._stub_backward)
    saved = (attention.shard_blocks, attention.run_blocks, common.shard_attention)
    rows = []
    for seq, parts, heads, kv_heads in SHAPES:
        index = parts - 1  # the busiest rank (zigzag_bytes and the cost model price it)
        nbytes = sum(zigzag_bytes.count(seq, parts, index, heads, kv_heads, attention.ZIGZAG_RUNS).bytes.values())
        attention.shard_blocks = lambda q, k, v: stub
        attention.run_blocks = lambda q, k, v, plan: stub
        common.shard_attention = lambda q, k, v: attention._ShardAttention.apply(q, k, v, stub)
        try:
            call = gpu_call(seq, parts, index, heads, kv_heads)
            s_call = median_time_s(call, args.reps)
            s = graph_replay_s(call, args.reps)  # the GPU's time: the host issuing ~100 small ops is not in it
        finally:
            attention.shard_blocks, attention.run_blocks, common.shard_attention = saved
        row = {"seq": seq, "parts": parts, "heads": heads, "kv_heads": kv_heads, "ms": s * 1e3, "call_ms": s_call * 1e3}
        row["gb"] = nbytes / 1e9
        row["fraction_of_rated"] = nbytes / s / rated
        rows.append(row)
        print(f"{seq:>6} / {parts} {heads:>3} x {kv_heads:>3}: {s * 1e3:7.3f} ms {nbytes / 1e9:6.2f} GB "
              f"{row['fraction_of_rated']:.2f} of rated", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    out = {
        "command": f"PYTHONPATH=. python benchmarks/bench_zigzag_motion.py --rated-tb-per-s {args.rated_tb_per_s}",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "zigzag_runs": attention.ZIGZAG_RUNS,
        "rows": rows,
    }
    json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()

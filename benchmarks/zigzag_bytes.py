"""Bytes a zigzag sequence shard's attention moves outside its attention kernels, by aten op, for the two
paths of meshplan.executor.layouts.common.attend_zigzag (attention.ZIGZAG_RUNS): the gathered keys put in
position order first, or taken as runs where the all-gather left them. Counted on the CPU with the kernels
stubbed (their outputs allocated, not computed), each op's tensor arguments read and its outputs written —
an upper count for fills and in-place ops; views move nothing. One layer's attention forward and backward
(without the recompute the executor's sequence shards run: the forward's ops once more).

    python benchmarks/zigzag_bytes.py [--seq 16384 --parts 2 --heads 32 --kv-heads 32] > FILE
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import meshplan.executor.attention as attention
import meshplan.executor.layouts.common as common

VIEWS = {
    "view", "_unsafe_view", "transpose", "slice", "as_strided", "expand", "alias", "t", "permute", "select",
    "unsqueeze", "squeeze", "_reshape_alias", "detach", "empty", "empty_like", "split", "chunk", "unbind",
    "reshape", "lift_fresh", "new_empty", "empty_strided", "is_same_size", "promote_types",
}  # fmt: skip


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes, self.calls = defaultdict(float), defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            moved = _size(list(args)) + _size(list((kwargs or {}).values())) + _size(out)
            if name in ("copy_", "fill_", "zero_"):  # in place: its first argument written, not read too
                moved = _size(list(args)) if name == "copy_" else _size(args[0])
            self.bytes[name] += moved
            self.calls[name] += 1
        return out


def _size(x) -> float:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_size(y) for y in x)
    return 0


def _stub_forward(q, k, v, causal):
    return torch.empty_like(q), torch.empty(q.shape[:3]), None


def _stub_backward(dout, q, k, v, out, lse, causal, extra):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


STUB = attention.Blocks("stub", _stub_forward, _stub_backward)


def count(seq: int, parts: int, index: int, heads: int, kv_heads: int, runs: bool, d: int = 128) -> _Count:
    """Rank `index`'s attend_zigzag forward and backward, counted; the kernels stubbed meanwhile only."""
    saved = (attention.ZIGZAG_RUNS, attention.shard_blocks, attention.run_blocks, common.shard_attention)
    attention.ZIGZAG_RUNS = runs
    attention.shard_blocks = lambda q, k, v: STUB
    attention.run_blocks = lambda q, k, v, plan: STUB
    common.shard_attention = lambda q, k, v: attention._ShardAttention.apply(q, k, v, STUB)  # no whole-chunk SDPA
    try:
        t = seq // parts
        q = torch.randn(1, t, heads, d, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(1, seq, kv_heads, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        dy = torch.randn(1, t, heads * d, dtype=torch.bfloat16)
        keys = common.ZigzagKeys(seq, parts, index)
        counted = _Count()
        with counted:
            common.attend_zigzag(q, k, v, keys).reshape(1, t, heads * d).backward(dy)
        return counted
    finally:
        attention.ZIGZAG_RUNS, attention.shard_blocks, attention.run_blocks, common.shard_attention = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    args = ap.parse_args()
    gathered = args.seq * args.kv_heads * 128 * 2
    print(f"# python benchmarks/zigzag_bytes.py --seq {args.seq} --parts {args.parts} --heads {args.heads} "
          f"--kv-heads {args.kv_heads}; G = the gathered K, {gathered / 1e6:.0f} MB")  # fmt: skip
    for index in range(args.parts):
        for runs in (False, True):
            c = count(args.seq, args.parts, index, args.heads, args.kv_heads, runs)
            total = sum(c.bytes.values())
            print(f"rank {index} {'runs   ' if runs else 'reorder'}: {total / 1e9:.2f} GB = {total / gathered:.1f} G")
            for name, moved in sorted(c.bytes.items(), key=lambda kv: -kv[1]):
                print(f"    {name:16s} x{c.calls[name]:3d} {moved / gathered:6.2f} G")


if __name__ == "__main__":
    main()

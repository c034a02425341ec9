"""Packed against padded training of a Mamba-2 stack on a skewed length mix (PackMamba's comparison).

    python benchmarks/bench_packing.py --out $OUT/packing.json      (one GPU)

The same sequences (a long-tailed mix: most short, a few near the maximum) trained for one epoch
(forward + backward) in rows of `row_len` tokens, 4 rows a step: padded, every sequence in its own
row padded to row_len; packed, sequences placed first-fit in rows with seq_idx (no state crosses a
boundary: the Triton conv and the Triton chunked scan reset there, forward and backward). Speed-up =
padded time / packed time for the same real tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch

from meshplan.executor.blocks import Mamba2Block
from meshplan.kernels.packing import pack
from meshplan.models import PRESETS


def lengths(n: int, row_len: int, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.exp(torch.randn(n, generator=gen) * 1.1 + 6.3)  # log-normal: median ~540 tokens
    return [int(min(row_len, max(16, v))) for v in raw.tolist()]


def epoch_s(layers, rows: torch.Tensor, seq_idx: torch.Tensor | None, rows_per_step: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(0, rows.shape[0], rows_per_step):
        x = rows[i : i + rows_per_step].requires_grad_(True)
        idx = seq_idx[i : i + rows_per_step] if seq_idx is not None else None
        h = x
        for layer in layers:
            h = layer(h, idx)
        h.float().square().mean().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sequences", type=int, default=96)
    ap.add_argument("--row-len", type=int, default=8192)
    args = ap.parse_args()
    model = replace(PRESETS["mamba2-2.7b"], layers=2)
    torch.manual_seed(0)
    with torch.device("cuda"):
        layers = torch.nn.ModuleList(Mamba2Block(model) for _ in range(2)).to(torch.bfloat16)
    lens = lengths(args.sequences, args.row_len)
    gen = torch.Generator(device="cuda").manual_seed(1)
    seqs = [torch.randn(m, model.d_model, device="cuda", dtype=torch.bfloat16, generator=gen) for m in lens]
    packed = pack(seqs, args.row_len)
    padded = torch.zeros(len(seqs), args.row_len, model.d_model, device="cuda", dtype=torch.bfloat16)
    for i, s in enumerate(seqs):
        padded[i, : s.shape[0]] = s
    # Padding gets its own sequence number so it cannot leak into the real tokens either way.
    pad_idx = (torch.arange(args.row_len, device="cuda")[None, :] >= torch.tensor(lens, device="cuda")[:, None]).int()
    epoch_s(layers, packed.rows[:4], packed.seq_idx[:4], 4)  # warm-up (Triton compile, allocator)
    t_packed = min(epoch_s(layers, packed.rows, packed.seq_idx, 4) for _ in range(2))
    t_padded = min(epoch_s(layers, padded, pad_idx, 4) for _ in range(2))
    real = sum(lens)
    out = {
        "command": "python benchmarks/bench_packing.py --out $OUT/packing.json",
        "gpu": torch.cuda.get_device_name(0),
        "model": "mamba2-2.7b, 2 layers, bf16",
        "sequences": len(lens),
        "real_tokens": real,
        "row_len": args.row_len,
        "packed_rows": packed.rows.shape[0],
        "padded_rows": len(lens),
        "packed_epoch_s": t_packed,
        "padded_epoch_s": t_padded,
        "packed_over_padded_speedup": t_padded / t_packed,
        "padding_overhead": len(lens) * args.row_len / real,
        "lengths": lens,
    }
    json.dump(out, open(args.out, "w"), indent=1)
    print(
        f"{len(lens)} sequences, {real:,} real tokens; padded {len(lens)} rows ({out['padding_overhead']:.2f}× "
        f"tokens), "
        f"packed {packed.rows.shape[0]} rows"
    )
    print(f"epoch: padded {t_padded:.2f} s, packed {t_packed:.2f} s → {out['packed_over_padded_speedup']:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

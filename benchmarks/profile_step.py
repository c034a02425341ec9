"""Where a training step's GPU time goes, by kernel category, next to the cost model's components.

    python benchmarks/profile_step.py --out $OUT/profile.json      (one GPU)
    python benchmarks/profile_step.py --model mamba2-2.7b --out $OUT/profile-mamba2.json

A preset's stack (2 layers, bf16; the 7B-shaped dense model by default) on one GPU at 4K / 16K / 32K
tokens: torch.profiler's CUDA kernel times grouped by name into GEMM, attention, scan and conv,
optimizer and the rest (elementwise, norms, copies), against the model's components.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from meshplan.costmodel.blocks import BLOCKS
from meshplan.costmodel.device import Device
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.step import estimate_step
from meshplan.executor.blocks import Stack
from meshplan.executor.optim import MixedAdam
from meshplan.executor.parallelize import run_layers
from meshplan.executor.profiling import category
from meshplan.layout import Layout
from meshplan.models import PRESETS
from meshplan.topologies import load_cluster


def two_layer_step(model, seq: int):
    """The eager training step of `model`'s 2-layer stack (bf16, seeded) on one sequence of `seq` random
    hidden states on the GPU: forward, backward from a random gradient, MixedAdam, gradients let go."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        stack = Stack(model, 2).to(torch.bfloat16)
    x = torch.randn(1, seq, model.d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    opt = MixedAdam(stack.parameters())

    def step():
        run_layers(stack.layers, x).backward(dy)
        opt.step()
        opt.zero_grad()
        x.grad = None

    return step


def profile_one(model, cluster, seq: int) -> dict:
    step = two_layer_step(model, seq)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    by_cat: dict[str, float] = defaultdict(float)
    top: dict[str, float] = defaultdict(float)
    kernels = 0
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            t = evt.device_time / 1e6 / 3  # µs → s, per step
            by_cat[category(evt.name)] += t
            top[evt.name] += t
            kernels += 1
    b = estimate_step(
        replace(model, param_dtype="bf16"), Layout(), seq, 1, CostOptions(), cluster, embeddings=False
    ).breakdown
    return {
        "raw_memory_bound_s": raw_memory_bound_s(model, cluster, seq),
        "seq": seq,
        "measured_s": dict(by_cat),
        "kernels_per_step": kernels / 3,
        "predicted_s": {
            "gemm": b["gemm_s"],
            "attention": b["attention_s"],
            "memory_bound": b["memory_bound_s"],
            "optimizer": b["optimizer_s"],
        },
        "top_kernels": sorted(top.items(), key=lambda kv: -kv[1])[:12],
    }


def raw_memory_bound_s(model, cluster, seq: int) -> dict[str, float]:
    """Seconds of each block kind's memory-bound bytes (BlockKind.memory_bound_bytes_per_token, bf16) over a
    training step at one pass per tensor — forward once, backward at twice forward — at the GPU's rated
    HBM: what the measured elementwise time over it gives as that kind's eager factor (device.py)."""
    dev = Device.of(cluster)
    out: dict[str, float] = defaultdict(float)
    for kind, n in model.block_invocations():
        out[kind] += 3 * n * seq * BLOCKS[kind].memory_bound_bytes_per_token(model, 1, 2) / dev.rated_hbm
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="dense-7b")
    ap.add_argument("--seqs", default="4096,16384,32768", help="comma list of training lengths")
    args = ap.parse_args()
    model = replace(PRESETS[args.model], layers=2, name=f"{args.model}/2L")
    cluster = load_cluster("h200-8")
    rows = []
    for seq in (int(x) for x in args.seqs.split(",")):
        rows.append(profile_one(model, cluster, seq))
        torch.cuda.empty_cache()
    json.dump(
        {
            "command": (
                f"python benchmarks/profile_step.py --model {args.model} --seqs {args.seqs} --out $OUT/profile.json"
            ),
            "gpu": torch.cuda.get_device_name(0),
            "runs": rows,
        },
        open(args.out, "w"),
        indent=1,
    )
    for r in rows:
        m, p = r["measured_s"], r["predicted_s"]
        print(
            f"seq {r['seq']}: kernels/step {r['kernels_per_step']:.0f}; measured ms "
            + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(m.items()))
            + "; predicted ms "
            + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in p.items())
        )
        for name, t in r["top_kernels"][:8]:
            print(f"    {t * 1e3:7.2f} ms  {name[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

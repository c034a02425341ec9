"""Session-23 probe (2 GPUs): zigzag sequence shards attending the gathered keys where they arrived
(meshplan.executor.attention.zigzag_attention) against putting them in position order first (the path
before, attention.ZIGZAG_RUNS = False): a dense-7b-shaped 2-layer training step's time and peak under sp=2
and tsp=2, both paths in one process on the same GPUs, and the input gradient of one forward and backward
through the same layers by each path (their largest relative difference).

    timeout 300 torchrun --nproc-per-node 2 benchmarks/probes/s23_zigzag_probe.py --out $OUT/zigzag-probe.json
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import torch
import torch.distributed as dist

from meshplan.executor import attention
from meshplan.executor.comm import build_mesh
from meshplan.executor.parallelize import run_layers
from meshplan.executor.run import _build, combine_ranks, measure
from meshplan.layout import parse_layout
from meshplan.models import PRESETS


def _input_grad(model, layout, seq: int) -> torch.Tensor:
    mesh = build_mesh(layout)
    layers = _build(model, mesh, seq, "cuda", whole=False, int8_allreduce=False, checkpoint=None)
    gen = torch.Generator(device="cuda").manual_seed(11 + dist.get_rank())
    shape = (1, seq // layout.token_shard_degree, model.d_model)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    run_layers(layers, x).backward(dy)
    return x.grad.float()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--seq", type=int, default=16384)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    model = replace(PRESETS["dense-7b"], layers=2, name="dense-7b/2L", param_dtype="bf16")
    out: dict = {"seq": args.seq}
    for name in ("sp=2", "tsp=2"):
        layout = parse_layout(name)
        mesh = build_mesh(layout)
        grads = {}
        for runs in (False, True):
            attention.ZIGZAG_RUNS = runs
            r = measure(
                model,
                layout,
                mesh,
                args.seq,
                1,
                "train",
                steps=5,
                warmup=2,
                device="cuda",
                exposed=False,
                cuda_graph=False,
            )
            got = [None] * 2
            dist.all_gather_object(got, r)
            m = combine_ranks(got)
            key = f"{name} {'runs' if runs else 'reorder'}"
            out.setdefault(key, []).append({"step_time_s": m["step_time_s"], "peak_bytes": m["peak_bytes"]})
            grads[runs] = _input_grad(model, layout, 4096)
            torch.cuda.empty_cache()
            if rank == 0:
                print(f"{key}: {m['step_time_s'] * 1e3:.2f} ms, peak {m['peak_bytes'] / 2**30:.2f} GiB", flush=True)
        diff = ((grads[True] - grads[False]).norm() / grads[False].norm()).item()
        both = [None] * 2
        dist.all_gather_object(both, diff)
        out[f"{name} input-gradient difference"] = both
        if rank == 0:
            print(f"{name}: input gradient runs vs reorder, relative {both}", flush=True)
        if rank == 0 and args.out:  # after each layout: a run stopped by its timeout keeps what it measured
            with open(args.out, "w") as f:
                command = "timeout 300 torchrun --nproc-per-node 2 benchmarks/probes/s23_zigzag_probe.py"
                json.dump({"command": command, **out}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

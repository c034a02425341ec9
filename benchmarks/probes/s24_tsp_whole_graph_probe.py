"""Session-24 probe (2 GPUs): where does a whole model's TSP step hang when replayed as a CUDA graph?
(Session 23: dense-7b 2 layers at 4K, `meshplan execute --layout tsp=2`, hung after one replay; the
layers alone replay.) The refusal in graphs.limits is lifted in this process; --variant swaps one
piece of the whole model's TSP path for a plain all-gather, so that the variant that stops hanging
names the piece:

- whole: as the executor runs it;
- head-gather: the output head's column shards all-gathered instead of passed round the ring
  (layouts/vocab.py _TSPLogits: ring_shards and ring_weight_grads);
- emb-gather: the embedding's all-to-all done as an all-gather and a pick (layouts/vocab.py);
- both: the two;
- layers: the layer stack alone (the control that replayed in session 22).

Python's stacks are dumped after --dump seconds (faulthandler), so a hang shows where the host waits.

    bash benchmarks/sweeps/s24-tsp-whole-graph.sh      # every variant, each under its own timeout
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from meshplan.executor import graphs
from meshplan.executor.comm import build_mesh
from meshplan.executor.layouts import vocab
from meshplan.executor.run import combine_ranks, measure
from meshplan.layout import parse_layout
from meshplan.models import PRESETS


def _gathered(mesh, own, axis):
    ax = mesh.axis(axis)
    buf = torch.empty((ax.size * own.shape[0], *own.shape[1:]), dtype=own.dtype, device=own.device)
    dist.all_gather_into_tensor(buf, own.detach().contiguous(), group=ax.group)
    return buf.view(ax.size, *own.shape)


def ring_shards_by_gather(mesh, own, each, axis="tsp"):
    shards = _gathered(mesh, own, axis)
    for j in range(shards.shape[0]):
        each(j, shards[j])


def ring_weight_grads_by_gather(mesh, own, each, axis="tsp"):
    ax = mesh.axis(axis)
    grads = torch.empty(ax.size, own.numel(), dtype=own.dtype, device=own.device)

    def fill(j, shard):
        each(j, shard, grads[j].view_as(own))  # as comm.ring_weight_grads hands each hop its row

    ring_shards_by_gather(mesh, own, fill, axis)
    out = torch.empty(own.numel(), dtype=own.dtype, device=own.device)
    dist.reduce_scatter_tensor(out, grads.flatten(), group=ax.group)
    return out.view_as(own)


class AllToAllByGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mesh, axis):
        ctx.mesh, ctx.axis = mesh, axis
        ax = mesh.axis(axis)
        every = _gathered(mesh, x, axis)  # (D, D, ...): rank j's rows
        return every[:, ax.rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        ax = ctx.mesh.axis(ctx.axis)
        every = _gathered(ctx.mesh, grad.contiguous(), ctx.axis)
        return every[:, ax.rank].contiguous(), None, None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="whole", choices=["whole", "head-gather", "emb-gather", "both", "layers"])
    ap.add_argument("--model", default="dense-7b")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--dump", type=float, default=70.0)
    ap.add_argument("--exposed", action="store_true", help="also time the step without transfers, as execute does")
    ap.add_argument("--host-samples", type=int, default=1)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    faulthandler.dump_traceback_later(args.dump, exit=False, file=sys.stderr)
    if args.variant in ("head-gather", "both"):
        vocab.ring_shards, vocab.ring_weight_grads = ring_shards_by_gather, ring_weight_grads_by_gather
    if args.variant in ("emb-gather", "both"):
        vocab.AllToAll = AllToAllByGather
    graphs.limits = lambda *a, **k: None  # lifted for this process
    model = replace(PRESETS[args.model], layers=2, name=f"{args.model}/2L", param_dtype="bf16")
    layout = parse_layout("tsp=2")
    mesh = build_mesh(layout)
    t0 = time.time()
    r = measure(
        model,
        layout,
        mesh,
        args.seq,
        1,
        "train",
        steps=args.steps,
        warmup=1,
        device="cuda",
        exposed=args.exposed,
        cuda_graph=True,
        whole=args.variant != "layers",
        host_samples=args.host_samples,
        progress=lambda done, total, what, s: (
            print(f"rank {rank}: {what} ({done}/{total})", flush=True) if rank == 0 else None
        ),
    )
    got = [None] * 2
    dist.all_gather_object(got, r)
    faulthandler.cancel_dump_traceback_later()
    if rank == 0:
        m = combine_ranks(got)
        line = {
            "variant": args.variant,
            "model": args.model,
            "seq": args.seq,
            "step_time_ms": m["step_time_s"] * 1e3,
            "cuda_graph": m.get("cuda_graph"),
            "exposed": args.exposed,
            "step_time_no_comm_ms": m.get("step_time_no_comm_s", float("nan")) * 1e3,
            "wall_s": time.time() - t0,
        }
        print(json.dumps(line), flush=True)
        if args.out:
            json.dump(line, open(args.out, "w"), indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

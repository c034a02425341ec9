"""Session-22 probe (2 GPUs): does dense TSP's step replay as a CUDA graph? graphs.limits refuses every
TSP step since a Mamba-2 tsp=2 capture hung its first replay (session 21); here the refusal is lifted
for this process only and a dense-7b-shaped 2-layer tsp=2 step is timed eagerly, then captured.
Run under a timeout: a hang is the answer too. (Session 23: `--model`, and the Mamba-2 refusals lifted too;
run._graphed now puts the optimizer's bias corrections on the device itself — this probe's session-22
runs captured them as host constants: the suspected cause of their graph-vs-eager gap, checked in session 23.)
Then the check: the same weights trained 3 steps eagerly
(twice: the GPUs' own nondeterminism) and 3 steps through the graph (one eager warm-up, 2 replays); the
fp32 master weights' largest relative difference.

    timeout 150 torchrun --nproc-per-node 2 benchmarks/probes/s22_tsp_graph_probe.py --out $OUT/tsp-graph-probe.json
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import torch
import torch.distributed as dist

from meshplan.executor import graphs
from meshplan.executor.comm import build_mesh
from meshplan.executor.optim import MixedAdam
from meshplan.executor.parallelize import run_layers
from meshplan.executor.run import _build, _graphed, combine_ranks, measure
from meshplan.layout import parse_layout
from meshplan.models import PRESETS


def _train(model, layout, seq: int, graph: bool, steps: int = 3) -> list[torch.Tensor]:
    mesh = build_mesh(layout)
    layers = _build(model, mesh, seq, "cuda", whole=False, int8_allreduce=False, checkpoint=None)
    gen = torch.Generator(device="cuda").manual_seed(7 + dist.get_rank())
    shape = (1, seq // layout.token_shard_degree, model.d_model)
    # each step its own inputs, copied into the buffers the graph reads (a stale read would show)
    xs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(steps)]
    dys = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(steps)]
    x = xs[0].clone().requires_grad_(True)
    dy = dys[0].clone()

    def feed(k):
        with torch.no_grad():
            x.copy_(xs[k])
            dy.copy_(dys[k])

    opt = MixedAdam([p for layer in layers for p in layer.parameters()])
    start = [w.clone() for w in opt.master]  # how far training moved them: a check that reads 0 must move them

    class NoSync:  # no gradient summed over ranks, eagerly or captured (TSP's are reduce-scattered inside)
        def finish(self):
            pass

    def eager():
        run_layers(layers, x).backward(dy)
        opt.step()
        opt.zero_grad()
        x.grad = None

    if graph:
        step = _graphed(layers, x, dy, NoSync(), opt, eager, lambda n: None, 1, mesh)  # its warm-up: step 1
        for k in range(1, steps):
            feed(k)
            step()
    else:
        for k in range(steps):
            feed(k)
            eager()
    torch.cuda.synchronize()
    return [w.clone() for w in opt.master], start


def _rel(a, b) -> float:
    return max(((x - y).norm() / y.norm().clamp_min(1e-30)).item() for x, y in zip(a, b))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--layout", default="tsp=2", help="also tp=2, sp=2, dp=2: graphed by default, checked here too")
    ap.add_argument("--model", default="dense-7b", help="a preset; mamba2-130m lifts its TSP and tensor refusals too")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    model = replace(PRESETS[args.model], layers=2, name=f"{args.model}/2L", param_dtype="bf16")
    layout = parse_layout(args.layout)
    mesh = build_mesh(layout)
    original = graphs.limits

    def lifted(lay, mdl, mode, device, int8_allreduce=False):
        lift = lay.tsp > 1 or (mdl.mamba2 is not None and lay.tensor_degree > 1)  # the refusals made by measurement
        return None if lift else original(lay, mdl, mode, device, int8_allreduce)

    out = {}
    for name, graph in (("eager", False), ("graph", True)):
        graphs.limits = lifted if graph else original  # run.measure asks the module for it
        r = measure(
            model, layout, mesh, args.seq, 1, "train", steps=5, warmup=2, device="cuda", exposed=False, cuda_graph=graph
        )
        got = [None] * 2
        dist.all_gather_object(got, r)
        out[name] = combine_ranks(got)
        if rank == 0:
            m = out[name]
            graphed, loss = m.get("cuda_graph"), m.get("loss")
            print(f"{name}: {m['step_time_s'] * 1e3:.2f} ms, graphed {graphed}, loss {loss}", flush=True)
    graphs.limits = lifted
    (a, start), (b, _) = _train(model, layout, 2048, False), _train(model, layout, 2048, False)
    g, _ = _train(model, layout, 2048, True)
    check = [None] * 2
    moved = min(((x - y).norm() / y.norm().clamp_min(1e-30)).item() for x, y in zip(a, start))
    dist.all_gather_object(
        check, {"eager_vs_eager": _rel(b, a), "graph_vs_eager": _rel(g, a), "trained_least_moved": moved}
    )
    out["check"] = check
    if rank == 0:
        print(f"check (per rank): {check}", flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            command = "timeout 150 torchrun --nproc-per-node 2 benchmarks/probes/s22_tsp_graph_probe.py " + " ".join(
                f"--{k} {v}" for k, v in (("model", args.model), ("layout", args.layout), ("seq", args.seq))
            )
            json.dump({"command": command, **out}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

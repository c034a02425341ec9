"""Session-21 probe (one GPU): the executor's training step replayed as a CUDA graph (meshplan.executor.graphs)
against the same step launched kernel by kernel — first that it computes the same thing, then what it costs.

- check: a 2-layer stack (dense-7b and mamba2-2.7b shapes, 2K tokens) trained 3 steps eagerly and 3 steps
  through the graph (one eager warm-up step on a side stream, then 2 replays) from the same weights: the
  fp32 master weights' largest relative difference, beside two eager runs' (the GPU's own nondeterminism).
- time: run.measure with cuda_graph False and True at 4K and 16K: step time, peak memory, saved bytes,
  host issue time.

    PYTHONPATH=$PWD python benchmarks/probes/s21_graph_probe.py --out $OUT/graph-probe.json
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import torch
import torch.distributed as dist

from meshplan.executor.comm import build_mesh
from meshplan.executor.optim import MixedAdam
from meshplan.executor.parallelize import run_layers
from meshplan.executor.run import _build, _graphed, measure
from meshplan.layout import parse_layout
from meshplan.models import PRESETS


def _train(model, seq: int, graph: bool, steps: int = 3) -> list[torch.Tensor]:
    mesh = build_mesh(parse_layout("single"))
    layers = _build(model, mesh, seq, "cuda", whole=False, int8_allreduce=False, checkpoint=None)
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(1, seq, model.d_model, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
    dy = torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=gen)
    params = [p for layer in layers for p in layer.parameters()]
    opt = MixedAdam(params)

    class NoSync:
        def finish(self):
            pass

    def eager():
        run_layers(layers, x).backward(dy)
        opt.step()
        opt.zero_grad()
        x.grad = None

    if graph:
        assert opt.on_device_scalars() is None
        step = _graphed(layers, x, dy, NoSync(), opt, eager, lambda n: None, 1, mesh)  # its warm-up: step 1
        for _ in range(steps - 1):
            step()
    else:
        for _ in range(steps):
            eager()
    torch.cuda.synchronize()
    return [w.clone() for w in opt.master]


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).norm() / y.norm().clamp_min(1e-30)).item() for x, y in zip(a, b))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqs", default="4096,16384")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29535")
    dist.init_process_group("nccl", rank=0, world_size=1)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "check": [], "time": []}
    for name in ("dense-7b", "mamba2-2.7b"):
        model = replace(PRESETS[name], layers=2, param_dtype="bf16")
        eager_a, eager_b = _train(model, 2048, False), _train(model, 2048, False)
        graphed = _train(model, 2048, True)
        rec = {
            "model": name,
            "seq": 2048,
            "eager_vs_eager": _rel(eager_b, eager_a),
            "graph_vs_eager": _rel(graphed, eager_a),
        }
        print(rec, flush=True)
        out["check"].append(rec)
        torch.cuda.empty_cache()
        for seq in map(int, args.seqs.split(",")):
            for graph in (False, True):
                mesh = build_mesh(parse_layout("single"))
                r = measure(model, parse_layout("single"), mesh, seq, 1, "train", steps=10, warmup=3, cuda_graph=graph)
                rec = {
                    "model": name,
                    "seq": seq,
                    "cuda_graph": r["cuda_graph"],
                    "step_ms": r["step_time_s"] * 1e3,
                    "step_ms_all": [t * 1e3 for t in r["step_times_s"]],
                    "peak_gib": r["peak_bytes"] / 2**30,
                    "saved_gib": r["saved_bytes"] / 2**30,
                    "host_enqueue_ms": r["host_enqueue_s"] * 1e3,
                }
                print(rec, flush=True)
                out["time"].append(rec)
                del r
                torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

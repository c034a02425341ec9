"""Session-20 probe (one GPU): where the dense 4K step and the MoE step spend their time.

1. dense-7b, 2 layers, 4K, one GPU: meshplan's step profiled by kernel category, and the compiled peer's
   (benchmarks/peers.py PeerLayer under torch.compile) likewise.
2. mixtral-8x7b's MoE MLP, one layer, 4K tokens: the aten ops that launch the step's copies (profiler
   key averages, CPU ops with their device time).
3. torch._grouped_mm on Mixtral's expert shapes: a weight stored (E, 2f, h) and passed transposed (as
   executor.experts does today) against one stored (E, h, 2f) passed as it is; forward + backward.

    python benchmarks/probes/s20_profile_probe.py --out $OUT/s20-probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from meshplan.executor.profiling import profile_step  # noqa: E402
from meshplan.executor.run import timed  # noqa: E402
from meshplan.models import PRESETS  # noqa: E402


def dense_profiles(out: dict) -> None:
    import torch.distributed as dist
    from peers import PeerLayer, peer_layers  # noqa: F401

    from meshplan.executor.comm import build_mesh
    from meshplan.executor.optim import MixedAdam
    from meshplan.executor.run import measure
    from meshplan.layout import parse_layout

    model = replace(PRESETS["dense-7b"], layers=2)
    lay = parse_layout("single")
    mesh = build_mesh(lay, [0])
    res = measure(model, lay, mesh, 4096, 1, "train", steps=5, warmup=3, profile=25, exposed=False, host_samples=1)
    out["dense_meshplan_4k"] = {"step_ms": res["step_time_s"] * 1e3, "phases": res.get("phases_s")}
    torch.cuda.empty_cache()
    for compiled in (False, True):
        layers = peer_layers(model, "cuda", torch.bfloat16)
        if compiled:
            for i, layer in enumerate(layers):
                layers[i] = torch.compile(layer)
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(1, 4096, model.d_model, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        opt = MixedAdam(layers.parameters())

        def step():
            h = x
            for layer in layers:
                h = layer(h)
            h.backward(dy)
            opt.step()
            opt.zero_grad()
            x.grad = None

        timed(step, 3, True)
        ms = statistics.median(timed(step, 5, True)) * 1e3
        out[f"dense_peer_{'compile' if compiled else 'eager'}_4k"] = {
            "step_ms": ms,
            "phases": profile_step(step, top=25),
        }
        layers = opt = None  # freed before the next variant (del would leave step() naming unbound names)
        torch.cuda.empty_cache()
    dist.barrier()


def moe_ops(out: dict) -> None:
    from torch.profiler import ProfilerActivity, profile

    from meshplan.executor.blocks import MoEMLP

    model = replace(PRESETS["mixtral-8x7b"], layers=1)
    torch.manual_seed(0)
    moe = MoEMLP(model).to("cuda", torch.bfloat16)
    x = torch.randn(1, 4096, model.d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def step():
        moe(x).backward(dy)
        for p in moe.parameters():
            p.grad = None

    timed(step, 3, True)
    ms = statistics.median(timed(step, 5, True)) * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "self_device_time_total", 0) or 0
        tot = getattr(e, "device_time_total", 0) or 0
        if tot > 50:
            rows.append({"op": e.key[:100], "count": e.count, "self_device_us": dev, "device_us": tot})
    rows.sort(key=lambda r: -r["device_us"])
    out["moe_mixtral_1layer"] = {"fwd_bwd_ms": ms, "ops": rows[:60]}
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=45), flush=True)


def grouped_layouts(out: dict) -> None:
    e, t, h, f = 8, 8192, 4096, 14336
    offs = torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * (t // e)
    a = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    res = {}
    for name in ("stored_out_in_transposed", "stored_in_out"):
        if name == "stored_out_in_transposed":
            w = torch.randn(e, 2 * f, h, device="cuda", dtype=torch.bfloat16).mul_(0.01).requires_grad_()
            view = lambda: w.transpose(-2, -1)  # noqa: E731
        else:
            w = torch.randn(e, h, 2 * f, device="cuda", dtype=torch.bfloat16).mul_(0.01).requires_grad_()
            view = lambda: w  # noqa: E731
        g = torch.randn(t, 2 * f, device="cuda", dtype=torch.bfloat16)

        def step():
            torch._grouped_mm(a, view(), offs=offs).backward(g)
            w.grad = None
            a.grad = None

        timed(step, 3, True)
        ms = statistics.median(timed(step, 10, True)) * 1e3
        res[name] = {"fwd_bwd_ms": ms, "phases": profile_step(step, top=8)}
        w = None  # freed before the next layout
        torch.cuda.empty_cache()
    out["grouped_mm_layouts"] = res


def main() -> int:
    import os

    import torch.distributed as dist

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    out: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for part in (grouped_layouts, moe_ops, dense_profiles):
        try:
            part(out)
        except Exception as exc:  # noqa: BLE001 — a probe: record and go on
            out[part.__name__ + "_error"] = repr(exc)
        Path(args.out).write_text(json.dumps(out, indent=1))
        torch.cuda.empty_cache()
    print(json.dumps({k: v for k, v in out.items() if k != "moe_mixtral_1layer"}, indent=1)[:8000])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What is live on the GPU at a layout's memory peak, by the line that allocated it, next to the cost
model's components: the evidence for fixing a memory prediction.

    torchrun --nproc-per-node 4 benchmarks/memory_peak.py --layouts "tp=4;tsp=4;sp=4" --seq 65536 \
        --out $OUT/memory-peak.json

Each layout runs one training (or --mode) step of the preset's stack (2 layers, bf16) under the CUDA
caching allocator's history recorder. Rank 0 replays its trace of allocations and frees, finds the
largest total allocated, and lists the blocks live at that moment grouped by the innermost meshplan
source line that allocated them (or torch's, for blocks the autograd engine allocates).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from meshplan.executor.comm import build_mesh
from meshplan.executor.run import measure, use_expandable_segments
from meshplan.layout import parse_layout
from meshplan.models import PRESETS
from meshplan.predict import predict_run


def _site(frames: list[dict]) -> str:
    """The innermost frame in meshplan's own code, else the innermost Python frame."""
    for f in frames:
        if "/meshplan/" in f["filename"]:
            return f"{f['filename'].split('/meshplan/')[-1]}:{f['line']} {f['name']}"
    for f in frames:
        if f["filename"].endswith(".py"):
            return f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"
    return "(no Python frame)"


def live_at_peak(trace: list[dict]) -> tuple[int, dict[str, int], str]:
    """Replay one device's allocator trace: (peak allocated bytes, bytes live at the peak by site,
    the site of the allocation that reached the peak). Blocks count from 'alloc' to 'free_completed'."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    peak_site = ""
    best: dict[int, tuple[int, str]] = {}
    for ev in trace:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], _site(ev.get("frames", [])))
            total += ev["size"]
            if total > peak:
                peak, peak_site, best = total, live[ev["addr"]][1], dict(live)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    by_site: dict[str, int] = defaultdict(int)
    for size, site in best.values():
        by_site[site] += size
    return peak, dict(sorted(by_site.items(), key=lambda kv: -kv[1])), peak_site


def main() -> int:
    use_expandable_segments()
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layouts", required=True, help="layouts separated by ';'")
    ap.add_argument("--seq", type=int, default=65536)
    ap.add_argument("--model", default="dense-7b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--mode", default="train")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--whole", action="store_true", help="the whole model: embedding, head, logits and loss")
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = replace(PRESETS[args.model], layers=args.layers, name=f"{args.model}/{args.layers}L", param_dtype="bf16")
    results = []
    for text in filter(None, args.layouts.split(";")):
        layout = parse_layout(text)
        mesh = build_mesh(layout, list(range(layout.world_size)))
        entry = None
        if mesh is not None:
            torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
            m = measure(
                model,
                layout,
                mesh,
                args.seq,
                args.batch,
                args.mode,
                steps=1,
                warmup=1,
                device=f"cuda:{torch.cuda.current_device()}",
                exposed=False,
                whole=args.whole,
            )
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            trace = snap["device_traces"][torch.cuda.current_device()]
            peak, by_site, peak_site = live_at_peak(trace)
            entry = {
                "layout": str(layout),
                "seq": args.seq,
                "mode": args.mode,
                "whole_model": args.whole,
                "step_time_s": m["step_time_s"],
                "max_memory_allocated": m["peak_bytes"],
                "replayed_peak": peak,
                "peak_reached_at": peak_site,
                "trace_events": len(trace),
                "live_at_peak_by_site": dict(list(by_site.items())[: args.top]),
            }
            torch.cuda.empty_cache()
        got = [None] * world if rank == 0 else None
        dist.gather_object(entry, got, dst=0)
        if rank == 0:
            entry = got[0]
            pred = predict_run(model, layout, args.seq, args.batch, args.mode, None, whole=args.whole)
            entry["predicted"], entry["predicted_peak"] = pred["memory_breakdown"], pred["peak_bytes"]
            results.append(entry)
            print(
                f"{entry['layout']} s={args.seq}: max allocated {entry['max_memory_allocated'] / 2**30:.2f} GiB "
                f"(predicted {entry['predicted_peak'] / 2**30:.2f}), "
                f"replayed peak {entry['replayed_peak'] / 2**30:.2f} GiB, reached at {entry['peak_reached_at']}",
                flush=True,
            )
            for site, b in entry["live_at_peak_by_site"].items():
                print(f"   {b / 2**30:8.3f} GiB  {site}", flush=True)
            print(
                "   predicted: " + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in entry["predicted"].items() if v),
                flush=True,
            )
            with open(args.out, "w") as f:
                json.dump(
                    {
                        "command": "torchrun --nproc-per-node N benchmarks/memory_peak.py "
                        + " ".join(f"--{k.replace('_', '-')} '{v}'" for k, v in vars(args).items() if k != "out"),
                        "runs": results,
                    },
                    f,
                    indent=1,
                )
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

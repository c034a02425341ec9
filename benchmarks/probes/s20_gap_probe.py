"""Session-20 probe (one GPU): where the dense 4K training step's GPU sits idle — the gaps between
consecutive kernels of meshplan's step (dense-7b, 2 layers, 4K tokens), largest first, with the kernels on
either side, from one profiled step after warm-up.

    PYTHONPATH=$PWD python benchmarks/probes/s20_gap_probe.py --out $OUT/gaps.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from meshplan.models import PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_step import two_layer_step  # noqa: E402 (benchmarks/profile_step.py: the step it profiles)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("nccl", rank=0, world_size=1)
    step = two_layer_step(replace(PRESETS["dense-7b"], layers=2), args.seq)
    for _ in range(4):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    busy = sum(e.time_range.end - e.time_range.start for e in kernels)
    gaps = []
    for a, b in zip(kernels, kernels[1:]):
        gap = b.time_range.start - a.time_range.end
        if gap > 5:
            gaps.append({"us": gap, "after": a.name[:80], "before": b.name[:80]})
    gaps.sort(key=lambda g: -g["us"])
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    out = {
        "gpu": torch.cuda.get_device_name(0),
        "seq": args.seq,
        "event_ms": start.elapsed_time(end),
        "kernels": len(kernels),
        "kernel_busy_ms": busy / 1e3,
        "first_to_last_ms": span / 1e3,
        "gaps_over_5us_ms": sum(g["us"] for g in gaps) / 1e3,
        "largest_gaps": gaps[:40],
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "largest_gaps"}, indent=1))
    for g in gaps[:25]:
        print(f"{g['us']:8.1f} us  after {g['after'][:60]:60}  before {g['before'][:60]}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

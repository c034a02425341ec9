"""Session-25 probe (one GPU): the ssd-scan-fwd-bwd case of benchmarks/peers.py timed four ways, for
meshplan's scan and mamba_ssm's at chunk 256 and 64, in interleaved rounds.

peers.py times one call between two CUDA events and synchronizes after it (run.timed). Where a side
launches many kernels and small torch ops, the GPU waits on the host inside that window, so the time
moves with the lease's CPU: mamba_ssm's chunk-256 scan took 3.63 ms at 16K in session 21's call and
5.3-5.9 ms in session 24's, while meshplan's moved 2.77 -> 3.0 ms. Here, per side and round:

- one_call_ms: peers.py's way (events around one call, synchronized after it);
- graph_ms: the same forward + backward captured once as a CUDA graph and replayed (events around one
  replay): the GPU's time with no host in it;
- kernels_ms: the sum of the call's kernel times (torch.profiler), gaps excluded;
- host_ms: wall time to issue one call without waiting for the GPU (after a synchronize).

    PYTHONPATH=$PWD python benchmarks/probes/s25_scan_gpu_time.py --out $OUT/scan-gpu-time.json
(carry benchmarks/third_party, written by python benchmarks/vendor_mamba_ssm.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
import peers_mamba  # noqa: E402

from meshplan.executor.run import graph_replay_s, kernel_times, timed  # noqa: E402
from meshplan.models import PRESETS  # noqa: E402


def graph_ms(call, reps: int) -> float | str:
    """Median ms of one replay of `call` captured as a CUDA graph (run.graph_replay_s), or why it could not be."""
    try:
        return graph_replay_s(call, reps) * 1e3
    except Exception as e:  # a host sync or an allocation the capture refuses
        return f"{type(e).__name__}: {e}"[:300]


def kernels_ms(call, reps: int = 5) -> float:
    """The call's kernel times summed (run.kernel_times, every kernel under "other")."""
    return sum(kernel_times(call, (), reps).values()) * 1e3


def host_ms(call, reps: int) -> float:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqs", type=int, nargs="+", default=[16384, 4096])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    kernels = peers_mamba.load(cpu=False)
    assert not isinstance(kernels, str), kernels
    m = PRESETS["mamba2-2.7b"].mamba2
    res = {
        "command": "PYTHONPATH=$PWD python benchmarks/probes/s25_scan_gpu_time.py --out $OUT/scan-gpu-time.json",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "mamba_ssm": kernels.version,
        "heads": m.nheads,
        "rows": [],
    }
    for seq in args.seqs:
        leaves = peers_mamba.scan_inputs(m, seq, "cuda", torch.bfloat16)
        dy = torch.randn(leaves[0].shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        dy = dy.to(torch.bfloat16)
        sides = {"meshplan": peers_mamba.meshplan_scan}
        for chunk in (256, 64):
            sides[f"mamba_ssm-{chunk}"] = peers_mamba.peer_scan(kernels, chunk)
        for r in range(args.rounds):
            for name, fn in sides.items():

                def call(fn=fn):
                    return peers_mamba.forward_backward(fn, leaves, dy)

                for _ in range(3):
                    call()
                row = {
                    "seq": seq,
                    "round": r,
                    "side": name,
                    "one_call_ms": statistics.median(timed(call, args.reps, cuda=True)) * 1e3,
                    "host_ms": host_ms(call, args.reps),
                    "kernels_ms": kernels_ms(call),
                    "graph_ms": graph_ms(call, args.reps),
                }
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    summary = {}
    for seq in args.seqs:
        for way in ("one_call_ms", "graph_ms", "kernels_ms", "host_ms"):
            med = {}
            for name in ("meshplan", "mamba_ssm-256", "mamba_ssm-64"):
                vals = [x[way] for x in res["rows"] if x["seq"] == seq and x["side"] == name]
                vals = [v for v in vals if isinstance(v, float)]
                med[name] = statistics.median(vals) if vals else None
            if way != "host_ms" and med["meshplan"]:
                for name in ("mamba_ssm-256", "mamba_ssm-64"):
                    med[f"ratio_{name}"] = med[name] / med["meshplan"] if med[name] else None
            summary[f"{seq}/{way}"] = med
    res["summary"] = summary
    print(json.dumps(summary, indent=1))
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()

"""Quantized (int8) against bf16 all-reduce on the GPUs at hand, 1-256 MiB of bf16 payload, and the
end-to-end effect on TP-SSM prefill of a Mamba-2 stack.

    torchrun --nproc-per-node N benchmarks/bench_quant_allreduce.py --out $OUT/quant_allreduce.json
    NCCL_P2P_DISABLE=1 torchrun ...   # the GPUs exchange through host memory, as servers without NVLink do

Target (issue): ≥ 1.3× at ≥ 16 MiB. Times are CUDA-event medians after warm-up, one call at a time
and ten back to back, and the host's time to issue a call; the int8 paths include their quantize /
dequantize kernels (meshplan/kernels/quant.py). Paths: bf16 (NCCL all-reduce), int8 (over NCCL
collectives), int8_peer (over peer-mapped memory, meshplan/executor/peer.py) and bf16_peer (torch's
one-shot all-reduce over the same kind of memory, where this torch has it: whether a gain is the int8
bytes' or NCCL's overhead's). The NCCL_* environment is written with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from meshplan.executor import peer
from meshplan.executor.comm import build_mesh, quantized_all_reduce
from meshplan.executor.run import timed
from meshplan.layout import Layout

BATCH = 10  # calls per back-to-back timing


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--peer-tiles",
        action="store_true",
        help="first time the peer path's sum at 16 MiB over groups a program x warps, and keep the fastest",
    )
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=timedelta(seconds=120))
    world = dist.get_world_size()
    mesh = build_mesh(Layout(tp=world))
    rows = []
    peer_ok = peer.peer_access_allowed()
    tiles = peer_tiles(mesh) if args.peer_tiles and peer_ok else []
    for mib in (1, 4, 16, 64, 256):
        n = mib * 2**20 // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.zeros_like(x)  # the bf16 all-reduce runs in place on it (zeros stay zeros)
        calls = {
            "bf16": lambda: dist.all_reduce(y),
            "int8": lambda: quantized_all_reduce(mesh, x, "tp", transport="nccl"),
        }
        if peer_ok:
            calls["int8_peer"] = lambda: quantized_all_reduce(mesh, x, "tp", transport="peer")
            one_shot = bf16_one_shot(mesh, n)
            if one_shot is not None:
                calls["bf16_peer"] = one_shot
        row = {"mib_bf16": mib}
        for name, fn in calls.items():
            for _ in range(3):
                fn()
            row[f"{name}_s"] = statistics.median(timed(fn, 20, True))
            # Back to back, as a model's layers issue them: launch and Python time hide behind the GPU's.
            row[f"{name}_back_to_back_s"] = (
                statistics.median(timed(lambda: [fn() for _ in range(BATCH)], 5, True)) / BATCH
            )
            row[f"{name}_host_s"] = host_time(fn)
        for name in calls:
            if name != "bf16":
                row[f"speedup_{name}" if name != "int8" else "speedup"] = row["bf16_s"] / row[f"{name}_s"]
                row[f"speedup_{name}_back_to_back" if name != "int8" else "speedup_back_to_back"] = (
                    row["bf16_back_to_back_s"] / row[f"{name}_back_to_back_s"]
                )
        ref = x.double().clone()
        dist.all_reduce(ref)
        got = quantized_all_reduce(mesh, x, "tp", transport="nccl")
        row["int8_max_rel_err"] = ((got.double() - ref).abs().max() / ref.abs().max()).item()
        if "int8_peer" in calls:
            peer_out = quantized_all_reduce(mesh, x, "tp", transport="peer")
            row["int8_peer_max_rel_err"] = ((peer_out.double() - ref).abs().max() / ref.abs().max()).item()
            # Same quantization, same summation order: two ranks' paths agree bit for bit.
            row["int8_peer_equals_nccl_path"] = bool(torch.equal(peer_out, got)) if world == 2 else None
        rows.append(row)
    e2e = end_to_end(mesh, world)
    if dist.get_rank() == 0:
        env = " ".join(f"{k}={v}" for k, v in os.environ.items() if k == "NCCL_P2P_DISABLE")
        out = {
            "command": f"{env} torchrun --nproc-per-node {world} benchmarks/bench_quant_allreduce.py "
            "--out $OUT/quant_allreduce.json".strip(),
            "gpus": world,
            "gpu": torch.cuda.get_device_name(0),
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
            "allreduce": rows,
            "tpssm_prefill": e2e,
            "peer_tiles": tiles,
            "peer_tile": [peer.PEER_GROUPS_PER_PROGRAM, peer.PEER_WARPS],
        }
        json.dump(out, open(args.out, "w"), indent=1)
        for r in rows:
            paths = [k[:-2] for k in r if k.endswith("_s") and not k.endswith(("_back_to_back_s", "_host_s"))]
            print(
                f"{world} GPUs {r['mib_bf16']:4} MiB: "
                + "  ".join(
                    f"{p} {r[p + '_s'] * 1e3:.3f} ms (b2b {r[p + '_back_to_back_s'] * 1e3:.3f}, host "
                    f"{r[p + '_host_s'] * 1e6:.0f} us)"
                    for p in paths
                )
                + f"  speedup int8 {r['speedup']:.2f}x, peer {r.get('speedup_int8_peer', float('nan')):.2f}x"
                + f"  (max rel err {r['int8_max_rel_err']:.1e}, peer "
                f"{r.get('int8_peer_max_rel_err', float('nan')):.1e},"
                + f" bit-equal {r.get('int8_peer_equals_nccl_path')})"
            )
        print(f"TP-SSM prefill: {e2e}")
    dist.destroy_process_group()
    return 0


def peer_tiles(mesh) -> list[dict]:
    """The peer path at 16 MiB for each tile; sets the fastest for the rest of the run."""
    x = torch.randn(8 * 2**20, device="cuda", dtype=torch.bfloat16)
    fn = lambda: quantized_all_reduce(mesh, x, "tp", transport="peer")  # noqa: E731
    out = []
    for gpp in (8, 16, 32, 64):
        for warps in (2, 4, 8):
            peer.configure(gpp, warps)
            for _ in range(3):
                fn()
            b2b = statistics.median(timed(lambda: [fn() for _ in range(BATCH)], 5, True)) / BATCH
            out.append({"groups_per_program": gpp, "warps": warps, "back_to_back_s": b2b})
    best = min(out, key=lambda r: r["back_to_back_s"])
    peer.configure(best["groups_per_program"], best["warps"])
    return out


def host_time(fn, calls: int = 50) -> float:
    """Seconds of the host's time to issue one call (median of five batches, GPU drained before each)."""
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    torch.cuda.synchronize()
    return statistics.median(times)


def bf16_one_shot(mesh, n: int):
    """torch's own one-shot bf16 all-reduce over symmetric memory (the bf16 counterpart of the int8
    peer path: is a gain the int8 bytes' or NCCL's overhead's?), or None where this torch lacks it."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group = mesh.axis("tp").group
        buf = symm_mem.empty(n, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(buf, group)
        buf.normal_()
        op = torch.ops.symm_mem.one_shot_all_reduce
        op(buf, "sum", group.group_name)
        return lambda: op(buf, "sum", group.group_name)
    except Exception as exc:  # reported, not fatal: the int8 rows stand without it
        print(f"bf16 one-shot unavailable: {type(exc).__name__}: {exc}")
        return None


def _prefill_s(model, mesh, int8: bool) -> float:
    from meshplan.executor.blocks import Stack
    from meshplan.executor.parallelize import parallelize, run_layers

    torch.manual_seed(0)
    with torch.device("cuda"):
        layers = parallelize(Stack(model, model.layers).to(torch.bfloat16), mesh, 16384, int8_allreduce=int8)
    x = torch.randn(4, 16384, model.d_model, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            run_layers(layers, x)
        return statistics.median(timed(lambda: run_layers(layers, x), 5, True))


def end_to_end(mesh, world: int) -> dict:
    """mamba2-2.7b, 4 layers, prefill of 16K tokens, batch 4: bf16 against int8 block all-reduce."""
    from meshplan.models import PRESETS

    model = replace(PRESETS["mamba2-2.7b"], layers=4)
    out = {}
    for int8 in (False, True):
        out["int8_s" if int8 else "bf16_s"] = _prefill_s(model, mesh, int8)
        torch.cuda.empty_cache()
    out["speedup"] = out["bf16_s"] / out["int8_s"]
    out["int8_transport"] = "peer" if peer.wanted(mesh.axis("tp").group, mesh.axis("tp").ranks) else "nccl"
    return out


if __name__ == "__main__":
    raise SystemExit(main())

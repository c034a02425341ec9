"""GPU memory a tensor-level model does not see: the CUDA context, the libraries' handles and
workspaces, NCCL's communicator buffers, and the caching allocator's slack (reserved beyond allocated).

Each rank reads the driver's view (torch.cuda.mem_get_info: total − free) and the allocator's
(memory_reserved), and records what lies outside the allocator after each step:
  context      CUDA initialised, nothing allocated
  cublas       a bf16 GEMM run (cuBLAS's kernels loaded; its workspace sits in the allocator)
  attention    SDPA's flash and cuDNN backends run (cuDNN handle, plans)
  nccl_world   the default NCCL communicator made over every rank, its ring collectives run
  groups       further communicators, one group size at a time (every divisor of the world above 1):
               one that runs only the ring collectives (all-reduce, all-gather, reduce-scatter, small
               and large messages, so every protocol connects), one only an all-to-all, one only a
               send/recv to the next rank of the group, one all three in turn — each step's growth
Then a training-like loop of mixed-size tensors for the allocator's peak reserved / peak allocated.
meshplan/costmodel/runtime.py prices a plan's communicators from these figures.

Run (2 or 4 GPUs): python benchmarks/probe_runtime_memory.py --out $OUT/runtime-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GIB = 2**30
SMALL, LARGE = 256, 16 << 20  # float32 elements: 1 KiB (the LL protocols) and 64 MiB (Simple)


def _outside(device: int) -> int:
    """Bytes the driver reports used beyond what the caching allocator holds."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def _ring(dev, group, size: int) -> None:
    for n in (SMALL, LARGE):
        x = torch.ones(n * size, device=dev)
        dist.all_reduce(x, group=group)
        out = torch.empty(n * size * size, device=dev)
        dist.all_gather_into_tensor(out, x, group=group)
        dist.reduce_scatter_tensor(x, out, group=group)
    del x, out


def _all_to_all(dev, group, size: int) -> None:
    for n in (SMALL, LARGE):
        x = torch.ones(n * size, device=dev)
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x, group=group)


def _send_recv(dev, group, ranks: list[int], rank: int) -> None:
    i = ranks.index(rank)
    nxt, prev = ranks[(i + 1) % len(ranks)], ranks[(i - 1) % len(ranks)]
    for n in (SMALL, LARGE):
        x = torch.ones(n, device=dev)
        y = torch.empty_like(x)
        ops = [dist.P2POp(dist.isend, x, nxt, group), dist.P2POp(dist.irecv, y, prev, group)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()


def _rank(rank: int, world: int, port: int, queue) -> None:
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    torch.cuda.init()
    torch.empty(1, device=dev)  # the context made
    out = {"context": _outside(rank)}
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    (a @ a).sum().item()
    out["cublas"] = _outside(rank)
    q = torch.randn(1, 32, 4096, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        except RuntimeError:
            pass
    del a, q
    out["attention"] = _outside(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    _ring(dev, None, world)
    out["nccl_world"] = _outside(rank)
    groups = []
    steps = {
        "ring": lambda g, ranks: _ring(dev, g, len(ranks)),
        "all_to_all": lambda g, ranks: _all_to_all(dev, g, len(ranks)),
        "send_recv": lambda g, ranks: _send_recv(dev, g, ranks, rank),
    }
    # One communicator for each use alone (a tensor axis's ring collectives, an expert axis's
    # all-to-all, a pipeline's send/recv), then one that does all three (are they additive?).
    uses = [("ring",), ("all_to_all",), ("send_recv",), ("ring", "all_to_all", "send_recv")]
    for size in [s for s in range(2, world + 1) if world % s == 0]:
        for use in uses:
            # every rank makes every group (new_group is collective); each uses its own
            made = [dist.new_group(list(range(s, s + size))) for s in range(0, world, size)]
            ranks = list(range(rank - rank % size, rank - rank % size + size))
            g = made[rank // size]
            entry = {"size": size, "uses": list(use)}
            for step in use:
                before = _outside(rank)
                steps[step](g, ranks)
                entry[step] = _outside(rank) - before
            groups.append(entry)
    out["groups"] = groups
    # The allocator's slack under a training-like mix of sizes: layers' activations saved, freed in reverse.
    torch.cuda.reset_peak_memory_stats(dev)
    w = [torch.randn(4096, 11008, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(4)]
    for _ in range(3):
        h = torch.randn(2 * 4096, 4096, device=dev, dtype=torch.bfloat16)
        for layer in range(4):
            h = torch.nn.functional.silu(h @ w[layer]) @ w[layer].t()
        h.float().pow(2).mean().backward()
        for p in w:
            p.grad = None
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats(dev)
    out["allocator"] = {
        "peak_allocated": stats["allocated_bytes.all.peak"],
        "peak_reserved": stats["reserved_bytes.all.peak"],
    }
    free, total = torch.cuda.mem_get_info(rank)
    out["total"] = total
    out["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    dist.destroy_process_group()
    queue.put((rank, out))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    world = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, 29533, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    r0 = results[0]
    print(f"{world} × {torch.cuda.get_device_name(0)}, torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}")
    for key in ("context", "cublas", "attention", "nccl_world"):
        print(f"  outside the allocator after {key:10s} {r0[key] / GIB:6.3f} GiB")
    for g in r0["groups"]:
        grew = ", ".join(f"+{g[u] / 2**20:.1f} MiB {u}" for u in g["uses"])
        print(f"  a further communicator of {g['size']}: {grew}")
    a = r0["allocator"]
    print(f"  allocator peak reserved / allocated {a['peak_reserved'] / a['peak_allocated']:.3f}")
    record = {
        "command": "python benchmarks/probe_runtime_memory.py" + (f" --out {args.out}" if args.out else ""),
        "device": torch.cuda.get_device_name(0),
        "gpus": world,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
        "host": platform.node(),
        "ranks": {str(k): v for k, v in sorted(results.items())},
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU memory a tensor-level model does not see: the CUDA context, the libraries' handles and
workspaces, NCCL's communicator buffers, and the caching allocator's slack (reserved beyond allocated).

Each rank reads the driver's view (torch.cuda.mem_get_info: total − free) and the allocator's
(memory_reserved), and records what lies outside the allocator after each step:
  context      CUDA initialised, nothing allocated
  cublas       a bf16 GEMM run (cuBLAS handle; its workspace sits in the allocator since torch 2.x)
  attention    SDPA's flash and cuDNN backends run (cuDNN handle, plans)
  nccl_world   the default NCCL communicator made and an all-reduce run over every rank
  nccl_groups  each further communicator (new_group over the same ranks, an all-reduce, an all-to-all,
               a send/recv) — what one more mesh axis costs a rank
Then a training-like loop of mixed-size tensors (the executor's dense 2-layer step where it runs) for
the allocator's peak reserved / peak allocated.

Run (2 GPUs): python benchmarks/probe_runtime_memory.py --out $OUT/runtime-memory.json
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


def _outside(device: int) -> int:
    """Bytes the driver reports used beyond what the caching allocator holds."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def _rank(rank: int, world: int, port: int, groups: int, queue) -> None:
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    torch.cuda.init()
    torch.empty(1, device=dev)  # the context made
    torch.cuda.synchronize()
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
    torch.cuda.synchronize()
    out["attention"] = _outside(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    x = torch.ones(1 << 20, device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    out["nccl_world"] = _outside(rank)
    steps = []
    for _ in range(groups):
        g = dist.new_group(list(range(world)))
        dist.all_reduce(x, group=g)
        before = _outside(rank)
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x, group=g)
        after_a2a = _outside(rank)
        if world > 1:
            peer = rank ^ 1
            if peer < world:
                ops = [dist.P2POp(dist.isend, x, peer, g), dist.P2POp(dist.irecv, y, peer, g)]
                for r in dist.batch_isend_irecv(ops):
                    r.wait()
        torch.cuda.synchronize()
        steps.append({"after_all_reduce": before, "after_all_to_all": after_a2a, "after_send_recv": _outside(rank)})
    out["nccl_groups"] = steps
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
    ap.add_argument("--groups", type=int, default=4, help="further communicators made, one after another")
    args = ap.parse_args()
    world = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, 29533, args.groups, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    r0 = results[0]
    print(f"{world} × {torch.cuda.get_device_name(0)}, torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}")
    for key in ("context", "cublas", "attention", "nccl_world"):
        print(f"  outside the allocator after {key:10s} {r0[key] / GIB:6.3f} GiB")
    last = r0["nccl_world"]
    for i, s in enumerate(r0["nccl_groups"]):
        print(
            f"  communicator {i + 2}: +{(s['after_all_reduce'] - last) / 2**20:7.1f} MiB all-reduce, "
            f"+{(s['after_all_to_all'] - s['after_all_reduce']) / 2**20:6.1f} all-to-all, "
            f"+{(s['after_send_recv'] - s['after_all_to_all']) / 2**20:6.1f} send/recv"
        )
        last = s["after_send_recv"]
    a = r0["allocator"]
    print(f"  allocator peak reserved / allocated {a['peak_reserved'] / a['peak_allocated']:.3f}")
    record = {
        "command": "python benchmarks/probe_runtime_memory.py" + (f" --out {args.out}" if args.out else ""),
        "device": torch.cuda.get_device_name(0),
        "gpus": world,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "host": platform.node(),
        "ranks": {str(k): v for k, v in sorted(results.items())},
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

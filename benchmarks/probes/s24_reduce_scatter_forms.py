"""Session-24 probe (2 GPUs): NCCL reduce-scatter in the list form the executor used (dist.reduce_scatter over
the input's chunks: torch flattens the list into a buffer of its own first) against the tensor form
(dist.reduce_scatter_tensor on the input as it lies), bf16 and fp32, 16-512 MiB inputs; CUDA-event medians.

    torchrun --nproc-per-node 2 benchmarks/probes/s24_reduce_scatter_forms.py --out $OUT/reduce-scatter-forms.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist


def timed(fn, reps=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    n = dist.get_world_size()
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for mib in (16, 64, 256, 512):
            x = torch.randn(mib * 2**20 // torch.tensor([], dtype=dtype).element_size(), device="cuda").to(dtype)
            out = torch.empty(x.numel() // n, dtype=dtype, device="cuda")
            chunks = list(x.chunk(n))
            t_list = timed(lambda: dist.reduce_scatter(out, chunks))
            ref = out.clone()
            t_tensor = timed(lambda: dist.reduce_scatter_tensor(out, x))
            same = bool(torch.equal(ref, out))
            row = {"dtype": str(dtype), "mib": mib, "list_ms": t_list * 1e3, "tensor_ms": t_tensor * 1e3, "same": same}
            rows.append(row)
            if rank == 0:
                print(row, flush=True)
    if rank == 0 and args.out:
        json.dump(
            {
                "command": "torchrun --nproc-per-node 2 benchmarks/probes/s24_reduce_scatter_forms.py"
                " --out $OUT/reduce-scatter-forms.json",
                "gpu": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "rows": rows,
            },
            open(args.out, "w"),
            indent=1,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

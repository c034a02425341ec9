"""Session-26 probe (2 GPUs): what NCCL's collectives reach between two GPUs of one host, timed as `meshplan
calibrate` times them (meshplan.executor.calibrate_run: the executor's forms, calls back to back, the median of
three batches) at 16-512 MiB, bf16, against the link rate the cluster preset gives. Run it under different NCCL
settings (NCCL_PROTO, NCCL_ALGO) to see which protocol the rates come from.

    torchrun --nproc-per-node 2 benchmarks/probes/s26_nccl_rates.py --out $OUT/nccl-rates.json --label default
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from meshplan.costmodel.collectives import volume_factor
from meshplan.executor.calibrate_run import _collective, _time, message_bytes

KINDS = ("reduce_scatter", "all_gather", "broadcast", "send_recv", "all_reduce", "all_to_all")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="default")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    n = dist.get_world_size()
    group = dist.new_group(list(range(n)))
    rows = []
    for kind in KINDS:
        for mib in (16, 64, 256, 512):
            numel = mib * 2**20 // 2 // n * n
            run, check = _collective(kind, numel, group, list(range(n)), rank, "cuda", torch.bfloat16)
            t = _time(run, args.reps, True, lambda: dist.barrier(group=group))
            if not check():
                raise RuntimeError(f"{kind} returned a wrong result")
            message = message_bytes(kind, numel * 2, n)
            # bytes a rank sends over its link, the cost model's α-β volume (send/recv: its buffer, one way)
            sent = volume_factor(kind, n) * message
            rows.append({"kind": kind, "mib": mib, "message_bytes": message, "s": t, "sent_gb_per_s": sent / t / 1e9})
            if rank == 0:
                rate = sent / t / 1e9
                print(f"{args.label:10s} {kind:15s} {mib:4d} MiB {t * 1e3:8.3f} ms {rate:7.1f} GB/s sent a rank")
    if rank == 0:
        env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        record = {"label": args.label, "gpu": torch.cuda.get_device_name(0), "nccl": nccl, "torch": torch.__version__}
        record.update(env=env, ranks=n, rows=rows)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

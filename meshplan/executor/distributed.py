"""Start N local processes with a process group each (gloo on CPU), bounded in time, for tests and
CPU runs. Multi-GPU runs use torchrun (meshplan execute)."""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args, result_dir: str, timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    import pickle

    try:
        out = fn(rank, world, *args)
        payload = ("ok", out)
    except Exception:  # noqa: BLE001 - the parent reports the child's traceback
        payload = ("error", traceback.format_exc())
    with open(os.path.join(result_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(payload, f)
    dist.destroy_process_group()


def run_distributed(fn, world: int, *args, timeout_s: float = 120.0) -> list:
    """Run fn(rank, world, *args) in `world` gloo processes; return each rank's result, or raise with
    the failing rank's traceback. A hung collective fails after `timeout_s`."""
    import pickle

    with tempfile.TemporaryDirectory() as result_dir:
        ctx = mp.start_processes(
            _entry,
            args=(world, free_port(), fn, args, result_dir, timeout_s),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = timeout_s + 30
        import time

        start = time.monotonic()
        while not ctx.join(timeout=1):
            if time.monotonic() - start > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"distributed run did not finish in {deadline:.0f} s")
        results = []
        for rank in range(world):
            path = os.path.join(result_dir, f"rank{rank}.pkl")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {rank} died without a result")
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results.append(value)
        return results

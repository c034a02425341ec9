"""The command `meshplan execute` starts (torch's elastic launcher over meshplan.executor.worker), and
running it: torch-free, so that the CLI builds and checks it without importing torch."""

from __future__ import annotations

import os
import subprocess
import sys

from meshplan.errors import MeshplanError


def worker_command(
    *,
    model: str,
    layout: str,
    seq: int,
    batch: int,
    mode: str,
    device: str,
    steps: int,
    out: str,
    timeout: float,
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    layers: int = 0,
    layers_only: bool = False,
    tokens_file: str | None = None,
    weights: str | None = None,
    profile: bool = False,
    int8_allreduce: bool = False,
) -> list[str]:
    """torchrun's command line: `nproc` workers on this node (standalone, or node `node_rank` of
    `nnodes` meeting at `rdzv_endpoint`), each given the run's options."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}"]
    if nnodes > 1:
        if not rdzv_endpoint:
            raise MeshplanError("--rdzv-endpoint is required with --nnodes > 1 (host:port of node 0)")
        cmd += [f"--node-rank={node_rank}", f"--rdzv-endpoint={rdzv_endpoint}", "--rdzv-backend=c10d"]
    else:
        cmd += ["--standalone"]
    options = {
        "--model": model,
        "--layout": layout,
        "--seq": seq,
        "--batch": batch,
        "--mode": mode,
        "--device": device,
        "--steps": steps,
        "--out": out,
        "--timeout": timeout,
        "--layers": layers or None,
        "--tokens": tokens_file,
        "--weights": weights,
    }
    cmd += ["-m", "meshplan.executor.worker"]
    for flag, value in options.items():
        if value is not None:
            cmd += [flag, str(value)]
    flags = {"--layers-only": layers_only, "--profile": profile, "--int8-allreduce": int8_allreduce}
    return cmd + [flag for flag, on in flags.items() if on]


def run_workers(cmd: list[str], timeout: float) -> None:
    """Run the workers; a hung run (past `timeout` + 60 s) or a failed rank is one MeshplanError line.
    NVLink multicast (NVLS) stays off unless the caller's environment turns it on."""
    env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        raise MeshplanError(f"the run did not finish in {timeout + 60:.0f} s (--timeout); a rank may be hung") from None
    if proc.returncode != 0:
        tail = [line for line in (proc.stderr or "").splitlines() if "Error" in line or "error" in line]
        raise MeshplanError(
            f"a rank failed (exit {proc.returncode}): {tail[-1].strip() if tail else 'see torchrun output'}"
        )

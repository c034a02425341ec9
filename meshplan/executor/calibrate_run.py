"""Measure a real cluster and write a profile that `--cluster` accepts: what `meshplan calibrate` runs
under torchrun on every rank, given the run's record (a CalibrationSpec file,
meshplan.executor.runspec, whose path is the one argument).

Measured: bf16 GEMM rate over the shapes the cost model uses, HBM bandwidth (a device-to-device copy),
SDPA forward + backward rates (fused causal, and the lower-right prefix kernel of sequence shards),
the host's time per kernel the executor launches (its launch floor), and every collective the layouts
use — all-reduce, all-gather, reduce-scatter, broadcast, send/recv ring, all-to-all — over group
sizes 2, 4, … N and message sizes 64 KiB – 1 GiB (`--quick`: fewer),
each result checked for correctness. The fit and the profile's TOML: meshplan.topologies.calibrate.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import replace
from datetime import timedelta
from importlib import resources

import torch
import torch.distributed as dist

from meshplan.executor.comm import build_mesh
from meshplan.executor.run import measure
from meshplan.executor.runspec import CalibrationSpec
from meshplan.executor.torchrun import progress_line
from meshplan.layout import Layout
from meshplan.models import PRESETS
from meshplan.topologies.calibrate import profile_toml

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all")


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _time(fn, reps: int, cuda: bool, line_up=None) -> float:
    """Seconds per call of fn when calls are issued back to back, as a training step issues them: the
    ranks line up (`line_up`, a barrier, for collectives), then each queues `reps` calls and waits
    once; the median of three such batches. (Timing each call alone, with a synchronize after it,
    adds the launch and the ranks' skew to every call: 100-270 µs of alpha on NVLink in the first
    4-GPU profile of 2026-11-22.)"""
    fn()
    _sync(cuda)
    batches = []
    for _ in range(3):
        if line_up is not None:
            line_up()
            _sync(cuda)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(cuda)
        batches.append((time.perf_counter() - t0) / reps)
    return statistics.median(batches)


def _collective(
    kind: str, numel: int, group, ranks: list[int], me: int, device: str, dtype
) -> tuple[callable, callable]:
    """(run, check): run the collective once; check that its last result is right."""
    n = len(ranks)
    idx = ranks.index(me)
    x = torch.full((numel,), float(idx + 1), device=device, dtype=dtype)
    if kind == "all_reduce":  # in place on one buffer (a copy per call would be timed with it)
        y = x.clone()
        run = lambda: dist.all_reduce(y, group=group)  # noqa: E731

        def check():
            y.copy_(x)
            run()
            return bool((y == n * (n + 1) / 2).all())
    elif kind == "all_gather":
        # Each rank's x into one buffer of n times its size, as the executor gathers (comm.all_gather_start,
        # comm.all_gather_into_start: NCCL's tensor form; the list form timed before session 26 added torch's
        # copy of each part out of NCCL's buffer)
        gathered = torch.empty(n * numel, device=device, dtype=dtype)
        if dist.get_backend() == "nccl":
            run = lambda: dist.all_gather_into_tensor(gathered, x, group=group)  # noqa: E731
        else:
            run = lambda: dist.all_gather(list(gathered.chunk(n)), x, group=group)  # noqa: E731
        check = lambda: all(bool((p == i + 1).all()) for i, p in enumerate(gathered.chunk(n)))  # noqa: E731
    elif kind == "reduce_scatter":
        chunk = numel // n
        out = torch.empty(chunk, device=device, dtype=dtype)
        if dist.get_backend() == "nccl":
            # the tensor form, as the executor's reduce-scatters of whole rows run (comm.reduce_scatter)
            run = lambda: dist.reduce_scatter_tensor(out, x[: chunk * n], group=group)  # noqa: E731
        else:  # gloo: all-reduce and slice, as the executor does

            def run():
                y = x[: chunk * n].clone()
                dist.all_reduce(y, group=group)
                out.copy_(y[idx * chunk : (idx + 1) * chunk])

        check = lambda: bool((out == n * (n + 1) / 2).all())  # noqa: E731
    elif kind == "broadcast":
        y = x.clone()
        run = lambda: dist.broadcast(y, src=ranks[0], group=group)  # noqa: E731

        def check():
            y.copy_(x)
            run()
            return bool((y == 1).all())
    elif kind == "send_recv":
        recv = torch.empty_like(x)

        def run():
            ops = [
                dist.P2POp(dist.isend, x, ranks[(idx + 1) % n], group=group),
                dist.P2POp(dist.irecv, recv, ranks[(idx - 1) % n], group=group),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        check = lambda: bool((recv == (idx - 1) % n + 1).all())  # noqa: E731
    else:
        out = torch.empty_like(x)
        run = lambda: dist.all_to_all_single(out, x, group=group)  # noqa: E731
        check = lambda: all(bool((c == i + 1).all()) for i, c in enumerate(out.chunk(n)))  # noqa: E731
    return run, check


def message_bytes(kind: str, buffer_bytes: int, n: int) -> int:
    """A timed collective's message as the cost model's Comm.message_bytes and the executor's counter size it
    (the α-β fit divides it by the bandwidth): an all-gather's gathered output, n times each rank's `buffer`;
    every other kind its buffer (a reduce-scatter's whole input)."""
    return buffer_bytes * n if kind == "all_gather" else buffer_bytes


def measure_collectives(sizes: list[int], device: str, reps: int, progress=None) -> dict:
    """Every collective over groups of the first 2, 4, … ranks; returns {"kind/n": [(bytes, s), …]}."""
    world, me = dist.get_world_size(), dist.get_rank()
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    out: dict[str, list] = {}
    n = 2
    while n <= world:
        ranks = list(range(n))
        group = dist.new_group(ranks)
        for kind in COLLECTIVES:
            for size in sizes:
                numel = max(n, size // dtype.itemsize // n * n)
                if me in ranks:
                    run, check = _collective(kind, numel, group, ranks, me, device, dtype)
                    t = _time(run, reps, cuda, lambda: dist.barrier(group=group))
                    if not check():
                        raise RuntimeError(f"calibrate: {kind} on {n} ranks returned a wrong result")
                    out.setdefault(f"{kind}/{n}", []).append((message_bytes(kind, numel * dtype.itemsize, n), t))
                dist.barrier()
                if progress:
                    progress(f"{kind} on {n} ranks, {size / 2**20:.2f} MiB")
        n *= 2
    return out


def measure_compute(device: str, quick: bool) -> dict:
    """GEMM efficiency over the model's shapes, copy bandwidth, attention rates (this GPU)."""
    from meshplan.executor.attention import causal_attention, shard_attention

    peak = float(os.environ.get("MESHPLAN_PEAK_TFLOPS", "989.4")) * 1e12
    a = torch.empty(2**30, dtype=torch.uint8, device=device)
    copy_s = _time(lambda: a.clone(), 5, True)
    effs = []
    # tokens × hidden · (QKV, W_O, MLP in / out) of a 4096-wide layer, forward and a backward shape
    for m, k, n in (
        (8192, 4096, 12288),
        (8192, 4096, 4096),
        (8192, 4096, 32768),
        (8192, 16384, 4096),
        (4096, 8192, 4096),
    ):
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        effs.append(2 * m * n * k / _time(lambda: x @ w, 10, True) / peak)
    attn = {"causal": [], "prefix": []}
    for keys in (4096, 16384) if quick else (4096, 16384, 32768):
        for prefix in (False, True):
            q_len = keys // 2 if prefix else keys
            q = torch.randn(1, 32, q_len, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
            kv = torch.randn(1, 32, keys, 128, device=device, dtype=torch.bfloat16, requires_grad=True)

            def step():  # the executor's own attention paths (meshplan.executor.attention)
                o = shard_attention(q, kv, kv) if prefix else causal_attention(q, kv, kv)
                o.sum().backward()

            visible = (keys - q_len / 2) / keys
            flops = 4 * q_len * keys * 32 * 128 * visible * 3.5
            attn["prefix" if prefix else "causal"].append((keys, flops / _time(step, 5, True) / peak))
    return {
        "gemm_efficiency": statistics.median(effs),
        "hbm_bytes_per_s": 2 * a.numel() / copy_s,
        "attention_causal": attn["causal"],
        "attention_prefix": attn["prefix"],
    }


# Host cost per launched kernel: training steps and decode steps of 2-layer stacks of both families on
# one GPU (each probe gives its family's and mode's cost).
# The fastest of HOST_SAMPLES issues of a step: the host's own cost, not a stall beside it.
HOST_SAMPLES = 9
HOST_PROBES = (
    ("dense-7b", "train", 4096, 1),
    ("mamba2-2.7b", "train", 4096, 1),
    ("dense-7b", "decode", 4096, 8),
    ("mamba2-2.7b", "decode", 4096, 8),
)


def measure_host(device: str) -> dict:
    """The executor's host seconds per launched kernel on this machine, per block family and for
    steps and decode, as the cost model's constants were made (meshplan.costmodel.compute.
    STEP_KERNEL_HOST_S): the time to issue one step from an idle GPU (the fastest of HOST_SAMPLES)
    over the kernels the step launches (profiler count). Runs on this rank alone (a one-GPU layout
    needs no process group)."""
    mesh = build_mesh(Layout(), members=[dist.get_rank()])
    out: dict = {"host_probes": []}
    for name, mode, seq, batch in HOST_PROBES:
        r = measure(
            replace(PRESETS[name], layers=2),
            Layout(),
            mesh,
            seq,
            batch,
            mode,
            steps=3,
            warmup=3,
            device=device,
            exposed=False,
            profile=2,
            host_samples=HOST_SAMPLES,
            cuda_graph=False,  # the eager launches are what is timed
        )
        kernels = r["phases_s"]["kernels_per_step"]
        issue_s = min(r["host_enqueue_samples_s"])
        family = "mamba2_" if name.startswith("mamba2") else ""
        out[f"{family}{'decode_' if mode == 'decode' else ''}host_kernel_s"] = issue_s / kernels
        out["host_probes"].append(
            {
                "model": f"{name}/2L",
                "mode": mode,
                "seq": seq,
                "batch": batch,
                "kernels": kernels,
                "host_enqueue_s": issue_s,
                "step_time_s": r["step_time_s"],
            }
        )
        del r
        torch.cuda.empty_cache()
    return out


def main(spec_path: str) -> int:
    spec = CalibrationSpec.read(spec_path)
    cuda = spec.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    top = spec.max_bytes or (2**28 if spec.quick else 2**30)
    sizes, s = [], 2**16
    while s <= top:
        sizes.append(s)
        s *= 16 if spec.quick else 4
    reps = 5 if spec.quick else 10
    rank = dist.get_rank()
    # Rank 0 says what has finished, for the CLI's progress bar: each collective at each size on each
    # group, then (on GPUs) the compute rates and the host's launch cost.
    groups = len([n for n in (2**k for k in range(1, 31)) if n <= dist.get_world_size()])
    total = groups * len(COLLECTIVES) * len(sizes) + (2 if cuda else 0)
    done = 0

    def say(what: str) -> None:
        nonlocal done
        done += 1
        if rank == 0:
            print(progress_line(done, total, what), flush=True)

    measured = {"collectives": measure_collectives(sizes, device, reps, say)}
    if cuda and rank == 0:
        measured.update(measure_compute(device, spec.quick))
        say("GEMM, HBM and attention rates")
        measured.update(measure_host(device))
        say("the host's time per launched kernel")
    gathered = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(measured["collectives"], gathered, dst=0)
    if rank == 0:
        merged: dict[str, list] = {}
        for per_rank in gathered:  # a collective takes as long as its slowest rank
            for key, pts in per_rank.items():
                old = merged.setdefault(key, [])
                for i, (b, t) in enumerate(pts):
                    if i < len(old):
                        old[i] = (b, max(old[i][1], t))
                    else:
                        old.append((b, t))
        measured["collectives"] = merged
        base = (resources.files("meshplan.topologies") / "presets" / f"{spec.cluster}.toml").read_text()
        command = f"meshplan calibrate --nproc {dist.get_world_size()}" + (" --quick" if spec.quick else "")
        with open(spec.out, "w") as f:
            f.write(profile_toml(base, measured, command))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))

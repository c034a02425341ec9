"""Where a step's GPU time goes, by kernel category (one profiled step, GPU only)."""

from __future__ import annotations

from collections import defaultdict

import torch

CATEGORIES = (
    # NCCL's kernels, and the int8 all-reduce's peer sum, which waits on its peers' copies (executor/peer.py)
    ("communication", ("nccl", "_dequant_sum_peers")),
    ("copy", ("memcpy", "memset")),
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul", "wgmma")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    (
        "scan_conv",
        ("_conv_fwd", "_conv_bwd", "_conv_head", "state_update", "quantize", "dequantize", "_chunk_", "_state_passing"),
    ),
)


def category(kernel_name: str) -> str:
    low = kernel_name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "elementwise_other"


STEP_RANGE = "meshplan.profiled_step"


def profile_step(step, steps: int = 1, top: int = 0, line_up=None) -> dict | None:
    """Seconds per step of GPU kernel time by category (kernels on different streams may overlap,
    so the sum can exceed the step), and under "timeline" the step's kernels laid out in time
    (timeline: idle, communication beside no compute); with `top`, also the `top` kernels by time under
    "top_kernels" and the kernels launched per step, in all and by category. `line_up`: a barrier over
    the layout's ranks (Mesh.line_up), so that they start the profiled step together and one rank's
    collectives do not wait on another still finishing the step before. None without a GPU."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # Lined up inside the profiler (starting it takes each process its own time), the step's
        # kernels told apart from the barrier's by the range around them
        if line_up is not None:
            line_up()
            torch.cuda.synchronize()
        with record_function(STEP_RANGE):
            for _ in range(steps):
                step()
        torch.cuda.synchronize()
    events = prof.events()
    ranges = [e.time_range.start for e in events if e.is_user_annotation and e.name == STEP_RANGE]
    begin = min(ranges) if ranges else float("-inf")  # the step's range on the GPU (or on the host)
    out: dict = defaultdict(float)
    names: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    spans: dict[bool, list] = {True: [], False: []}  # kernel intervals (µs): communication or not
    copies: list = []  # copies and memsets: busy, but neither compute nor communication
    for evt in events:
        if (
            evt.device_type == torch.autograd.DeviceType.CUDA
            and not evt.is_user_annotation
            and evt.time_range.start >= begin
        ):
            cat = category(evt.name)
            out[cat] += evt.device_time / 1e6 / steps
            names[evt.name[:90]] += evt.device_time / 1e6 / steps
            counts[cat] += 1 / steps
            span = (evt.time_range.start, evt.time_range.end)
            (copies if cat == "copy" else spans[cat == "communication"]).append(span)
    out = dict(out)
    if spans[False] or spans[True]:
        out["timeline"] = {k: v / 1e6 / steps for k, v in timeline(spans[False], spans[True], copies).items()}
    if top:
        out["kernels_per_step"] = sum(counts.values())
        out["kernels_by_category"] = dict(counts)
        out["top_kernels"] = sorted(names.items(), key=lambda kv: -kv[1])[:top]
    return out


def _union(spans: list) -> list:
    """Intervals merged where they overlap, in order."""
    out: list = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def _length(spans: list) -> float:
    return sum(end - start for start, end in spans)


def _intersection(a: list, b: list) -> float:
    """Length of the overlap of two interval lists, each merged and in order (_union's)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def timeline(compute: list, comm: list, other: list = ()) -> dict[str, float]:
    """From kernel intervals (start, end) — compute kernels, communication kernels and `other` work
    (copies), any streams — the span from the first kernel's start to the last one's end, the time some
    kernel runs (busy), the GPU idle inside the span (waiting on the host or on nothing), and the
    communication no compute kernel runs beside (exposed) against the part that runs beside one
    (hidden). A collective's kernel runs from its launch until its peers arrive: its exposed time
    includes waiting for a slower rank."""
    work, talk = _union(compute), _union(comm)
    every = _union(list(compute) + list(comm) + list(other))
    if not every:
        return {"span": 0.0, "busy": 0.0, "idle": 0.0, "comm_exposed": 0.0, "comm_hidden": 0.0}
    span = every[-1][1] - every[0][0]
    busy = _length(every)
    hidden = _intersection(work, talk)
    return {
        "span": span,
        "busy": busy,
        "idle": span - busy,
        "comm_exposed": _length(talk) - hidden,
        "comm_hidden": hidden,
    }

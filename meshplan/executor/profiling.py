"""Where a step's GPU time goes, by kernel category (one profiled step, GPU only)."""

from __future__ import annotations

from collections import defaultdict

import torch

CATEGORIES = (
    ("communication", ("nccl",)),
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


def profile_step(step, steps: int = 1, top: int = 0) -> dict[str, float] | None:
    """Seconds per step of GPU kernel time by category (kernels on different streams may overlap,
    so the sum can exceed the step); with `top`, also the `top` kernels by time under "top_kernels"
    and the kernels launched per step, in all and by category.
    None without a GPU."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out: dict = defaultdict(float)
    names: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            cat = category(evt.name)
            out[cat] += evt.device_time / 1e6 / steps
            names[evt.name[:90]] += evt.device_time / 1e6 / steps
            counts[cat] += 1 / steps
    out = dict(out)
    if top:
        out["kernels_per_step"] = sum(counts.values())
        out["kernels_by_category"] = dict(counts)
        out["top_kernels"] = sorted(names.items(), key=lambda kv: -kv[1])[:top]
    return out

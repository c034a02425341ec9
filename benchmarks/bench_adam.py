"""MixedAdam's step on one GPU, one parameter at a time: torch's path (the bf16 gradient cast to fp32,
torch._fused_adamw_ over the fp32 weight, gradient, m and v, the bf16 copy-back) against the one Triton
kernel of meshplan/kernels/adam.py, in bf16 gradients and weights.

    python benchmarks/bench_adam.py --out $OUT/adam.json [--tune]

Bytes counted as each path moves them (the cost model's Stack.optimizer_step_bytes_per_param): 40 a
parameter for torch's path, 28 for the kernel; GB/s is those bytes over the median time, beside the
fraction of a device-to-device copy's rate. `alloc_bytes`: what the step allocates above the states
(torch's path: the gradient's fp32 copy; the kernel: nothing). `max_abs_diff`: the two paths' weights
after one step from the same states. `--tune` also times the kernel at other block sizes and warps (the
defaults, meshplan.kernels.adam.BLOCK and WARPS, are torch inductor's pointwise ones, untimed here).
On a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json

import torch

# (name, shape): a square projection, a wide MLP projection, and Mixtral's 8 experts' [gate; up] held
# as one stacked parameter (meshplan/executor/blocks.MoEMLP: 8 × 2·14336 × 4096)
SIZES = (("4096x4096", (4096, 4096)), ("4096x32768", (4096, 32768)), ("8x28672x4096", (8, 28672, 4096)))
TUNE = [(block, warps) for block in (1024, 2048, 4096, 8192) for warps in (4, 8, 16) if block // (32 * warps) >= 4]
HYPER = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8)


def _states(shape, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    p = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = p.float()
    m = torch.randn(shape, device="cuda", generator=gen).mul_(1e-3)
    v = torch.rand(shape, device="cuda", generator=gen).mul_(1e-6)
    return p, grad, w, m, v


def _alloc_bytes(fn) -> int:
    """Bytes fn allocates above what is allocated before it (the step's transients)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _time_one(name: str, shape: tuple, copy_bw: float, tune: bool) -> dict:
    """One parameter's step down both paths: times, bytes a second, transients, and their difference."""
    from meshplan.executor.optim import torch_adam_step
    from meshplan.executor.run import median_time_s
    from meshplan.kernels import adam

    p, grad, w, m, v = _states(shape, seed=0)
    n, dest = p.numel(), p.view(-1)
    # One step from the same states down both paths: the weights agree to fp32 rounding.
    ref = [t.clone() for t in (w, m, v)]
    torch_adam_step(*ref, grad, p.clone().view(-1), t=1, steps={}, **HYPER)
    adam.adam_step(w, m, v, grad, dest, step=1, **HYPER)
    diff = (w - ref[0]).abs().max().item()
    ref = None
    torch.cuda.empty_cache()
    t = [1]

    def old():
        t[0] += 1
        torch_adam_step(w, m, v, grad, dest, t=t[0], steps={}, **HYPER)

    def new(block=adam.BLOCK, warps=adam.WARPS):
        t[0] += 1  # a new step count every call: Triton must not compile again for it
        adam.adam_step(w, m, v, grad, dest, step=t[0], block=block, num_warps=warps, **HYPER)

    old_s, new_s = median_time_s(old, reps=10, warmup=3), median_time_s(new, reps=10, warmup=3)
    row = {
        "parameter": name,
        "shape": list(shape),
        "elements": n,
        "torch_s": old_s,
        "torch_bytes_per_param": 40,
        "torch_bytes_per_s": 40 * n / old_s,
        "torch_copy_fraction": 40 * n / old_s / copy_bw,
        "torch_alloc_bytes": _alloc_bytes(old),
        "kernel_s": new_s,
        "kernel_bytes_per_param": 28,
        "kernel_bytes_per_s": 28 * n / new_s,
        "kernel_copy_fraction": 28 * n / new_s / copy_bw,
        "kernel_alloc_bytes": _alloc_bytes(new),
        "kernel_block": adam.BLOCK,
        "kernel_warps": adam.WARPS,
        "speedup": old_s / new_s,
        "max_abs_diff": diff,
    }
    if tune:
        row["tune"] = []
        for block, warps in TUNE:
            s = median_time_s(lambda: new(block, warps), reps=10, warmup=2)  # noqa: B023 (timed at once)
            row["tune"].append({"block": block, "warps": warps, "kernel_s": s, "kernel_bytes_per_s": 28 * n / s})
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tune", action="store_true", help="time the kernel at other block sizes and warps too")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_adam.py times the optimizer on a GPU: no CUDA device here, nothing run.")
        return 0
    from meshplan.executor.run import copy_roofline_bytes_per_s

    copy_bw = copy_roofline_bytes_per_s()
    rows = []
    print(
        f"{'parameter':>14} {'elements':>13} {'torch ms':>9} {'GB/s':>6} {'kernel ms':>10} {'GB/s':>6} {'speedup':>8}"
    )
    for name, shape in SIZES:
        row = _time_one(name, shape, copy_bw, args.tune)
        rows.append(row)
        n, old_s, new_s = row["elements"], row["torch_s"], row["kernel_s"]
        print(
            f"{name:>14} {n:>13,} {old_s * 1e3:>9.3f} {40 * n / old_s / 1e9:>6.0f} {new_s * 1e3:>10.3f} "
            f"{28 * n / new_s / 1e9:>6.0f} {old_s / new_s:>7.2f}x   (allocated in the step: torch "
            f"{row['torch_alloc_bytes'] / 2**20:.0f} MiB, kernel {row['kernel_alloc_bytes'] / 2**20:.0f} MiB; "
            f"max |w diff| {row['max_abs_diff']:.1e})",
            flush=True,
        )
        for tuned in row.get("tune", []):
            print(
                f"{'':>14} block {tuned['block']:>5} warps {tuned['warps']:>2}: {tuned['kernel_s'] * 1e3:.3f} ms, "
                f"{tuned['kernel_bytes_per_s'] / 1e9:.0f} GB/s",
                flush=True,
            )
        torch.cuda.empty_cache()
    json.dump(
        {
            "command": "python benchmarks/bench_adam.py --out $OUT/adam.json" + (" --tune" if args.tune else ""),
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "triton": __import__("triton").__version__,
            "copy_bytes_per_s": copy_bw,
            "runs": rows,
        },
        open(args.out, "w"),
        indent=1,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a torch elementwise or copy kernel costs beyond its bytes, on one GPU: a chain of `--chain` kernels of one
op on tensors of 2 KiB to 128 MiB, replayed as a CUDA graph (no host between them, as the executor's graphed steps
run) and launched eagerly, time a kernel against the bytes it moves. Fitted per op as t = α + bytes / β
(meshplan.topologies.calibrate.fit_alpha_bandwidth: relative errors, α ≥ 0): α is the kernel's own floor, β its
streaming rate, given as a fraction of the GPU's rated HBM rate (--rated-tb-per-s, the preset's). A chain reuses its
tensors, so those that fit the GPU's L2 (50 MB on an H200) are served from it and β comes out above the HBM rate: the
fit is for α, which the small tensors set, not for β.

Ops, bf16 (bytes a kernel: read and written):
- add: out = a + b into a third tensor (3 × size)
- mul_: x.mul_(s) in place (2 × size)
- copy: out.copy_(x) (2 × size)
- cat: torch.cat of two halves into one (2 × size)
- fp32: x.float() into a new tensor (size + 2 × size)

    python benchmarks/bench_kernel_floor.py --rated-tb-per-s 4.8 --out $OUT/kernel-floor-h200.json
"""

from __future__ import annotations

import argparse
import json

import torch

from meshplan.executor.run import graph_replay_s, median_time_s
from meshplan.topologies.calibrate import fit_alpha_bandwidth

KIB = 1024
SIZES = [2 * KIB * 4**i for i in range(9)]  # a tensor's bytes: 2 KiB, 8 KiB, … 128 MiB


def _op(name: str, numel: int):
    """(fn running one kernel of the op, bytes it moves)."""
    x = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    e = x.element_size()
    if name == "add":
        y, out = torch.randn_like(x), torch.empty_like(x)
        return (lambda: torch.add(x, y, out=out)), 3 * numel * e
    if name == "mul_":
        return (lambda: x.mul_(1.0)), 2 * numel * e
    if name == "copy":
        out = torch.empty_like(x)
        return (lambda: out.copy_(x)), 2 * numel * e
    if name == "cat":
        a, b = x[: numel // 2], x[numel // 2 :].clone()
        out = torch.empty_like(x)
        return (lambda: torch.cat([a, b], out=out)), 2 * numel * e
    if name == "fp32":
        out = torch.empty(numel, device="cuda", dtype=torch.float32)
        return (lambda: out.copy_(x)), numel * (e + 4)
    raise ValueError(name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rated-tb-per-s", type=float, required=True)
    ap.add_argument("--chain", type=int, default=200, help="kernels a timed chain")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    rated = args.rated_tb_per_s * 1e12
    rows, fits = [], {}
    for name in ("add", "mul_", "copy", "cat", "fp32"):
        points = {"graph": [], "eager": []}
        for size in SIZES:
            fn, nbytes = _op(name, size // 2)

            def chain(fn=fn):
                for _ in range(args.chain):
                    fn()

            for how, timer in (("graph", graph_replay_s), ("eager", median_time_s)):
                t = timer(chain, reps=args.reps) / args.chain
                points[how].append((nbytes, t))
                rows.append({"op": name, "how": how, "tensor_bytes": size, "bytes": nbytes, "s": t})
                frac = nbytes / t / rated
                print(f"{name:5s} {how:5s} {size / KIB:10.0f} KiB {t * 1e6:9.2f} us  {frac:6.3f} of rated")
        for how, pts in points.items():
            alpha, beta = fit_alpha_bandwidth(pts)
            fits[f"{name}/{how}"] = {"alpha_s": alpha, "beta_bytes_per_s": beta, "beta_of_rated": beta / rated}
            print(f"  {name} {how}: alpha {alpha * 1e6:.2f} us, beta {beta / 1e12:.2f} TB/s ({beta / rated:.3f} rated)")
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items())
    record = {
        "command": f"python benchmarks/bench_kernel_floor.py {flags}",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "rated_bytes_per_s": rated,
        "fits": fits,
        "rows": rows,
    }  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()

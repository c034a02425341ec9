"""A Mamba-2 sequence shard's correction for its entering state (meshplan/kernels/shard_state.py)
against the torch ops it replaces (meshplan.kernels.reference.entering_state_ref, with autograd), on
one GPU: forward and forward + backward time, each Triton kernel's profiled time and HBM traffic over
the copy roofline, and the error against float64.

    python benchmarks/bench_shard_state.py --out $OUT/shard-state.json

Shapes: mamba2-2.7b's 80 heads of 64, one B/C group of d_state 128, a shard of 64K and 256K tokens
(sp=2 at 128K and 512K), bf16 y0 and C (C a column slice of the conv output, as the executor passes it).
"""

from __future__ import annotations

import argparse
import json

import torch

from meshplan.costmodel.blocks.mamba2 import sp_correction_bytes
from meshplan.executor.run import copy_roofline_bytes_per_s, kernel_times, median_time_s
from meshplan.kernels.reference import entering_state_ref
from meshplan.kernels.shard_state import EnteringStateFn

KERNELS = ("_entering_fwd", "_entering_bwd_dc", "_entering_bwd_de")
SHAPES = ((1, 65536, 80, 64, 1, 128), (1, 262144, 80, 64, 1, 128))


def inputs(b, s, h, p, g, n, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    y0 = torch.randn(b, s, h, p, device="cuda", dtype=torch.bfloat16, generator=gen)
    xbc = torch.randn(b, s, h * p + 2 * g * n, device="cuda", dtype=torch.bfloat16, generator=gen)
    C = xbc[..., h * p + g * n :].view(b, s, g, n)
    cum = torch.cumsum(-torch.rand(b, h, s, device="cuda", generator=gen) * 1e-3, -1)
    E = torch.randn(b, h, p, n, device="cuda", generator=gen)
    return [y0, C, cum, E], torch.randn_like(y0)


def traffic(b, s, h, p, g, n, e=2) -> dict:
    """HBM bytes of each kernel, as the cost model counts them
    (meshplan.costmodel.blocks.mamba2.sp_correction_bytes)."""
    return {"_" + k: v for k, v in sp_correction_bytes(b * s, h, p, g, n, e).items()}


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def torch_path(y0, C, cum, E):
    return entering_state_ref(y0, C, cum.transpose(1, 2), E)


def train(fn, ins, dy):
    leaves = [t.detach().requires_grad_() for t in ins]
    fn(*leaves).backward(dy)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    copy_bw = copy_roofline_bytes_per_s()
    rows = []
    for shape in SHAPES:
        ins, dy = inputs(*shape)
        with torch.no_grad():
            t_fwd = median_time_s(lambda: EnteringStateFn.apply(*ins), reps=10, warmup=2)
            t_ref = median_time_s(lambda: torch_path(*ins), reps=10, warmup=2)
        t_train = median_time_s(lambda: train(EnteringStateFn.apply, ins, dy), reps=10, warmup=2)
        t_ref_train = median_time_s(lambda: train(torch_path, ins, dy), reps=10, warmup=2)
        k = kernel_times(lambda: train(EnteringStateFn.apply, ins, dy), KERNELS)
        tb = traffic(*shape)
        kernels = {
            name: {"s": k[name], "bytes": tb[name], "bandwidth_fraction": tb[name] / k[name] / copy_bw}
            for name in KERNELS
        }
        kernels["other"] = {"s": k["other"]}
        rows.append(
            {
                "shape": shape,
                "forward_s": t_fwd,
                "torch_forward_s": t_ref,
                "train_s": t_train,
                "torch_train_s": t_ref_train,
                "forward_speedup": t_ref / t_fwd,
                "train_speedup": t_ref_train / t_train,
                "kernels": kernels,
            }
        )
        print(
            f"{shape}: forward {t_fwd * 1e3:.2f} ms (torch {t_ref * 1e3:.2f}), forward+backward {t_train * 1e3:.2f} ms "
            f"(torch {t_ref_train * 1e3:.2f}); "
            + ", ".join(
                f"{n} {v['s'] * 1e3:.2f} ms {v['bandwidth_fraction']:.0%}" for n, v in kernels.items() if "bytes" in v
            ),
            flush=True,
        )
        del ins, dy
        torch.cuda.empty_cache()
    # Error against float64 on a smaller shard: the output and every gradient.
    ins, dy = inputs(1, 4096, 16, 64, 1, 128, seed=1)
    ins[2] = torch.cumsum(-torch.rand(1, 16, 4096, device="cuda") * 1e-3, -1)
    got = [t.detach().requires_grad_() for t in ins]
    want = [t.detach().double().requires_grad_() for t in ins]
    y, yr = EnteringStateFn.apply(*got), torch_path(*want)
    y.backward(dy)
    yr.backward(dy.double())
    err = {"y": rel(y, yr)} | {n: rel(a.grad, b.grad) for n, a, b in zip(("y0", "C", "cum", "E"), got, want)}
    print("relative error against float64: " + ", ".join(f"{n} {v:.1e}" for n, v in err.items()))
    json.dump(
        {
            "command": "python benchmarks/bench_shard_state.py --out $OUT/shard-state.json",
            "gpu": torch.cuda.get_device_name(0),
            "copy_bytes_per_s": copy_bw,
            "runs": rows,
            "rel_err_vs_fp64": err,
        },
        open(args.out, "w"),
        indent=1,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

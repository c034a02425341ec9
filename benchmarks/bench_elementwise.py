"""The executor's SwiGLU and rotary on one GPU: the torch ops they replaced against the Triton kernels
(meshplan/kernels/swiglu.py, rotary.py), forward and backward, bf16, at dense-7b's and Llama-3-8B's
widths; achieved bandwidth against the copy roofline; and how far each is from float64 math.

    python benchmarks/bench_elementwise.py --out $OUT/elementwise.json [--tune]

SwiGLU over h (rows, 2f) = [gate | up], the forward and backward timed together through autograd
(h a leaf, its gradient taken by torch.autograd.grad): the old path is autograd through
F.silu(gate) · up on h's halves, the new experts.SwiGLUFn. Bytes counted as the kernels move them:
read 2f, write f forward; read 3f, write 2f backward.

The rotary over the q and k heads of a (1, tokens, (q + 2·kv) · 128) QKV output: the forward (in place)
and the backward (rotary._RotateQK.backward: the torch path clones the gradient and turns q and k back
in it; the kernel writes it whole into a fresh tensor) timed apart, each as the executor calls it. Bytes:
q and k read and written forward; the whole gradient read and written backward. `tables_mismatches`:
elements where the kernel's cos and sin (rotating [1, …, 1 | 0, …, 0]), rounded to bf16 / fp32, differ
from rotary.Rotary._tables' — 0 when libdevice's cosf / sinf are torch's.

--tune adds a sweep of the kernels' tiles and warps at one shape each (rows 16384 × f 14336; 16384
tokens × 32 + 8 heads).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from types import SimpleNamespace
from unittest import mock

import torch
import triton

from meshplan.executor import rotary
from meshplan.executor.experts import SwiGLUFn
from meshplan.executor.run import copy_roofline_bytes_per_s, median_time_s
from meshplan.kernels import rotary as rotary_kernel
from meshplan.kernels import swiglu as swiglu_kernel
from meshplan.kernels.reference import swiglu_grad_ref, swiglu_ref
from meshplan.models import RopeSpec

SWIGLU_SHAPES = [(rows, f) for rows in (4096, 16384) for f in (14336, 16384)]
ROTARY_SHAPES = [(tokens, q, kv) for tokens in (4096, 16384) for q, kv in ((32, 8), (32, 32))]
HEAD_DIM = 128
BF16 = torch.bfloat16


def _old_swiglu(h):
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def swiglu_row(rows: int, f: int, copy_bw: float) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(rows, 2 * f, device="cuda", dtype=BF16, generator=gen).requires_grad_()
    g = torch.randn(rows, f, device="cuda", dtype=BF16, generator=gen)
    times = {}
    for name, fn in (("torch", _old_swiglu), ("triton", SwiGLUFn.apply)):
        times[f"{name}_fwd_s"] = median_time_s(lambda: fn(h.detach()), reps=10, warmup=2)
        times[f"{name}_fwd_bwd_s"] = median_time_s(lambda: torch.autograd.grad(fn(h), h, g), reps=10, warmup=2)
    with torch.no_grad():
        h1, g1 = h.detach()[:1024], g[:1024]
        hd, gd = h1.double(), g1.double()
        err_fwd = {
            "triton": (swiglu_kernel.swiglu_fwd(h1).double() - swiglu_ref(hd)).abs().max().item(),
            "torch": (_old_swiglu(h1).double() - swiglu_ref(hd)).abs().max().item(),
        }
        err_bwd = (swiglu_kernel.swiglu_bwd(h1, g1).double() - swiglu_grad_ref(hd, gd)).abs().max().item()
    moved = rows * f * 2 * (3 + 5)
    return {
        "rows": rows,
        "f": f,
        **times,
        "speedup_fwd_bwd": times["torch_fwd_bwd_s"] / times["triton_fwd_bwd_s"],
        "triton_bandwidth_fraction": moved / times["triton_fwd_bwd_s"] / copy_bw,
        "max_abs_err_fwd_vs_fp64": err_fwd,
        "max_abs_err_bwd_triton_vs_fp64": err_bwd,
    }


def _path(name: str):
    """The executor's rotary as it runs on the GPU ("triton"), or on its torch ops as on the CPU."""
    return mock.patch.object(rotary, "_kernel", lambda t: False) if name == "torch" else contextlib.nullcontext()


def rotary_row(tokens: int, q: int, kv: int, copy_bw: float) -> dict:
    rot = rotary.Rotary(RopeSpec(theta=500000.0), HEAD_DIM)
    width = (q + 2 * kv) * HEAD_DIM
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(1, tokens, width, device="cuda", dtype=BF16, generator=gen)
    grad = torch.randn(1, tokens, width, device="cuda", dtype=BF16, generator=gen)
    positions = torch.arange(tokens, device="cuda")
    args = (rot, positions, q * HEAD_DIM, kv * HEAD_DIM, HEAD_DIM)
    ctx = SimpleNamespace(args=args)
    times = {}
    for name in ("torch", "triton"):
        with _path(name):
            work = qkv.clone()
            times[f"{name}_fwd_s"] = median_time_s(lambda: rotary._turn(work, *args), reps=10, warmup=2)
            times[f"{name}_bwd_s"] = median_time_s(lambda: rotary._RotateQK.backward(ctx, grad), reps=10, warmup=2)
        times[f"{name}_fwd_bwd_s"] = times[f"{name}_fwd_s"] + times[f"{name}_bwd_s"]
    # Against float64 math on the same bf16 tables: each path's largest error, forward.
    with torch.no_grad():
        exact = _exact(qkv, rot, positions, q + kv)
        errs = {}
        for name in ("torch", "triton"):
            with _path(name):
                out = qkv.clone()
                rotary._turn(out, *args)
            errs[name] = (out.double() - exact).abs().max().item()
    qk_bytes = tokens * (q + kv) * HEAD_DIM * 2
    moved = 2 * qk_bytes + 2 * grad.numel() * 2
    return {
        "tokens": tokens,
        "q_heads": q,
        "kv_heads": kv,
        **times,
        "speedup_fwd_bwd": times["torch_fwd_bwd_s"] / times["triton_fwd_bwd_s"],
        "triton_bandwidth_fraction": moved / times["triton_fwd_bwd_s"] / copy_bw,
        "max_abs_err_fwd_vs_fp64": errs,
        "tables_mismatches": {
            str(dtype).removeprefix("torch."): _table_mismatches(rot, tokens, dtype) for dtype in (BF16, torch.float32)
        },
    }


def _exact(qkv, rot, positions, turned):
    """The q and k heads turned in float64 by Rotary's bf16-rounded cos and sin (v as it is)."""
    cos, sin = (t.double() for t in rot._tables(positions, qkv.dtype))
    x = qkv.double().clone()
    heads = x[..., : turned * HEAD_DIM].unflatten(-1, (turned, HEAD_DIM))
    x1, x2 = heads[..., : HEAD_DIM // 2].clone(), heads[..., HEAD_DIM // 2 :].clone()
    heads[..., : HEAD_DIM // 2] = x1 * cos - x2 * sin
    heads[..., HEAD_DIM // 2 :] = x2 * cos + x1 * sin
    return x


def _table_mismatches(rot, tokens: int, dtype) -> int:
    """Elements of the kernel's cos and sin (one head of [1 | 0] turned) unequal to Rotary._tables'."""
    positions = torch.arange(tokens, device="cuda")
    t = torch.zeros(1, tokens, 1, HEAD_DIM, device="cuda", dtype=dtype)
    t[..., : HEAD_DIM // 2] = 1
    rotary_kernel.rotate(t, positions, rot.freq_on(t.device))
    cos, sin = rot._tables(positions, dtype)
    return int((t[0, :, 0, : HEAD_DIM // 2] != cos[:, 0]).sum() + (t[0, :, 0, HEAD_DIM // 2 :] != sin[:, 0]).sum())


def tune() -> list[dict]:
    """Tiles and warps of both kernels at one shape each, forward + backward."""
    out = []
    rows, f = 16384, 14336
    h = torch.randn(rows, 2 * f, device="cuda", dtype=BF16)
    g = torch.randn(rows, f, device="cuda", dtype=BF16)
    for tile, block_max, warps in itertools.product((1024, 2048, 4096, 8192), (512, 1024, 2048), (4, 8)):
        if block_max > tile:
            continue
        kw = dict(tile=tile, block_max=block_max, warps=warps)
        s = median_time_s(lambda: (swiglu_kernel.swiglu_fwd(h, **kw), swiglu_kernel.swiglu_bwd(h, g, **kw)), reps=10)
        out.append({"kernel": "swiglu", **kw, "fwd_bwd_s": s})
        print(f"swiglu {kw}: {s * 1e3:.3f} ms", flush=True)
    tokens, q, kv = 16384, 32, 8
    rot = rotary.Rotary(RopeSpec(theta=500000.0), HEAD_DIM)
    heads = q + 2 * kv
    x = torch.randn(1, tokens, heads, HEAD_DIM, device="cuda", dtype=BF16)
    dst = torch.empty_like(x)
    pos, freq = torch.arange(tokens, device="cuda"), rot.freq_on(x.device)
    for tile, tokens_max, warps in itertools.product((1024, 2048, 4096, 8192), (1, 4, 8, 16), (4, 8)):
        kw = dict(tile=tile, tokens=tokens_max, warps=warps)
        if tokens_max * triton.next_power_of_2(HEAD_DIM // 2) > tile:
            continue

        def step():
            rotary_kernel.rotate(x[:, :, : q + kv], pos, freq, **kw)
            rotary_kernel.rotate(x, pos, freq, True, dst, q + kv, **kw)

        s = median_time_s(step, reps=10)
        out.append({"kernel": "rotary", **kw, "fwd_bwd_s": s})
        print(f"rotary {kw}: {s * 1e3:.3f} ms", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tune", action="store_true", help="also sweep the kernels' tiles and warps")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_elementwise: no CUDA device; nothing to time")
        return 0
    copy_bw = copy_roofline_bytes_per_s()
    result = {
        "command": "python benchmarks/bench_elementwise.py --out $OUT/elementwise.json"
        + (" --tune" if args.tune else ""),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bytes_per_s": copy_bw,
        "swiglu": [],
        "rotary": [],
    }
    print(f"{'swiglu rows x f':>22} {'torch ms':>9} {'triton ms':>9} {'x':>5} {'roofline':>8}   (fwd+bwd)")
    for rows, f in SWIGLU_SHAPES:
        r = swiglu_row(rows, f, copy_bw)
        result["swiglu"].append(r)
        print(
            f"{rows:>12} x {f:<8} {r['torch_fwd_bwd_s'] * 1e3:9.3f} {r['triton_fwd_bwd_s'] * 1e3:9.3f} "
            f"{r['speedup_fwd_bwd']:5.2f} {r['triton_bandwidth_fraction']:8.0%}",
            flush=True,
        )
    print(f"{'rotary tokens x q+kv':>22} {'torch ms':>9} {'triton ms':>9} {'x':>5} {'roofline':>8}   tables_mismatches")
    for tokens, q, kv in ROTARY_SHAPES:
        r = rotary_row(tokens, q, kv, copy_bw)
        result["rotary"].append(r)
        print(
            f"{tokens:>12} x {q}+{kv:<5} {r['torch_fwd_bwd_s'] * 1e3:9.3f} {r['triton_fwd_bwd_s'] * 1e3:9.3f} "
            f"{r['speedup_fwd_bwd']:5.2f} {r['triton_bandwidth_fraction']:8.0%}   {r['tables_mismatches']}",
            flush=True,
        )
    if args.tune:
        result["tune"] = tune()
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

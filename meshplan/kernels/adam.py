"""Mixed-precision Adam in one pass (Triton): the step optim.MixedAdam takes for each parameter on a GPU.

For one parameter, flattened: read its gradient in its own dtype (bf16, fp16 or fp32), the fp32 master
weight w and moments m and v; update them in place in fp32, AdamW's arithmetic with weight decay 0
(torch's fused AdamW kernel, aten/src/ATen/native/cuda/fused_adam_utils.cuh adam_math):

    m ← b1·m + (1 − b1)·g     v ← b2·v + (1 − b2)·g²     w ← w − lr/(1 − b1^t) · m / (√v / √(1 − b2^t) + eps)

and write w in the parameter's dtype into `out` (the parameter itself, or under ZeRO the slice of the
weight that the all-gather sends from). Bytes a parameter with bf16 gradients and weights: read 2 + 12,
write 12 + 2 = 28, against 40 for torch's path (the gradient cast to fp32, read 2 and write 4; the fused
AdamW kernel over fp32 weight, gradient, m and v, read 16 and write 12; the bf16 copy-back, read 4 and
write 2), and no fp32 temporary of the gradient's size.

The step's scalars (the bias corrections) go in as float arguments, which Triton does not specialize
on: one compiled kernel serves every step. It does specialize the element count (divisible by 16, or
one) and the pointers' 16-byte alignment, so a model's parameters take a few compilations at most.
Division and square root round as IEEE's (div_rn, sqrt_rn), as the CUDA code torch compiles does;
Triton's `/` and sqrt on fp32 are approximate on NVIDIA GPUs.

Launched through the JIT (`kernel[grid]`), not meshplan.kernels.fastlaunch: an optimizer step launches
one kernel a parameter, a few hundred in a whole model, and fastlaunch's own measurement found keyed
launches save nothing over Triton 3.6's native argument binding (its docstring).
Reference: meshplan.kernels.reference.adam_step_ref.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# Elements a program and its warps: the pointwise default of torch inductor (1024-element blocks, a
# warp per 256 elements: torch/_inductor/runtime/triton_heuristics.py, triton_config), 8 elements a
# thread — one 16-byte load of the bf16 gradient, two of each fp32 stream. It runs at 3.3-4.15 TB/s on an
# H200 and 2.5-3.0 on an H100 over 16.8M-939M elements, the GPU's copy rate on the large weights, 1.5-1.8×
# torch's casts around its fused AdamW (benchmarks/results/adam-h200.json, adam-h100.json, `python
# benchmarks/bench_adam.py [--tune]`); on the H100 sweep every block of 1,024-4,096 elements with 4-16 warps
# came within 2% of the others (8,192 with 4 warps 40% slower).
BLOCK = 1024
WARPS = 4

STEP_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # gradient and weight dtypes the kernel takes


@triton.jit
def _adam_kernel(
    w_ptr,
    m_ptr,
    v_ptr,
    g_ptr,
    out_ptr,
    n,
    beta1,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    step_size,
    bias2_sqrt,
    eps,
    scalars_ptr,
    BLOCK: tl.constexpr,
    SCALARS_ON_DEVICE: tl.constexpr,
):
    if SCALARS_ON_DEVICE:  # a captured step (CUDA graph): the host fills them before each replay
        step_size = tl.load(scalars_ptr)
        bias2_sqrt = tl.load(scalars_ptr + 1)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # stacked experts pass 2^31 elements
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * (g * g)
    denom = tl.div_rn(tl.sqrt_rn(v), bias2_sqrt) + eps
    w = w - tl.div_rn(step_size * m, denom)
    tl.store(w_ptr + offs, w, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    if out_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(out_ptr + offs, _round_bf16(w), mask=mask)
    else:
        tl.store(out_ptr + offs, w.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _round_bf16(x):
    """fp32 → bf16 rounded to nearest, ties to even, NaN as 0x7FC0: the GPU's cvt.rn and torch's copy_
    (c10 round_to_nearest_even), written in integer operations because Triton's interpreter truncates
    where the GPU rounds, and the tests run the kernel there."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    bits = tl.where(x != x, 0x7FC0, bits)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


def fits(w: torch.Tensor, m: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether adam_step takes these: fp32 states, a gradient and an output of STEP_DTYPES, all
    contiguous, of one element count, on one CUDA device (or anywhere under TRITON_INTERPRET)."""
    tensors = (w, m, v, grad, out)
    return (
        all(t.is_contiguous() and t.numel() == w.numel() and t.device == w.device for t in tensors)
        and all(t.dtype == torch.float32 for t in (w, m, v))
        and grad.dtype in STEP_DTYPES
        and out.dtype in STEP_DTYPES
    )


def adam_step(
    w: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    grad: torch.Tensor,
    out: torch.Tensor,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    step: int,
    scalars: torch.Tensor | None = None,
    block: int = BLOCK,
    num_warps: int = WARPS,
) -> None:
    """Step `step` (from 1) of Adam on one parameter: w, m, v (fp32) updated in place from `grad`, and
    `out` ← w in out's dtype. All five contiguous, of one element count (shapes may differ: each is
    read flat). `scalars`: an fp32 tensor on w's device holding (lr / (1 − b1^t), √(1 − b2^t)) — the
    kernel reads the bias corrections there instead of taking `step`'s as arguments, so that a CUDA
    graph that captured the launch steps on (step_scalars fills it before each replay)."""
    if not fits(w, m, v, grad, out):
        raise ValueError(
            "adam_step: w, m, v must be fp32 and grad, out bf16/fp16/fp32, all contiguous, of one length, on one device"
        )
    n = w.numel()
    if n == 0:
        return
    b1, b2 = betas
    step_size, bias2_sqrt = step_scalars(lr, betas, step)
    on_device = scalars is not None
    _adam_kernel[(triton.cdiv(n, block),)](
        w,
        m,
        v,
        grad,
        out,
        n,
        b1,
        b2,
        1 - b1,
        1 - b2,
        step_size,
        bias2_sqrt,
        eps,
        scalars if on_device else w,  # not read without SCALARS_ON_DEVICE
        BLOCK=block,
        SCALARS_ON_DEVICE=on_device,
        num_warps=num_warps,
    )


def step_scalars(lr: float, betas: tuple[float, float], step: int) -> tuple[float, float]:
    """Step `step`'s bias corrections (lr / (1 − b1^t), √(1 − b2^t)) in double on the host, as torch's
    kernel forms them; the kernel takes them in fp32."""
    b1, b2 = betas
    return lr / (1 - b1**step), math.sqrt(1 - b2**step)

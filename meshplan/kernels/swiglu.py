"""SwiGLU of a fused [gate | up] projection output in Triton, one pass each way:

    forward   out = silu(gate) · up                                   reads 2f, writes f a row
    backward  dh = [dout · up · silu'(gate) | dout · silu(gate)]      reads 3f, writes 2f a row

with silu(x) = x·σ(x) and silu'(x) = σ(x)·(1 + x·(1 − σ(x))), in fp32, rounded once to h's dtype.
h (rows, 2f) is read where it lies: its last dimension contiguous, its rows evenly spaced (a row
stride ≥ 2f; the padded (P, 2f) buffer of the grouped experts, a dense MLP's (b, s, 2f) output). The
backward writes dh whole, so autograd needs no cat of the two halves' gradients; nothing but h is
kept between the passes (meshplan.executor.experts.SwiGLUFn saves h, and recomputes silu(gate)).

Eager PyTorch runs the same as silu, a product, and in backward two products, silu's backward and a
cat (about 5f moved forward and 13f backward), on the strided halves of h (the non-vectorised path).
Reference: meshplan.kernels.reference.swiglu_ref / swiglu_grad_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# A program's tile: TILE output elements (at most BLOCK_MAX of one row, and rows enough to fill it),
# WARPS warps. Timed, not tuned, on an H100: benchmarks/results/elementwise-h100.json
# (`python benchmarks/bench_elementwise.py`; `--tune` sweeps them).
TILE = 2048
BLOCK_MAX = 1024
WARPS = 4


@triton.jit
def _tile(R, F, BR: tl.constexpr, BF: tl.constexpr):
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)  # rows × 2f passes 2^31 in the MoE buffer
    cols = tl.program_id(1) * BF + tl.arange(0, BF)
    return rows, cols, (rows < R)[:, None] & (cols < F)[None, :]


@triton.jit
def _swiglu_fwd(h_ptr, out_ptr, R, F, HT, BR: tl.constexpr, BF: tl.constexpr):
    """Grid (row blocks, column blocks of f): out[r, c] = silu(h[r, c]) · h[r, f + c]."""
    rows, cols, mask = _tile(R, F, BR, BF)
    src = h_ptr + rows[:, None] * HT + cols[None, :]
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + F, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + rows[:, None] * F + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(h_ptr, d_ptr, dh_ptr, R, F, HT, DT, BR: tl.constexpr, BF: tl.constexpr):
    """Grid (row blocks, column blocks of f): dh (rows, 2f) from h and the output's gradient d."""
    rows, cols, mask = _tile(R, F, BR, BF)
    src = h_ptr + rows[:, None] * HT + cols[None, :]
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + F, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + rows[:, None] * DT + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    dst = dh_ptr + rows[:, None] * (2 * F) + cols[None, :]
    tl.store(dst, (d * up * sig * (1 + gate * (1 - sig))).to(dh_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + F, (d * gate * sig).to(dh_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as (rows, width) with its last dimension contiguous: a view where t's rows are evenly spaced,
    else a contiguous copy."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:  # leading dimensions that do not merge (a column slice with batch > 1)
        return t.reshape(-1, t.shape[-1])


def _launch(f: int, tile: int, block_max: int) -> tuple[int, int]:
    """(rows, columns) of a program's tile over rows of f outputs."""
    bf = min(triton.next_power_of_2(f), block_max)
    return max(1, tile // bf), bf


def swiglu_fwd(h: torch.Tensor, tile: int = TILE, block_max: int = BLOCK_MAX, warps: int = WARPS) -> torch.Tensor:
    """silu(gate) · up of h (…, 2f) = [gate | up] → (…, f) in h's dtype."""
    f = h.shape[-1] // 2
    h2 = _rows(h)
    R = h2.shape[0]
    out = torch.empty(R, f, dtype=h.dtype, device=h.device)
    if out.numel():
        br, bf = _launch(f, tile, block_max)
        _swiglu_fwd[(triton.cdiv(R, br), triton.cdiv(f, bf))](
            h2, out, R, f, h2.stride(0), BR=br, BF=bf, num_warps=warps
        )
    return out.view(*h.shape[:-1], f)


def swiglu_bwd(
    h: torch.Tensor, grad: torch.Tensor, tile: int = TILE, block_max: int = BLOCK_MAX, warps: int = WARPS
) -> torch.Tensor:
    """h's gradient (…, 2f), contiguous, in h's dtype, from the output's gradient `grad` (…, f)."""
    f = h.shape[-1] // 2
    h2, d2 = _rows(h), _rows(grad)
    R = h2.shape[0]
    dh = torch.empty(R, 2 * f, dtype=h.dtype, device=h.device)
    if dh.numel():
        br, bf = _launch(f, tile, block_max)
        _swiglu_bwd[(triton.cdiv(R, br), triton.cdiv(f, bf))](
            h2, d2, dh, R, f, h2.stride(0), d2.stride(0), BR=br, BF=bf, num_warps=warps
        )
    return dh.view(h.shape)

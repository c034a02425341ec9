"""Mamba-2's gated RMSNorm (norm_before_gate=False) in Triton, forward and backward:

    h = y · silu(z)      out = h · rsqrt(Σ_group h² / G + eps) · w

over groups of G channels. A group may span tensor-parallel ranks (one B/C group split by TP-SSM):
then each rank holds `local` channels of it and `reduce` sums the per-row statistics over the ranks —
the sum of squares forward, Σ dout·w·h backward — so the result equals the unsplit norm.

Backward, with r = rsqrt(ss / G + eps) and S = Σ_group dout·w·h:
    dh = r · (dout·w − h · r² · S / G),   dy = dh · silu(z),   dz = dh · y · silu'(z),   dw = Σ_rows dout·h·r.
Nothing fp32 of the row's width is saved or written: the kernels recompute h from y and z. Without a
gate (z None, `rmsnorm_triton`) it is a plain RMSNorm: h = y.
Reference: meshplan.executor.blocks.gated_rmsnorm (autograd through torch ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tile(R, C, BR: tl.constexpr, BC: tl.constexpr):
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)  # rows × channels passes 2^31 at long context
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    return rows, cols, mask, rows[:, None] * C + cols[None, :]


@triton.jit
def _gate(y_ptr, z_ptr, offs, mask, GATED: tl.constexpr):
    """(y, z, sigmoid(z), h) in fp32; without GATED, h = y (a plain RMSNorm; z is not read)."""
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(z)
        h = y * z * sig
    else:
        z, sig, h = y, y, y
    return y, z, sig, h


@triton.jit
def _row_sums(y_ptr, z_ptr, dout_ptr, w_ptr, out_ptr, R, C, LOCAL, NG, DOT: tl.constexpr, GATED: tl.constexpr,
              BR: tl.constexpr, BC: tl.constexpr):
    """Grid (row blocks, local groups): per row and group Σ h² (or, with DOT, Σ dout·w·h)."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    g = tl.program_id(1)
    acc = tl.zeros((BR,), dtype=tl.float32)
    for c0 in range(0, LOCAL, BC):
        cols = g * LOCAL + c0 + tl.arange(0, BC)
        mask = (rows < R)[:, None] & (cols < (g + 1) * LOCAL)[None, :]
        offs = rows[:, None] * C + cols[None, :]
        y, z, sig, h = _gate(y_ptr, z_ptr, offs, mask, GATED)
        if DOT:
            d = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
            acc += tl.sum(d * w[None, :] * h, axis=1)
        else:
            acc += tl.sum(h * h, axis=1)
    tl.store(out_ptr + rows * NG + g, acc, mask=rows < R)


@triton.jit
def _norm_out(y_ptr, z_ptr, w_ptr, ss_ptr, out_ptr, R, C, LOCAL, NG, GROUP, eps, GATED: tl.constexpr,
              BR: tl.constexpr, BC: tl.constexpr):
    rows, cols, mask, offs = _tile(R, C, BR, BC)
    y, z, sig, h = _gate(y_ptr, z_ptr, offs, mask, GATED)
    ss = tl.load(ss_ptr + rows[:, None] * NG + cols[None, :] // LOCAL, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    out = h * tl.rsqrt(ss / GROUP + eps) * w[None, :]
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_grads(y_ptr, z_ptr, w_ptr, ss_ptr, s_ptr, dout_ptr, dy_ptr, dz_ptr, dw_ptr, R, C, LOCAL, NG, GROUP, eps,
                GATED: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    rows, cols, mask, offs = _tile(R, C, BR, BC)
    y, z, sig, h = _gate(y_ptr, z_ptr, offs, mask, GATED)
    stat = rows[:, None] * NG + cols[None, :] // LOCAL
    r = tl.rsqrt(tl.load(ss_ptr + stat, mask=mask, other=0.0) / GROUP + eps)
    S = tl.load(s_ptr + stat, mask=mask, other=0.0)
    d = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    dh = r * (d * w[None, :] - h * r * r * S / GROUP)
    if GATED:
        tl.store(dy_ptr + offs, (dh * z * sig).to(dy_ptr.dtype.element_ty), mask=mask)
        tl.store(dz_ptr + offs, (dh * y * sig * (1 + z * (1 - sig))).to(dz_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(dy_ptr + offs, dh.to(dy_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_ptr + tl.program_id(0) * C + cols, tl.sum(d * h * r, axis=0), mask=cols < C)


BR, BC = 16, 256  # rows × channels per program


def _stats(y, z, dout, w, local, dot: bool):
    R, C = y.shape
    ng = C // local
    out = torch.empty(R, ng, dtype=torch.float32, device=y.device)
    _row_sums[(triton.cdiv(R, BR), ng)](y, y if z is None else z, dout if dot else y, w, out, R, C, local, ng,
                                        DOT=dot, GATED=z is not None, BR=BR, BC=BC)
    return out


class GatedRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, z, w, local: int, group: int, eps: float, reduce):
        shape = y.shape
        y2 = y.reshape(-1, shape[-1]).contiguous()
        z2 = None if z is None else z.reshape(-1, shape[-1]).contiguous()
        R, C = y2.shape
        ss = _stats(y2, z2, None, w, local, dot=False)
        if reduce is not None:
            ss = reduce(ss)
        out = torch.empty_like(y2)
        grid = (triton.cdiv(R, BR), triton.cdiv(C, BC))
        _norm_out[grid](y2, y2 if z2 is None else z2, w, ss, out, R, C, local, C // local, group, eps,
                        GATED=z2 is not None, BR=BR, BC=BC)
        ctx.save_for_backward(y2, z2, w, ss)
        ctx.shape, ctx.local, ctx.group, ctx.eps, ctx.reduce = shape, local, group, eps, reduce
        return out.view(shape)

    @staticmethod
    def backward(ctx, dout):
        y, z, w, ss = ctx.saved_tensors
        R, C = y.shape
        d = dout.reshape(R, C).contiguous()
        S = _stats(y, z, d, w, ctx.local, dot=True)
        if ctx.reduce is not None:
            S = ctx.reduce(S)
        gated = z is not None
        dy = torch.empty_like(y)
        dz = torch.empty_like(z) if gated else None
        grid = (triton.cdiv(R, BR), triton.cdiv(C, BC))
        dw = torch.empty(grid[0], C, dtype=torch.float32, device=y.device)
        _norm_grads[grid](y, z if gated else y, w, ss, S, d, dy, dz if gated else dy, dw, R, C, ctx.local,
                          C // ctx.local, ctx.group, ctx.eps, GATED=gated, BR=BR, BC=BC)
        return (dy.view(ctx.shape), dz.view(ctx.shape) if gated else None, dw.sum(0).to(w.dtype),
                None, None, None, None)


def rmsnorm_triton(x, weight, eps: float = 1e-5):
    """Plain RMSNorm over the last dimension (one group of all channels, no gate): nothing of the
    row's width in fp32 is kept or made, where the torch ops make several fp32 copies in backward."""
    return GatedRMSNormFn.apply(x, None, weight.contiguous(), x.shape[-1], x.shape[-1], eps, None)


def gated_rmsnorm_triton(y, z, weight, group_size: int, eps: float = 1e-5, local: int | None = None, reduce=None):
    """y, z (..., channels); groups of `group_size` channels, of which this rank holds `local` (all by
    default); `reduce` sums (rows, local groups) fp32 statistics over the ranks sharing a group."""
    return GatedRMSNormFn.apply(y, z, weight.contiguous(), local or group_size, group_size, eps, reduce)

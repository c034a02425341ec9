"""Mamba-2's gated RMSNorm (norm_before_gate=False) in Triton, forward and backward:

    h = y · silu(z)      out = h · rsqrt(Σ_group h² / G + eps) · w

over groups of G channels. A group may span tensor-parallel ranks (one B/C group split by TP-SSM):
then each rank holds `local` channels of it and `reduce` sums the per-row statistics over the ranks —
the sum of squares forward, Σ dout·w·h backward — so the result equals the unsplit norm.

Backward, with r = rsqrt(ss / G + eps) and S = Σ_group dout·w·h:
    dh = r · (dout·w − h · r² · S / G),   dy = dh · silu(z),   dz = dh · y · silu'(z),   dw = Σ_rows dout·h·r.
Nothing fp32 of the row's width is saved or written: the kernels recompute h from y and z. Without a
gate (z None, `rmsnorm_triton`) it is a plain RMSNorm: h = y.

Where a row's group fits in registers and no other rank holds part of it, one pass a direction: the
forward reads y and z once and writes the output; the backward recomputes the statistics and reads y,
z and dout once. y, z and dout are read where they lie (a column slice of a wider tensor included).
Otherwise two passes: the statistics, then the output (or the gradients).
Reference: meshplan.executor.blocks.gated_rmsnorm (autograd through torch ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from meshplan.kernels import launch


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
def _row_sums(
    y_ptr,
    z_ptr,
    dout_ptr,
    w_ptr,
    out_ptr,
    R,
    C,
    LOCAL,
    NG,
    DOT: tl.constexpr,
    GATED: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
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
def _norm_out(
    y_ptr,
    z_ptr,
    w_ptr,
    ss_ptr,
    out_ptr,
    R,
    C,
    LOCAL,
    NG,
    GROUP,
    eps,
    GATED: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
    rows, cols, mask, offs = _tile(R, C, BR, BC)
    y, z, sig, h = _gate(y_ptr, z_ptr, offs, mask, GATED)
    ss = tl.load(ss_ptr + rows[:, None] * NG + cols[None, :] // LOCAL, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    out = h * tl.rsqrt(ss / GROUP + eps) * w[None, :]
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_grads(
    y_ptr,
    z_ptr,
    w_ptr,
    ss_ptr,
    s_ptr,
    dout_ptr,
    dy_ptr,
    dz_ptr,
    dw_ptr,
    R,
    C,
    LOCAL,
    NG,
    GROUP,
    eps,
    GATED: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
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


@triton.jit
def _group_tile(y_ptr, z_ptr, rows, R, C, YT, ZT, LOCAL, GATED: tl.constexpr, BLOCK: tl.constexpr):
    """One (rows, this program's local group) tile of y and z read at their row strides, in fp32: its
    columns, mask, y, z, sigmoid(z) and h."""
    cols = tl.program_id(1) * LOCAL + tl.arange(0, BLOCK)
    mask = (rows < R)[:, None] & (tl.arange(0, BLOCK) < LOCAL)[None, :]
    y = tl.load(y_ptr + rows[:, None] * YT + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if GATED:
        z = tl.load(z_ptr + rows[:, None] * ZT + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(z)
        h = y * z * sig
    else:
        z, sig, h = y, y, y
    return cols, mask, y, z, sig, h


@triton.jit
def _norm_fwd_rows(
    y_ptr,
    z_ptr,
    w_ptr,
    out_ptr,
    R,
    C,
    YT,
    ZT,
    LOCAL,
    GROUP,
    eps,
    GATED: tl.constexpr,
    BR: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (row blocks, local groups), the group whole in one tile: y and z read once, the output
    written once (no statistics pass)."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    cols, mask, y, z, sig, h = _group_tile(y_ptr, z_ptr, rows, R, C, YT, ZT, LOCAL, GATED, BLOCK)
    r = tl.rsqrt(tl.sum(h * h, axis=1) / GROUP + eps)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + rows[:, None] * C + cols[None, :],
        (h * r[:, None] * w[None, :]).to(out_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def _norm_bwd_rows(
    y_ptr,
    z_ptr,
    w_ptr,
    dout_ptr,
    dy_ptr,
    dz_ptr,
    dw_ptr,
    R,
    C,
    YT,
    ZT,
    DT,
    LOCAL,
    GROUP,
    eps,
    GATED: tl.constexpr,
    BR: tl.constexpr,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Grid (programs, local groups): each program takes row blocks pid, pid + programs, … of its
    group whole, recomputes the statistics from y and z (nothing saved by the forward), writes dy and
    dz, and keeps its share of dw in registers, written once at the end (programs × C, fp32)."""
    w = tl.load(
        w_ptr + tl.program_id(1) * LOCAL + tl.arange(0, BLOCK),
        mask=tl.program_id(1) * LOCAL + tl.arange(0, BLOCK) < C,
        other=0.0,
    ).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    for r0 in tl.range(tl.program_id(0) * BR, R, tl.num_programs(0) * BR, num_stages=STAGES):
        rows = (r0 + tl.arange(0, BR)).to(tl.int64)
        cols, mask, y, z, sig, h = _group_tile(y_ptr, z_ptr, rows, R, C, YT, ZT, LOCAL, GATED, BLOCK)
        d = tl.load(dout_ptr + rows[:, None] * DT + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(h * h, axis=1) / GROUP + eps)[:, None]
        S = tl.sum(d * w[None, :] * h, axis=1)[:, None]
        dh = r * (d * w[None, :] - h * r * r * S / GROUP)
        offs = rows[:, None] * C + cols[None, :]
        if GATED:
            tl.store(dy_ptr + offs, (dh * z * sig).to(dy_ptr.dtype.element_ty), mask=mask)
            tl.store(dz_ptr + offs, (dh * y * sig * (1 + z * (1 - sig))).to(dz_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(dy_ptr + offs, dh.to(dy_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(d * h * r, axis=0)
    cols = tl.program_id(1) * LOCAL + tl.arange(0, BLOCK)
    tl.store(dw_ptr + tl.program_id(0) * C + cols, dw, mask=tl.arange(0, BLOCK) < LOCAL)


BR, BC = 16, 256  # rows × channels per program


def _stats(y, z, dout, w, local, dot: bool):
    R, C = y.shape
    ng = C // local
    out = torch.empty(R, ng, dtype=torch.float32, device=y.device)
    _row_sums[(triton.cdiv(R, BR), ng)](
        y,
        y if z is None else z,
        dout if dot else y,
        w,
        out,
        R,
        C,
        local,
        ng,
        DOT=dot,
        GATED=z is not None,
        BR=BR,
        BC=BC,
    )
    return out


# The one-pass kernels (_norm_fwd_rows, _norm_bwd_rows) hold a row's whole local group in registers: up to
# FUSED_MAX_BLOCK channels (padded to a power of two). Wider groups, and groups split across ranks (whose
# statistics `reduce` sums between passes), take the two-pass kernels. Against those, at 16K tokens × 5120
# channels bf16 on an H200 (z a column slice, as the executor passes it): forward 0.48 → 0.24 ms,
# forward + backward 1.18-1.25 → 0.81 ms; groups of 640: 1.25 → 0.66 ms; 64K × 2560: 2.27 → 1.19 ms; the
# plain RMSNorm at 16K × 2560: 0.50 → 0.29 ms. Tile (1024 elements, 16 a thread) from 12 settings
# (benchmarks/results/gated-norm-one-pass-ab-h200.json); the backward's programs (2112, 16 an SM) and its
# row loop's stages (3) from 15 (gated-norm-bwd-programs-h200.json).
FUSED_MAX_BLOCK = 8192
FUSED_TILE = 1024  # elements of a program's (rows × group) tile, at least one row
FUSED_THREAD_ELEMENTS = 16  # a tile's elements per thread: the warps, 4 to 16
FUSED_BWD_PROGRAMS = 2112  # row-block programs of the backward, per local group
FUSED_BWD_STAGES = 3


def _fused_launch(local: int) -> tuple[int, int, int]:
    """(rows per program, padded group width, warps) of the one-pass kernels."""
    block = triton.next_power_of_2(local)
    br = max(1, FUSED_TILE // block)
    warps = min(16, max(4, br * block // (32 * FUSED_THREAD_ELEMENTS)))
    return br, block, warps


def _rows(t, C):
    """t as (rows, C), read where it lies when its rows are evenly spaced with C contiguous (a column
    slice of a wider tensor: launch.token_rows), else a contiguous copy; and its row stride."""
    t3, stride = launch.token_rows(t.unsqueeze(0) if t.dim() == 2 else t.reshape(-1, t.shape[-2], C))
    return t3.as_strided((t3.shape[0] * t3.shape[1], C), (stride, 1)), stride


class GatedRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, z, w, local: int, group: int, eps: float, reduce):
        shape = y.shape
        C = shape[-1]
        fused = reduce is None and triton.next_power_of_2(local) <= FUSED_MAX_BLOCK
        ctx.shape, ctx.local, ctx.group, ctx.eps, ctx.reduce, ctx.fused = shape, local, group, eps, reduce, fused
        if fused:
            (y2, yt), (z2, zt) = _rows(y, C), _rows(z if z is not None else y, C)
            R = y2.shape[0]
            # The output made in its own shape and written through a (R, C) view: a view returned from a
            # custom Function may not be modified in place (the rotary turns normed query/key heads so).
            whole = torch.empty(shape, dtype=y.dtype, device=y.device)
            out = whole.view(R, C)
            br, block, warps = _fused_launch(local)
            _norm_fwd_rows[(triton.cdiv(R, br), C // local)](
                y2,
                z2,
                w,
                out,
                R,
                C,
                yt,
                zt,
                local,
                group,
                eps,
                GATED=z is not None,
                BR=br,
                BLOCK=block,
                num_warps=warps,
            )
            ctx.save_for_backward(y2, z2 if z is not None else None, w)
            return whole
        y2 = y.reshape(-1, C).contiguous()
        z2 = None if z is None else z.reshape(-1, C).contiguous()
        R = y2.shape[0]
        ss = _stats(y2, z2, None, w, local, dot=False)
        if reduce is not None:
            ss = reduce(ss)
        whole = torch.empty(shape, dtype=y.dtype, device=y.device)
        out = whole.view(R, C)
        grid = (triton.cdiv(R, BR), triton.cdiv(C, BC))
        _norm_out[grid](
            y2,
            y2 if z2 is None else z2,
            w,
            ss,
            out,
            R,
            C,
            local,
            C // local,
            group,
            eps,
            GATED=z2 is not None,
            BR=BR,
            BC=BC,
        )
        ctx.save_for_backward(y2, z2, w, ss)
        return whole

    @staticmethod
    def backward(ctx, dout):
        if ctx.fused:
            return _fused_backward(ctx, dout)
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
        _norm_grads[grid](
            y,
            z if gated else y,
            w,
            ss,
            S,
            d,
            dy,
            dz if gated else dy,
            dw,
            R,
            C,
            ctx.local,
            C // ctx.local,
            ctx.group,
            ctx.eps,
            GATED=gated,
            BR=BR,
            BC=BC,
        )
        return (
            dy.view(ctx.shape),
            dz.view(ctx.shape) if gated else None,
            dw.sum(0).to(w.dtype),
            None,
            None,
            None,
            None,
        )


def _fused_backward(ctx, dout):
    y, z, w = ctx.saved_tensors
    R, C = y.shape[0], ctx.shape[-1]
    gated = z is not None
    d, dt = _rows(dout, C)
    dy = torch.empty(R, C, dtype=y.dtype, device=y.device)
    dz = torch.empty(R, C, dtype=z.dtype, device=z.device) if gated else None
    br, block, warps = _fused_launch(ctx.local)
    programs = min(triton.cdiv(R, br), FUSED_BWD_PROGRAMS)
    dw = torch.empty(programs, C, dtype=torch.float32, device=y.device)
    _norm_bwd_rows[(programs, C // ctx.local)](
        y,
        z if gated else y,
        w,
        d,
        dy,
        dz if gated else dy,
        dw,
        R,
        C,
        y.stride(0),
        (z if gated else y).stride(0),
        dt,
        ctx.local,
        ctx.group,
        ctx.eps,
        GATED=gated,
        BR=br,
        BLOCK=block,
        STAGES=FUSED_BWD_STAGES,
        num_warps=warps,
    )
    return (dy.view(ctx.shape), dz.view(ctx.shape) if gated else None, dw.sum(0).to(w.dtype), None, None, None, None)


def rmsnorm_triton(x, weight, eps: float = 1e-5):
    """Plain RMSNorm over the last dimension (one group of all channels, no gate): nothing of the
    row's width in fp32 is kept or made, where the torch ops make several fp32 copies in backward."""
    return GatedRMSNormFn.apply(x, None, weight.contiguous(), x.shape[-1], x.shape[-1], eps, None)


def gated_rmsnorm_triton(y, z, weight, group_size: int, eps: float = 1e-5, local: int | None = None, reduce=None):
    """y, z (..., channels); groups of `group_size` channels, of which this rank holds `local` (all by
    default); `reduce` sums (rows, local groups) fp32 statistics over the ranks sharing a group."""
    return GatedRMSNormFn.apply(y, z, weight.contiguous(), local or group_size, group_size, eps, reduce)

"""Causal depthwise conv1d over (batch, time, channels) with packed-sequence boundaries (Triton).

out[b, t, c] = act(bias[c] + Σ_j w[c, j] · x[b, t − (K−1) + j, c]), where a tap that falls before the
start of the row or in an earlier packed sequence (seq_idx differs) contributes nothing — so a packed
row gives each sequence exactly what it would get alone (PackMamba, Xu et al. 2024). The backward
recomputes the pre-activation, then gathers dx along the same taps and reduces dw, db per block.
Reference: meshplan.kernels.reference.causal_conv1d_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_fwd(x_ptr, w_ptr, b_ptr, idx_ptr, out_ptr, pre_ptr, T, C, K: tl.constexpr, HAS_IDX: tl.constexpr,
              SILU: tl.constexpr, SAVE_PRE: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    pid_b, pid_t, pid_c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = pid_t * BT + tl.arange(0, BT)
    c = pid_c * BC + tl.arange(0, BC)
    tm, cm = t < T, c < C
    base = pid_b * T * C
    acc = tl.zeros((BT, BC), dtype=tl.float32) + tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)[None, :]
    if HAS_IDX:
        me = tl.load(idx_ptr + pid_b * T + t, mask=tm, other=-1)
    for j in tl.static_range(K):
        src = t - (K - 1) + j
        ok = tm & (src >= 0)
        if HAS_IDX:
            ok = ok & (tl.load(idx_ptr + pid_b * T + src, mask=ok, other=-2) == me)
        xv = tl.load(x_ptr + base + src[:, None] * C + c[None, :], mask=ok[:, None] & cm[None, :], other=0.0)
        wv = tl.load(w_ptr + c * K + j, mask=cm, other=0.0)
        acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    mask = tm[:, None] & cm[None, :]
    offs = base + t[:, None] * C + c[None, :]
    if SAVE_PRE:
        tl.store(pre_ptr + offs, acc, mask=mask)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _conv_bwd(x_ptr, w_ptr, idx_ptr, dpre_ptr, dx_ptr, dw_part_ptr, db_part_ptr, T, C, K: tl.constexpr,
              HAS_IDX: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """dx[t] = Σ_j w[c, j] · dpre[t + (K−1) − j] over outputs in the same sequence; per-block partial
    sums of dw[c, j] = Σ_t dpre[t] · x[t − (K−1) + j] and db[c] = Σ_t dpre[t]."""
    pid_b, pid_t, pid_c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_tb = tl.num_programs(1)
    t = pid_t * BT + tl.arange(0, BT)
    c = pid_c * BC + tl.arange(0, BC)
    tm, cm = t < T, c < C
    base = pid_b * T * C
    mask = tm[:, None] & cm[None, :]
    dpre = tl.load(dpre_ptr + base + t[:, None] * C + c[None, :], mask=mask, other=0.0)
    if HAS_IDX:
        me = tl.load(idx_ptr + pid_b * T + t, mask=tm, other=-1)
    dx = tl.zeros((BT, BC), dtype=tl.float32)
    part = (pid_b * n_tb + pid_t) * C * K
    for j in tl.static_range(K):
        dst = t + (K - 1) - j  # the output that read x[t] through tap j
        ok = tm & (dst < T)
        src = t - (K - 1) + j  # the input that output t read through tap j
        ok_src = tm & (src >= 0)
        if HAS_IDX:
            ok = ok & (tl.load(idx_ptr + pid_b * T + dst, mask=ok, other=-2) == me)
            ok_src = ok_src & (tl.load(idx_ptr + pid_b * T + src, mask=ok_src, other=-2) == me)
        g = tl.load(dpre_ptr + base + dst[:, None] * C + c[None, :], mask=ok[:, None] & cm[None, :], other=0.0)
        wv = tl.load(w_ptr + c * K + j, mask=cm, other=0.0).to(tl.float32)
        dx += g * wv[None, :]
        xv = tl.load(x_ptr + base + src[:, None] * C + c[None, :], mask=ok_src[:, None] & cm[None, :], other=0.0)
        tl.store(dw_part_ptr + part + c * K + j, tl.sum(dpre * xv.to(tl.float32), axis=0), mask=cm)
    tl.store(dx_ptr + base + t[:, None] * C + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(db_part_ptr + (pid_b * n_tb + pid_t) * C + c, tl.sum(dpre, axis=0), mask=cm)


def _launch_shape(x: torch.Tensor, bt: int, bc: int):
    b, t, c = x.shape
    return (b, triton.cdiv(t, bt), triton.cdiv(c, bc))


# Tile: 32 time steps × 128 channels ran fastest of 7 shapes on an H200 (55% of the copy roofline,
# against 41% for 64 × 32): benchmarks/results/conv1d-h200.json, `python benchmarks/bench_conv1d.py --tiles`.
TILE_T, TILE_C = 32, 128


def causal_conv1d_fwd(x, weight, bias, seq_idx=None, silu=True, save_pre=False, bt=TILE_T, bc=TILE_C):
    x = x.contiguous()
    b, t, c = x.shape
    out = torch.empty_like(x)
    pre = torch.empty(b, t, c, dtype=torch.float32, device=x.device) if save_pre else out
    idx = seq_idx.to(torch.int32).contiguous() if seq_idx is not None else x
    bias = bias if bias is not None else torch.zeros(c, dtype=weight.dtype, device=x.device)
    _conv_fwd[_launch_shape(x, bt, bc)](x, weight.contiguous(), bias.contiguous(), idx, out, pre, t, c,
                                        K=weight.shape[1], HAS_IDX=seq_idx is not None, SILU=silu,
                                        SAVE_PRE=save_pre, BT=bt, BC=bc)
    return out, (pre if save_pre else None)


class CausalConv1dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, silu):
        out, _ = causal_conv1d_fwd(x, weight, bias, seq_idx, silu)
        ctx.save_for_backward(x, weight, bias, seq_idx)
        ctx.silu = silu
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bias, seq_idx = ctx.saved_tensors
        bt, bc = TILE_T, TILE_C
        # Recompute the pre-activation (fp32), turn the output gradient into its gradient.
        _, pre = causal_conv1d_fwd(x, weight, bias, seq_idx, silu=False, save_pre=True, bt=bt, bc=bc)
        g = grad_out.float()
        if ctx.silu:
            sig = torch.sigmoid(pre)
            g = g * sig * (1 + pre * (1 - sig))
        b, t, c = x.shape
        grid = _launch_shape(x, bt, bc)
        dx = torch.empty_like(x)
        dw_part = torch.empty(b * grid[1], c, weight.shape[1], dtype=torch.float32, device=x.device)
        db_part = torch.empty(b * grid[1], c, dtype=torch.float32, device=x.device)
        idx = seq_idx.to(torch.int32).contiguous() if seq_idx is not None else x
        _conv_bwd[grid](x, weight.contiguous(), idx, g.contiguous(), dx, dw_part, db_part, t, c, K=weight.shape[1],
                        HAS_IDX=seq_idx is not None, BT=bt, BC=bc)
        dw = dw_part.sum(0).to(weight.dtype)
        db = db_part.sum(0).to(bias.dtype) if bias is not None else None
        return dx, dw, db, None, None


def causal_conv1d(x, weight, bias=None, seq_idx=None, activation: str | None = "silu"):
    """x (b, t, c), weight (c, K), bias (c,), seq_idx (b, t) int: the packed-aware causal conv."""
    return CausalConv1dFn.apply(x, weight, bias, seq_idx, activation == "silu")

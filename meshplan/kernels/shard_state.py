"""A sequence shard's correction for the SSM state entering it (Triton), forward and backward.

A Mamba-2 sequence shard scans from a zero state and then adds what the state E entering it
contributes (meshplan/executor/layouts/mamba.py): the scan is linear in its initial state, so

    y_t = y0_t + exp(cum_t) · C_t · E_h        per head h, with cum_t = Σ_{k ≤ t} dt_k · A_h

over the shard's tokens. Backward, with g_t = exp(cum_t) · dy_t:

    dy0 = dy,   dC_t = Σ_h g_t · E_h,   dE_h = Σ_t g_tᵀ C_t,   dcum_t = exp(cum_t) Σ_p dy_t · (C_t · E_h).

As torch ops this took a GEMM output of the shard's width (C · E), a broadcast multiply-add over it, and
in backward a reduction over the head dimension and three more passes; at 256K tokens a rank those
ops grew faster than the tokens (a strided elementwise kernel 7.97 → 48.6 ms and a bf16 reduction
2.48 → 19.9 ms from 64K to 256K tokens a rank, mamba2-2.7b/2L on 2 H200s:
benchmarks/results/sp-long-profile-512k-h200x2.json). Here the forward reads y0 and writes y once;
the backward reads dy twice (once for dC and dcum, a token block and a B/C group's heads a program,
once for dE, a head and a span of tokens a program, whose fp32 partial sums torch adds).
Reference: the torch ops in meshplan.executor.layouts.mamba (entering_correction_ref).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from meshplan.kernels import launch

# Tokens a program takes at once (the C · Eᵀ product's rows), heads a step takes together (their (P, N)
# states are adjacent rows of E, their y and dy columns too) and warps: of 6 settings on an H200 at a
# shard of 256K tokens × 80 heads of 64 (d_state 128), 64 tokens, 2 heads and 4 warps ran the three
# kernels in 2.05 / 1.96 / 1.29 ms, against 2.55 / 4.82 / 2.20 ms one head a step with E read in fp32
# and 1.98 / 3.15 / 2.11 ms with 8 warps (benchmarks/results/entering-settings-ab-h200.json).
TOKEN_BLOCK, HEADS_A_STEP, WARPS = 64, 2, 4
# Programs to aim for in the dE kernel, which splits each head's tokens into spans: a few per SM of an H200.
DE_PROGRAMS = 528


@triton.jit
def _tokens(pid, S, L: tl.constexpr):
    """(batch row, token indices, their mask) of token block `pid` of a batch of rows of S tokens."""
    blocks = tl.cdiv(S, L)
    bi = (pid // blocks).to(tl.int64)  # tokens × heads × headdim passes 2^31 at long context
    t = (pid % blocks) * L + tl.arange(0, L)
    return bi, t, t < S


@triton.jit
def _load_c(c_ptr, rows, tm, g, n, N, CT):
    """Group g's C at the given token rows (C's tokens CT apart), d_state columns n: (L, BN)."""
    return tl.load(c_ptr + rows[:, None] * CT + g * N + n[None, :], mask=tm[:, None] & (n < N)[None, :], other=0.0)


@triton.jit
def _heads(h0, h_end, P, HB: tl.constexpr, BP: tl.constexpr):
    """The columns of HB heads side by side from head h0 (none past h_end): each column's head, headdim
    index and mask."""
    j = tl.arange(0, HB * BP)
    hh = h0 + j // BP
    p = j % BP
    return hh, p, (p < P) & (hh < h_end)


@triton.jit
def _decay(cum_ptr, bi, h0, k, hpg, t, tm, S, H, HB: tl.constexpr, BP: tl.constexpr):
    """exp(cum) of HB heads from h0 (k of the group's hpg heads before them) at tokens t, one value a
    token and head read, spread over each head's BP columns: (L, HB·BP)."""
    hb = tl.arange(0, HB)
    cum = tl.load(
        cum_ptr + (bi * H + h0 + hb[None, :]) * S + t[:, None], mask=tm[:, None] & (k + hb < hpg)[None, :], other=0.0
    )
    return tl.reshape(tl.broadcast_to(tl.exp(cum)[:, :, None], (t.shape[0], HB, BP)), (t.shape[0], HB * BP))


@triton.jit
def _entering_fwd(
    y0_ptr,
    c_ptr,
    cum_ptr,
    e_ptr,
    y_ptr,
    S,
    H,
    G,
    P,
    N,
    CT,
    L: tl.constexpr,
    HB: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
):
    """Grid (batch · token blocks, groups): y = y0 + exp(cum) · C · E_h for each head h of the group, HB
    heads a step, C's block loaded once for them all."""
    bi, t, tm = _tokens(tl.program_id(0), S, L)
    g, n = tl.program_id(1), tl.arange(0, BN)
    nm, rows = n < N, bi * S + t
    cv = _load_c(c_ptr, rows, tm, g, n, N, CT)
    hpg = H // G
    for k in tl.range(0, hpg, HB, num_stages=2):
        h0 = g * hpg + k
        hh, p, cm = _heads(h0, (g + 1) * hpg, P, HB, BP)
        # E's rows of these heads, transposed (BN × HB·BP), in C's dtype: bf16 products, fp32 sums.
        e = tl.load(
            e_ptr + ((bi * H + hh[None, :]) * P + p[None, :]) * N + n[:, None],
            mask=nm[:, None] & cm[None, :],
            other=0.0,
        )
        ce = tl.dot(cv, e)  # (L, HB·BP)
        mask = tm[:, None] & cm[None, :]
        ex = _decay(cum_ptr, bi, h0, k, hpg, t, tm, S, H, HB, BP)
        offs = (rows[:, None] * H + hh[None, :]) * P + p[None, :]
        y = tl.load(y0_ptr + offs, mask=mask, other=0.0).to(tl.float32) + ce * ex
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _entering_bwd_dc(
    dy_ptr,
    c_ptr,
    cum_ptr,
    e_ptr,
    dc_ptr,
    dcum_ptr,
    S,
    H,
    G,
    P,
    N,
    CT,
    L: tl.constexpr,
    HB: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
):
    """Grid (batch · token blocks, groups): dC over the group's heads and dcum of each, HB heads a step."""
    bi, t, tm = _tokens(tl.program_id(0), S, L)
    g, n = tl.program_id(1), tl.arange(0, BN)
    nm, rows = n < N, bi * S + t
    cv = _load_c(c_ptr, rows, tm, g, n, N, CT)
    dc = tl.zeros((L, BN), dtype=tl.float32)
    hpg = H // G
    for k in tl.range(0, hpg, HB, num_stages=2):
        h0 = g * hpg + k
        hh, p, cm = _heads(h0, (g + 1) * hpg, P, HB, BP)
        e = tl.load(
            e_ptr + ((bi * H + hh[:, None]) * P + p[:, None]) * N + n[None, :],
            mask=cm[:, None] & nm[None, :],
            other=0.0,
        )  # (HB·BP, BN)
        ce = tl.dot(cv, tl.trans(e))  # (L, HB·BP)
        mask = tm[:, None] & cm[None, :]
        ex = _decay(cum_ptr, bi, h0, k, hpg, t, tm, S, H, HB, BP)
        dy = tl.load(dy_ptr + (rows[:, None] * H + hh[None, :]) * P + p[None, :], mask=mask, other=0.0).to(tl.float32)
        g_t = dy * ex
        # dcum: Σ over each head's headdim columns, (L, HB, BP) summed on its last axis.
        dcum = tl.sum(tl.reshape(g_t * ce, (L, HB, BP)), axis=2)
        hb = tl.arange(0, HB)
        tl.store(
            dcum_ptr + (bi * H + h0 + hb[None, :]) * S + t[:, None], dcum, mask=tm[:, None] & (k + hb < hpg)[None, :]
        )
        dc += tl.dot(g_t.to(cv.dtype), e)
    tl.store(
        dc_ptr + (rows[:, None] * G + g) * N + n[None, :],
        dc.to(dc_ptr.dtype.element_ty),
        mask=tm[:, None] & nm[None, :],
    )


@triton.jit
def _entering_bwd_de(
    dy_ptr,
    c_ptr,
    cum_ptr,
    part_ptr,
    S,
    H,
    G,
    P,
    N,
    CT,
    SPAN,
    L: tl.constexpr,
    HB: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
):
    """Grid (batch · head steps, spans): Σ over the span's tokens of exp(cum) · dyᵀ C for HB heads of a
    group, fp32, into part[span, batch, head] (P × N)."""
    pid, span = tl.program_id(0), tl.program_id(1)
    hpg = H // G
    steps = tl.cdiv(hpg, HB)  # head steps a group
    bi = (pid // (G * steps)).to(tl.int64)
    g = (pid // steps) % G
    h0 = g * hpg + (pid % steps) * HB
    hh, p, cm = _heads(h0, (g + 1) * hpg, P, HB, BP)
    n = tl.arange(0, BN)
    nm = n < N
    acc = tl.zeros((HB * BP, BN), dtype=tl.float32)
    for t0 in range(span * SPAN, tl.minimum(span * SPAN + SPAN, S), L):
        t = t0 + tl.arange(0, L)
        tm = t < S
        rows = bi * S + t
        cv = _load_c(c_ptr, rows, tm, g, n, N, CT)
        mask = tm[:, None] & cm[None, :]
        ex = _decay(cum_ptr, bi, h0, h0 - g * hpg, hpg, t, tm, S, H, HB, BP)
        dy = tl.load(dy_ptr + (rows[:, None] * H + hh[None, :]) * P + p[None, :], mask=mask, other=0.0)
        acc += tl.dot(tl.trans((dy.to(tl.float32) * ex).to(cv.dtype)), cv)
    nb = tl.num_programs(0) // (G * steps)
    tl.store(
        part_ptr + (((span * nb + bi) * H + hh[:, None]) * P + p[:, None]) * N + n[None, :],
        acc,
        mask=cm[:, None] & nm[None, :],
    )


def _blocks(p: int, n: int) -> tuple[int, int]:
    return max(16, triton.next_power_of_2(p)), max(16, triton.next_power_of_2(n))


def _operands(C, cum, E):
    """C as the kernels read it (token stride), cum fp32 and E in C's dtype, contiguous."""
    C, ct = launch.token_rows(C)
    return C, ct, cum.float().contiguous(), E.to(C.dtype).contiguous()


def add_entering(y0: torch.Tensor, C: torch.Tensor, cum: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """y0 (b, s, h, p) + exp(cum) · C (b, s, g, n) · E (b, h, p, n), per head, in y0's dtype; cum (b, h, s)
    fp32, each head's tokens contiguous (as torch's cumsum over the innermost dimension leaves them)."""
    b, s, h, p = y0.shape
    g, n = C.shape[2], C.shape[3]
    C, ct, cum, E = _operands(C, cum, E)
    y0 = y0.contiguous()
    y = torch.empty_like(y0)
    bp, bn = _blocks(p, n)
    _entering_fwd[(b * triton.cdiv(s, TOKEN_BLOCK), g)](
        y0, C, cum, E, y, s, h, g, p, n, ct, L=TOKEN_BLOCK, HB=HEADS_A_STEP, BP=bp, BN=bn, num_warps=WARPS
    )
    return y


def entering_backward(dy: torch.Tensor, C: torch.Tensor, cum: torch.Tensor, E: torch.Tensor):
    """(dC in C's dtype, dcum (b, h, s) fp32, dE fp32) of add_entering from y's gradient dy."""
    b, s, h, p = dy.shape
    g, n = C.shape[2], C.shape[3]
    C, ct, cum, E = _operands(C, cum, E)
    dy = dy.contiguous()
    bp, bn = _blocks(p, n)
    hb = HEADS_A_STEP
    dc = torch.empty(b, s, g, n, device=dy.device, dtype=C.dtype)
    dcum = torch.empty(b, h, s, device=dy.device, dtype=torch.float32)
    _entering_bwd_dc[(b * triton.cdiv(s, TOKEN_BLOCK), g)](
        dy, C, cum, E, dc, dcum, s, h, g, p, n, ct, L=TOKEN_BLOCK, HB=hb, BP=bp, BN=bn, num_warps=WARPS
    )
    blocks = triton.cdiv(s, TOKEN_BLOCK)
    head_programs = b * g * triton.cdiv(h // g, hb)
    spans = max(1, min(blocks, DE_PROGRAMS // head_programs))
    span = triton.cdiv(blocks, spans) * TOKEN_BLOCK
    spans = triton.cdiv(s, span)
    part = torch.empty(spans, b, h, p, n, device=dy.device, dtype=torch.float32)
    _entering_bwd_de[(head_programs, spans)](
        dy, C, cum, part, s, h, g, p, n, ct, span, L=TOKEN_BLOCK, HB=hb, BP=bp, BN=bn, num_warps=WARPS
    )
    return dc, dcum, part.sum(0)


class EnteringStateFn(torch.autograd.Function):
    """add_entering, differentiable in y0, C, cum (b, h, s) and E (the backward's kernels recompute C · E)."""

    @staticmethod
    def forward(ctx, y0, C, cum, E):
        ctx.save_for_backward(C, cum, E)
        return add_entering(y0, C, cum, E)

    @staticmethod
    def backward(ctx, dy):
        C, cum, E = ctx.saved_tensors
        dc, dcum, de = entering_backward(dy, C, cum, E)
        return dy, dc, dcum.to(cum.dtype), de.to(E.dtype)

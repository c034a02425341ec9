"""Causal depthwise conv1d over (batch, time, channels) with packed-sequence boundaries (Triton).

out[b, t, c] = act(bias[c] + Σ_j w[c, j] · x[b, t − (K−1) + j, c]), where a tap that falls before the
start of the row or in an earlier packed sequence (seq_idx differs) contributes nothing — so a packed
row gives each sequence exactly what it would get alone (PackMamba, Xu et al. 2024).

Two families of kernels: time-marching ones for K ≤ 4 (a program walks its rows four at a time with
the window in registers, so every input is read once; the backward in one pass: pre-activation
rebuilt, dx gathered, dw and db summed per channel), and tiled ones for K > 4 (a block of time steps
× channels per program, the K taps read as shifted loads; the backward optionally two-pass, with an
fp32 pre-activation gradient). A sequence shard that continues an earlier one (initial_state: the
earlier shard's last K − 1 inputs; with seq_idx, each of them with its document's id) runs the main
kernels from a zero history, and head kernels redo its first three output rows and their gradients.
Reference: meshplan.kernels.reference.causal_conv1d_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from meshplan.kernels import launch


@triton.jit
def _tile_ids(T, ROWS):
    """(batch as int64, time block, channel block, time blocks) of a program on the grid
    (batch · time blocks, channel blocks), ROWS time steps a block. Batch and time share the first
    axis, which has room for 2^31 programs (the second stops at 65,535: 2M tokens at 32 a block);
    the batch varies fastest, then time, then channels. Time fastest made the tiled forward 5%
    slower at batch 4 (0.676 against 0.645 ms), and channels fastest 2-3% slower (so that the
    programs resident at one time read whole rows) on an H200
    (benchmarks/results/conv1d-rows4-ab2-h200.json, ssd-grid-order-h200.json "conv")."""
    n_t = tl.cdiv(T, ROWS)
    n_b = tl.num_programs(0) // n_t
    pid = tl.program_id(0)
    return (pid % n_b).to(tl.int64), pid // n_b, tl.program_id(1), n_t


@triton.jit
def _pre_activation(x_ptr, w_ptr, b_ptr, idx_ptr, pid_b, pos, c, cm, T, C, K: tl.constexpr, HAS_IDX: tl.constexpr):
    """bias[c] + Σ_j w[c, j] · x[pos − (K−1) + j, c] over the taps in pos's own sequence, fp32 (BT, BC)."""
    base = pid_b * T * C
    pm = (pos >= 0) & (pos < T)
    acc = (
        tl.zeros((pos.shape[0], c.shape[0]), dtype=tl.float32)
        + tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)[None, :]
    )
    if HAS_IDX:
        me = tl.load(idx_ptr + pid_b * T + pos, mask=pm, other=-1)
    for j in tl.static_range(K):
        src = pos - (K - 1) + j
        ok = pm & (src >= 0)
        if HAS_IDX:
            ok = ok & (tl.load(idx_ptr + pid_b * T + src, mask=ok, other=-2) == me)
        xv = tl.load(x_ptr + base + src[:, None] * C + c[None, :], mask=ok[:, None] & cm[None, :], other=0.0)
        wv = tl.load(w_ptr + c * K + j, mask=cm, other=0.0)
        acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    return acc


@triton.jit
def _conv_fwd(
    x_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    out_ptr,
    T,
    C,
    K: tl.constexpr,
    HAS_IDX: tl.constexpr,
    SILU: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    pid_b, pid_t, pid_c, _ = _tile_ids(T, BT)  # pid_b int64: offsets pass 2^31
    t = (pid_t * BT + tl.arange(0, BT)).to(tl.int64)  # t · channels passes 2^31 at long context
    c = pid_c * BC + tl.arange(0, BC)
    cm = c < C
    acc = _pre_activation(x_ptr, w_ptr, b_ptr, idx_ptr, pid_b, t, c, cm, T, C, K, HAS_IDX)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(
        out_ptr + pid_b * T * C + t[:, None] * C + c[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=(t < T)[:, None] & cm[None, :],
    )


@triton.jit
def _conv_dpre(
    x_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    dout_ptr,
    dpre_ptr,
    T,
    C,
    K: tl.constexpr,
    HAS_IDX: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    """dpre = dout · silu'(pre), fp32, the pre-activation rebuilt from x (the two-pass backward)."""
    pid_b, pid_t, pid_c, _ = _tile_ids(T, BT)  # pid_b int64: offsets pass 2^31
    t = (pid_t * BT + tl.arange(0, BT)).to(tl.int64)  # t · channels passes 2^31 at long context
    c = pid_c * BC + tl.arange(0, BC)
    cm = c < C
    mask = (t < T)[:, None] & cm[None, :]
    offs = pid_b * T * C + t[:, None] * C + c[None, :]
    pre = _pre_activation(x_ptr, w_ptr, b_ptr, idx_ptr, pid_b, t, c, cm, T, C, K, HAS_IDX)
    sig = tl.sigmoid(pre)
    g = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32) * sig * (1 + pre * (1 - sig))
    tl.store(dpre_ptr + offs, g, mask=mask)


@triton.jit
def _conv_bwd(
    x_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    dout_ptr,
    dx_ptr,
    dw_part_ptr,
    db_part_ptr,
    T,
    C,
    K: tl.constexpr,
    HAS_IDX: tl.constexpr,
    SILU: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    STEPS: tl.constexpr,
    KP: tl.constexpr,
):
    """STEPS blocks of BT time steps: the pre-activation gradient dpre = dout · silu'(pre) — with SILU
    rebuilt from x at the K positions each input feeds; without, dout_ptr already holds it (or there
    is no activation) —; then dx[t] = Σ_j w[c, j] · dpre[t + (K−1) − j] over outputs in the same
    sequence, and this program's partial sums of dw[c, j] = Σ_t dpre[t] · x[t − (K−1) + j] and
    db[c] = Σ_t dpre[t]. For K ≤ 4 the products are summed elementwise over the steps and reduced
    across the tile's rows once at the end (a cross-warp reduction per tap and step cost more than the
    loads); larger K reduce every step."""
    pid_b, pid_t, pid_c, n_t = _tile_ids(T, BT * STEPS)  # pid_b int64: offsets pass 2^31
    c = pid_c * BC + tl.arange(0, BC)
    cm = c < C
    base = pid_b * T * C
    taps = tl.arange(0, KP)  # K rounded up to a power of two
    wacc = tl.zeros((BC, KP), dtype=tl.float32)  # dw partial sums (K > 4), kept in registers across the steps
    a0 = tl.zeros((BT, BC), dtype=tl.float32)  # K ≤ 4: elementwise dw partial sums of taps 0..3, and of db
    a1 = tl.zeros((BT, BC), dtype=tl.float32)
    a2 = tl.zeros((BT, BC), dtype=tl.float32)
    a3 = tl.zeros((BT, BC), dtype=tl.float32)
    dsum = tl.zeros((BT, BC), dtype=tl.float32)
    part = (pid_b * n_t + pid_t) * C * K
    for step in range(STEPS):
        t = ((pid_t * STEPS + step) * BT + tl.arange(0, BT)).to(tl.int64)
        tm = t < T
        if HAS_IDX:
            me = tl.load(idx_ptr + pid_b * T + t, mask=tm, other=-1)
        dx = tl.zeros((BT, BC), dtype=tl.float32)
        for j in tl.static_range(K):
            dst = t + (K - 1) - j  # the output that read x[t] through tap j
            ok = tm & (dst < T)
            if HAS_IDX:
                ok = ok & (tl.load(idx_ptr + pid_b * T + dst, mask=ok, other=-2) == me)
            g = tl.load(dout_ptr + base + dst[:, None] * C + c[None, :], mask=ok[:, None] & cm[None, :], other=0.0).to(
                tl.float32
            )
            if SILU:
                pre = _pre_activation(x_ptr, w_ptr, b_ptr, idx_ptr, pid_b, dst, c, cm, T, C, K, HAS_IDX)
                sig = tl.sigmoid(pre)
                g = g * sig * (1 + pre * (1 - sig))
            dx += g * tl.load(w_ptr + c * K + j, mask=cm, other=0.0).to(tl.float32)[None, :]
            if j == K - 1:  # dst = t: this block's own pre-activation gradient
                dpre = g
        tl.store(
            dx_ptr + base + t[:, None] * C + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=tm[:, None] & cm[None, :]
        )
        dsum += dpre
        for j in tl.static_range(K):
            src = t - (K - 1) + j  # the input that output t read through tap j
            ok_src = tm & (src >= 0)
            if HAS_IDX:
                ok_src = ok_src & (tl.load(idx_ptr + pid_b * T + src, mask=ok_src, other=-2) == me)
            xv = tl.load(x_ptr + base + src[:, None] * C + c[None, :], mask=ok_src[:, None] & cm[None, :], other=0.0)
            prod = dpre * xv.to(tl.float32)
            if K > 4:
                wacc += tl.where(taps[None, :] == j, tl.sum(prod, axis=0)[:, None], 0.0)
            elif j == 0:
                a0 += prod
            elif j == 1:
                a1 += prod
            elif j == 2:
                a2 += prod
            else:
                a3 += prod
    if K <= 4:
        wacc = tl.where(taps[None, :] == 0, tl.sum(a0, axis=0)[:, None], 0.0)
        if K > 1:
            wacc += tl.where(taps[None, :] == 1, tl.sum(a1, axis=0)[:, None], 0.0)
        if K > 2:
            wacc += tl.where(taps[None, :] == 2, tl.sum(a2, axis=0)[:, None], 0.0)
        if K > 3:
            wacc += tl.where(taps[None, :] == 3, tl.sum(a3, axis=0)[:, None], 0.0)
    tl.store(dw_part_ptr + part + c[:, None] * K + taps[None, :], wacc, mask=cm[:, None] & (taps[None, :] < K))
    tl.store(db_part_ptr + (pid_b * n_t + pid_t) * C + c, tl.sum(dsum, axis=0), mask=cm)


@triton.jit
def _tap(w_ptr, c, cm, j: tl.constexpr, K: tl.constexpr):
    """Tap j of four, right-aligned (zero where j < 4 − K), fp32, from the (C, K) weight: reading the
    weight as it is saves the small copy to four taps each call would launch."""
    if j < 4 - K:
        return tl.zeros((c.shape[0],), dtype=tl.float32)
    return tl.load(w_ptr + c * K + (j - (4 - K)), mask=cm, other=0.0).to(tl.float32)


@triton.jit
def _march_program(w_ptr, b_ptr, T, C, L, K: tl.constexpr, BC: tl.constexpr):
    """A time-marching program's batch (int64), time block, channels and their mask, the slab's base
    offset, the four right-aligned taps, the bias (fp32) and the number of time blocks."""
    pid_b, pid_t, pid_c, n_t = _tile_ids(T, L)
    c = pid_c * BC + tl.arange(0, BC)
    cm = c < C
    w0, w1 = _tap(w_ptr, c, cm, 0, K), _tap(w_ptr, c, cm, 1, K)
    w2, w3 = _tap(w_ptr, c, cm, 2, K), _tap(w_ptr, c, cm, 3, K)
    bias = tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)
    return pid_b, pid_t, c, cm, pid_b * T * C, w0, w1, w2, w3, bias, n_t


@triton.jit
def _row_offsets(base, t, C, c):
    """(offsets, t as an int64 vector) of row t's BC channels c in a (T, C) slab at `base`. The row's
    offset as one int64 scalar, with only the channel offsets vectors, made the forward 4-8% slower
    on an H200 (benchmarks/results/conv1d-rows4-ab3-h200.json)."""
    tv = (tl.zeros_like(c) + t).to(tl.int64)
    return base + tv * C + c, tv


@triton.jit
def _row(ptr, base, t, C, c, cm, T):
    """Row t (fp32, zeros outside 0 ≤ t < T) of a (T, C) slab at `base`: the BC channels c."""
    offs, tv = _row_offsets(base, t, C, c)
    return tl.load(ptr + offs, mask=cm & (tv >= 0) & (tv < T), other=0.0).to(tl.float32)


@triton.jit
def _store_row(ptr, v, base, t, C, c, cm, lo, hi):
    """Row t of a (T, C) slab at `base` (the BC channels c), where lo ≤ t < hi."""
    offs, tv = _row_offsets(base, t, C, c)
    tl.store(ptr + offs, v.to(ptr.dtype.element_ty), mask=cm & (tv >= lo) & (tv < hi))


@triton.jit
def _seq_id(idx_ptr, pid_b, t, T, HAS_IDX: tl.constexpr, outside):
    """Sequence id of row t, shape (1,) (`outside` where there is no row t; 0 without seq_idx)."""
    tv = tl.zeros((1,), dtype=tl.int32) + t
    if HAS_IDX:
        return tl.load(idx_ptr + pid_b * T + tv, mask=(tv >= 0) & (tv < T), other=outside)
    return tl.where((tv >= 0) & (tv < T), 0, outside)


@triton.jit
def _sigmoid(x):
    """1 / (1 + e^−x) as rsqrt((1 + e^−x)²), e^−x by exp2: tl.sigmoid's exp keeps the denormal range
    and its division the full range, 6 more instructions per element on sm_90 (a SiLU kernel of 4
    elements a thread: 80 against 56 instructions; `python benchmarks/sass_counts.py`,
    benchmarks/results/sass-counts.json). (1 + e^−x)² overflows below x ≈ −44, where the result is 0
    instead of < 1e-19."""
    e = tl.exp2(x * -1.4426950408889634)  # log2(e)
    return tl.math.rsqrt((1 + e) * (1 + e))


@triton.jit
def _fwd_out(x0, x1, x2, x3, i0, i1, i2, i3, w0, w1, w2, w3, bias, SILU: tl.constexpr, MASKED: tl.constexpr = True):
    """One output row from its input x0 and the three before it (sequence ids i0..i3), fp32; without
    MASKED the caller knows the four rows are one sequence."""
    if MASKED:
        acc = (
            bias
            + w3 * x0
            + w2 * tl.where(i1 == i0, x1, 0.0)
            + w1 * tl.where(i2 == i0, x2, 0.0)
            + w0 * tl.where(i3 == i0, x3, 0.0)
        )
    else:
        acc = bias + w3 * x0 + w2 * x1 + w1 * x2 + w0 * x3
    if SILU:
        acc = acc * _sigmoid(acc)
    return acc


@triton.jit
def _one_sequence(i0, i1, i2, i3, i4, i5, i6):
    """Whether seven rows' sequence ids (shape (1,) each) are all equal: a scalar."""
    same = (i0 == i1) & (i1 == i2) & (i2 == i3) & (i3 == i4) & (i4 == i5) & (i5 == i6)
    return tl.min(same.to(tl.int32), axis=0) == 1


@triton.jit
def _fwd_rows(
    xa,
    xb,
    xc,
    xd,
    x1,
    x2,
    x3,
    ia,
    ib,
    ic,
    id_,
    i1,
    i2,
    i3,
    w0,
    w1,
    w2,
    w3,
    bias,
    SILU: tl.constexpr,
    MASKED: tl.constexpr,
):
    """A forward step's four output rows t..t+3 from inputs t−3..t+3 (xa..xd are rows t..t+3, x1..x3
    rows t−1..t−3)."""
    return (
        _fwd_out(xa, x1, x2, x3, ia, i1, i2, i3, w0, w1, w2, w3, bias, SILU, MASKED),
        _fwd_out(xb, xa, x1, x2, ib, ia, i1, i2, w0, w1, w2, w3, bias, SILU, MASKED),
        _fwd_out(xc, xb, xa, x1, ic, ib, ia, i1, w0, w1, w2, w3, bias, SILU, MASKED),
        _fwd_out(xd, xc, xb, xa, id_, ic, ib, ia, w0, w1, w2, w3, bias, SILU, MASKED),
    )


@triton.jit
def _load_row(ptrs, cm, EVEN_C: tl.constexpr):
    """A row of BC channels at `ptrs` (fp32), masked to the channels that exist unless all do."""
    if EVEN_C:
        return tl.load(ptrs).to(tl.float32)
    return tl.load(ptrs, mask=cm, other=0.0).to(tl.float32)


@triton.jit
def _store_rows(ptrs, ya, yb, yc, yd, C, cm, EVEN_C: tl.constexpr):
    """Four consecutive rows of BC channels from `ptrs` on, masked to the channels that exist unless
    all do."""
    ty = ptrs.dtype.element_ty
    if EVEN_C:
        tl.store(ptrs, ya.to(ty))
        tl.store(ptrs + C, yb.to(ty))
        tl.store(ptrs + 2 * C, yc.to(ty))
        tl.store(ptrs + 3 * C, yd.to(ty))
    else:
        tl.store(ptrs, ya.to(ty), mask=cm)
        tl.store(ptrs + C, yb.to(ty), mask=cm)
        tl.store(ptrs + 2 * C, yc.to(ty), mask=cm)
        tl.store(ptrs + 3 * C, yd.to(ty), mask=cm)


@triton.jit
def _one_sequence_span(idx_ptr, pid_b, T, lo, n, SPAN: tl.constexpr):
    """Whether rows lo .. lo + n − 1 (those inside the row's 0..T−1) are all one sequence: a scalar,
    from one vector load of their ids (SPAN ≥ n, a power of two)."""
    r = lo + tl.arange(0, SPAN)
    ok = (r >= 0) & (r < T) & (r < lo + n)
    ids = tl.load(idx_ptr + pid_b * T + r, mask=ok, other=0)
    return tl.min(tl.where(ok, ids, 2147483647), axis=0) == tl.max(tl.where(ok, ids, -2147483647), axis=0)


@triton.jit
def _conv_fwd_march(
    x_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    out_ptr,
    T,
    C,
    L,
    XT,
    K: tl.constexpr,
    HAS_IDX: tl.constexpr,
    SILU: tl.constexpr,
    BC: tl.constexpr,
    STAGES: tl.constexpr,
    EVEN_C: tl.constexpr,
    SPAN: tl.constexpr,
):
    """Time-marching forward (see _fwd_march_body). With seq_idx, a program whose rows and the three
    before them are one sequence (most programs) runs the body that reads no ids."""
    pid_b, pid_t, c, cm, base, w0, w1, w2, w3, bias, _ = _march_program(w_ptr, b_ptr, T, C, L, K, BC)
    xbase = pid_b * T * XT  # x's rows lie XT apart (a column slice of a wider tensor), the output's C
    if HAS_IDX:
        if _one_sequence_span(idx_ptr, pid_b, T, pid_t * L - 3, L + 3, SPAN):
            _fwd_march_body(
                x_ptr,
                idx_ptr,
                out_ptr,
                T,
                C,
                L,
                pid_b,
                pid_t,
                c,
                cm,
                base,
                w0,
                w1,
                w2,
                w3,
                bias,
                XT,
                xbase,
                False,
                SILU,
                STAGES,
                EVEN_C,
            )
        else:
            _fwd_march_body(
                x_ptr,
                idx_ptr,
                out_ptr,
                T,
                C,
                L,
                pid_b,
                pid_t,
                c,
                cm,
                base,
                w0,
                w1,
                w2,
                w3,
                bias,
                XT,
                xbase,
                True,
                SILU,
                STAGES,
                EVEN_C,
            )
    else:
        _fwd_march_body(
            x_ptr,
            idx_ptr,
            out_ptr,
            T,
            C,
            L,
            pid_b,
            pid_t,
            c,
            cm,
            base,
            w0,
            w1,
            w2,
            w3,
            bias,
            XT,
            xbase,
            False,
            SILU,
            STAGES,
            EVEN_C,
        )


@triton.jit
def _fwd_march_body(
    x_ptr,
    idx_ptr,
    out_ptr,
    T,
    C,
    L,
    pid_b,
    pid_t,
    c,
    cm,
    base,
    w0,
    w1,
    w2,
    w3,
    bias,
    XT,
    xbase,
    HAS_IDX: tl.constexpr,
    SILU: tl.constexpr,
    STAGES: tl.constexpr,
    EVEN_C: tl.constexpr,
):
    """Time-marching forward: one program walks L rows of BC channels four rows a step, keeping the
    last three inputs (and their sequence ids) in registers, so each input is read once and each
    output written once. A step's four input rows are loaded before any of its outputs is stored: a
    load after a store waits for it (the compiler cannot tell the buffers apart), and four loads a
    thread in flight, not one, is what the step gains. K ≤ 4 taps, right-aligned (zeros in front when
    K < 4).

    The whole steps inside the program's rows run without time masks, on pointers moved four rows a
    step, and without sequence masks where no boundary is within reach of the step (the common
    case); a last partial step (L or T not a multiple of 4) is masked."""
    t0 = pid_t * L
    end = tl.minimum(t0 + L, T)
    x3, x2, x1 = (
        _row(x_ptr, xbase, t0 - 3, XT, c, cm, T),
        _row(x_ptr, xbase, t0 - 2, XT, c, cm, T),
        _row(x_ptr, xbase, t0 - 1, XT, c, cm, T),
    )
    i3, i2, i1 = (
        _seq_id(idx_ptr, pid_b, t0 - 3, T, HAS_IDX, -1),
        _seq_id(idx_ptr, pid_b, t0 - 2, T, HAS_IDX, -1),
        _seq_id(idx_ptr, pid_b, t0 - 1, T, HAS_IDX, -1),
    )
    full = t0 + (end - t0) // 4 * 4
    px = x_ptr + _row_offsets(xbase, t0, XT, c)[0]
    po = out_ptr + _row_offsets(base, t0, C, c)[0]
    ps = idx_ptr + pid_b * T + t0 + tl.zeros((1,), dtype=tl.int32)
    for _ in tl.range(t0, full, 4, num_stages=STAGES):
        xa, xb = _load_row(px, cm, EVEN_C), _load_row(px + XT, cm, EVEN_C)
        xc, xd = _load_row(px + 2 * XT, cm, EVEN_C), _load_row(px + 3 * XT, cm, EVEN_C)
        if HAS_IDX:
            ia, ib, ic, id_ = tl.load(ps), tl.load(ps + 1), tl.load(ps + 2), tl.load(ps + 3)
            if _one_sequence(i3, i2, i1, ia, ib, ic, id_):  # no boundary in reach: no masks
                ya, yb, yc, yd = _fwd_rows(
                    xa, xb, xc, xd, x1, x2, x3, ia, ib, ic, id_, i1, i2, i3, w0, w1, w2, w3, bias, SILU, False
                )
            else:
                ya, yb, yc, yd = _fwd_rows(
                    xa, xb, xc, xd, x1, x2, x3, ia, ib, ic, id_, i1, i2, i3, w0, w1, w2, w3, bias, SILU, True
                )
        else:  # one sequence a row: the rows before the row's start were read as zeros
            ia = tl.zeros((1,), dtype=tl.int32)
            ib, ic, id_ = ia, ia, ia
            ya, yb, yc, yd = _fwd_rows(
                xa, xb, xc, xd, x1, x2, x3, ia, ib, ic, id_, i1, i2, i3, w0, w1, w2, w3, bias, SILU, False
            )
        _store_rows(po, ya, yb, yc, yd, C, cm, EVEN_C)
        x3, x2, x1 = xb, xc, xd
        i3, i2, i1 = ib, ic, id_
        px += 4 * XT
        po += 4 * C
        ps += 4
    if full < end:
        t = full
        xa, xb = _row(x_ptr, xbase, t, XT, c, cm, end), _row(x_ptr, xbase, t + 1, XT, c, cm, end)
        xc, xd = _row(x_ptr, xbase, t + 2, XT, c, cm, end), _row(x_ptr, xbase, t + 3, XT, c, cm, end)
        ia, ib = _seq_id(idx_ptr, pid_b, t, T, HAS_IDX, -2), _seq_id(idx_ptr, pid_b, t + 1, T, HAS_IDX, -2)
        ic, id_ = _seq_id(idx_ptr, pid_b, t + 2, T, HAS_IDX, -2), _seq_id(idx_ptr, pid_b, t + 3, T, HAS_IDX, -2)
        ya, yb, yc, yd = _fwd_rows(
            xa, xb, xc, xd, x1, x2, x3, ia, ib, ic, id_, i1, i2, i3, w0, w1, w2, w3, bias, SILU, True
        )
        _store_row(out_ptr, ya, base, t, C, c, cm, 0, end)
        _store_row(out_ptr, yb, base, t + 1, C, c, cm, 0, end)
        _store_row(out_ptr, yc, base, t + 2, C, c, cm, 0, end)
        _store_row(out_ptr, yd, base, t + 3, C, c, cm, 0, end)


@triton.jit
def _bwd_row(
    xd,
    idd,
    gout,
    xa,
    xb,
    xc,
    ia,
    ib,
    ic,
    g1,
    g2,
    g3,
    j1,
    j2,
    j3,
    dw0,
    dw1,
    dw2,
    dw3,
    db,
    w0,
    w1,
    w2,
    w3,
    bias,
    own,
    SILU: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One row t of the marching backward given its window (x[t..t−3] as xa, xb, xc, xd; dpre[t+1..t+3]
    as g1..g3, with sequence ids): dpre[t] rebuilt, dx[t], and the dw, db sums taken over the channels
    in `own` (MASKED; without it the caller knows the window is one sequence and the row its own).
    Returns dx[t], the window moved one row down, and the sums."""
    g = gout
    pre = _fwd_out(xa, xb, xc, xd, ia, ib, ic, idd, w0, w1, w2, w3, bias, False, MASKED)
    if SILU:
        sig = _sigmoid(pre)
        g = g * sig * (1 + pre * (1 - sig))
    if MASKED:
        dx = (
            w3 * g
            + w2 * tl.where(j1 == ia, g1, 0.0)
            + w1 * tl.where(j2 == ia, g2, 0.0)
            + w0 * tl.where(j3 == ia, g3, 0.0)
        )
        go = tl.where(own, g, 0.0)
        dw0 += go * tl.where(idd == ia, xd, 0.0)
        dw1 += go * tl.where(ic == ia, xc, 0.0)
        dw2 += go * tl.where(ib == ia, xb, 0.0)
    else:
        dx = w3 * g + w2 * g1 + w1 * g2 + w0 * g3
        go = g
        dw0 += go * xd
        dw1 += go * xc
        dw2 += go * xb
    return dx, xb, xc, xd, ib, ic, idd, g, g1, g2, ia, j1, j2, dw0, dw1, dw2, dw3 + go * xa, db + go


@triton.jit
def _bwd_rows4(
    xd0,
    xd1,
    xd2,
    xd3,
    id0,
    id1,
    id2,
    id3,
    go0,
    go1,
    go2,
    go3,
    xa,
    xb,
    xc,
    ia,
    ib,
    ic,
    g1,
    g2,
    g3,
    j1,
    j2,
    j3,
    dw0,
    dw1,
    dw2,
    dw3,
    db,
    w0,
    w1,
    w2,
    w3,
    bias,
    own,
    SILU: tl.constexpr,
    MASKED: tl.constexpr,
):
    """A backward step: rows t .. t−3 through _bwd_row (x[t−3..t−6] as xd0..xd3, dout[t..t−3] as
    go0..go3). Returns the four dx rows, the window moved four rows down, and the sums."""
    dxa, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db = _bwd_row(
        xd0,
        id0,
        go0,
        xa,
        xb,
        xc,
        ia,
        ib,
        ic,
        g1,
        g2,
        g3,
        j1,
        j2,
        j3,
        dw0,
        dw1,
        dw2,
        dw3,
        db,
        w0,
        w1,
        w2,
        w3,
        bias,
        own,
        SILU,
        MASKED,
    )
    dxb, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db = _bwd_row(
        xd1,
        id1,
        go1,
        xa,
        xb,
        xc,
        ia,
        ib,
        ic,
        g1,
        g2,
        g3,
        j1,
        j2,
        j3,
        dw0,
        dw1,
        dw2,
        dw3,
        db,
        w0,
        w1,
        w2,
        w3,
        bias,
        own,
        SILU,
        MASKED,
    )
    dxc, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db = _bwd_row(
        xd2,
        id2,
        go2,
        xa,
        xb,
        xc,
        ia,
        ib,
        ic,
        g1,
        g2,
        g3,
        j1,
        j2,
        j3,
        dw0,
        dw1,
        dw2,
        dw3,
        db,
        w0,
        w1,
        w2,
        w3,
        bias,
        own,
        SILU,
        MASKED,
    )
    dxd, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db = _bwd_row(
        xd3,
        id3,
        go3,
        xa,
        xb,
        xc,
        ia,
        ib,
        ic,
        g1,
        g2,
        g3,
        j1,
        j2,
        j3,
        dw0,
        dw1,
        dw2,
        dw3,
        db,
        w0,
        w1,
        w2,
        w3,
        bias,
        own,
        SILU,
        MASKED,
    )
    return dxa, dxb, dxc, dxd, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db


@triton.jit
def _one_window(ia, ib, ic, i3, i4, i5, i6, j1, j2, j3):
    """Whether a backward step's ten rows' sequence ids are all equal: a scalar."""
    return _one_sequence(ia, ib, ic, i3, i4, i5, i6) & _one_sequence(j3, j2, j1, ia, ia, ia, ia)


@triton.jit
def _rows4(ptrs, step, mask, LOAD: tl.constexpr):
    """Rows ptrs, ptrs + step, ptrs + 2·step, ptrs + 3·step as stored (zeros where masked; not read
    without LOAD)."""
    if LOAD:
        return (
            tl.load(ptrs, mask=mask, other=0.0),
            tl.load(ptrs + step, mask=mask, other=0.0),
            tl.load(ptrs + 2 * step, mask=mask, other=0.0),
            tl.load(ptrs + 3 * step, mask=mask, other=0.0),
        )
    z = tl.zeros(ptrs.shape, dtype=ptrs.dtype.element_ty)
    return z, z, z, z


@triton.jit
def _ids4(ps, steps, k, HAS_IDX: tl.constexpr):
    """Sequence ids of rows ps, ps − 1, ps − 2, ps − 3 for step k of `steps` (shape (1,) each; zeros
    without HAS_IDX or past the last step)."""
    if HAS_IDX:
        m = (tl.zeros((1,), dtype=tl.int32) + steps) > k  # a vector mask: the interpreter takes no scalar
        return (
            tl.load(ps, mask=m, other=0),
            tl.load(ps - 1, mask=m, other=0),
            tl.load(ps - 2, mask=m, other=0),
            tl.load(ps - 3, mask=m, other=0),
        )
    z = tl.zeros((1,), dtype=tl.int32)
    return z, z, z, z


@triton.jit
def _conv_bwd_march(
    x_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    dout_ptr,
    dx_ptr,
    dw_part_ptr,
    db_part_ptr,
    T,
    C,
    L,
    XT,
    K: tl.constexpr,
    HAS_IDX: tl.constexpr,
    SILU: tl.constexpr,
    BC: tl.constexpr,
    STAGES: tl.constexpr,
    EVEN_C: tl.constexpr,
    PREFETCH: tl.constexpr,
    SPAN: tl.constexpr,
):
    """Time-marching backward (see _bwd_march_body), then this program's dw, db partial sums. With
    seq_idx, a program whose rows, the three before them and the three after them are one sequence
    (most programs) runs the body that reads no ids."""
    pid_b, pid_t, c, cm, base, w0, w1, w2, w3, bias, n_t = _march_program(w_ptr, b_ptr, T, C, L, K, BC)
    xbase = pid_b * T * XT  # x's rows lie XT apart; dout's and dx's C
    if HAS_IDX:
        if _one_sequence_span(idx_ptr, pid_b, T, pid_t * L - 3, L + 9, SPAN):
            dw0, dw1, dw2, dw3, db = _bwd_march_body(
                x_ptr,
                idx_ptr,
                dout_ptr,
                dx_ptr,
                T,
                C,
                L,
                XT,
                xbase,
                pid_b,
                pid_t,
                c,
                cm,
                base,
                w0,
                w1,
                w2,
                w3,
                bias,
                False,
                SILU,
                BC,
                STAGES,
                EVEN_C,
                PREFETCH,
            )
        else:
            dw0, dw1, dw2, dw3, db = _bwd_march_body(
                x_ptr,
                idx_ptr,
                dout_ptr,
                dx_ptr,
                T,
                C,
                L,
                XT,
                xbase,
                pid_b,
                pid_t,
                c,
                cm,
                base,
                w0,
                w1,
                w2,
                w3,
                bias,
                True,
                SILU,
                BC,
                STAGES,
                EVEN_C,
                PREFETCH,
            )
    else:
        dw0, dw1, dw2, dw3, db = _bwd_march_body(
            x_ptr,
            idx_ptr,
            dout_ptr,
            dx_ptr,
            T,
            C,
            L,
            XT,
            xbase,
            pid_b,
            pid_t,
            c,
            cm,
            base,
            w0,
            w1,
            w2,
            w3,
            bias,
            False,
            SILU,
            BC,
            STAGES,
            EVEN_C,
            PREFETCH,
        )
    part = (pid_b * n_t + pid_t) * C
    tl.store(dw_part_ptr + (part + c) * 4, dw0, mask=cm)
    tl.store(dw_part_ptr + (part + c) * 4 + 1, dw1, mask=cm)
    tl.store(dw_part_ptr + (part + c) * 4 + 2, dw2, mask=cm)
    tl.store(dw_part_ptr + (part + c) * 4 + 3, dw3, mask=cm)
    tl.store(db_part_ptr + part + c, db, mask=cm)


@triton.jit
def _bwd_march_body(
    x_ptr,
    idx_ptr,
    dout_ptr,
    dx_ptr,
    T,
    C,
    L,
    XT,
    xbase,
    pid_b,
    pid_t,
    c,
    cm,
    base,
    w0,
    w1,
    w2,
    w3,
    bias,
    HAS_IDX: tl.constexpr,
    SILU: tl.constexpr,
    BC: tl.constexpr,
    STAGES: tl.constexpr,
    EVEN_C: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """Time-marching backward, one pass: a program walks its L rows downwards from three rows above
    them, keeping x[t−3..t] and dpre[t+1..t+3] (with their sequence ids) in registers. At each row:
    pre (rebuilt), dpre = dout · silu'(pre), dx[t] = Σ_j w_j · dpre[t + 3 − j] over the same sequence,
    and the dw, db sums per channel — no fp32 buffer in memory, no reduction across threads.

    Three phases: the rows above the program's own, one at a time (they only supply dpre: each row's
    dw, db and dx are counted by one program); then whole steps of four own rows whose inputs all
    exist, on pointers moved four rows a step, without time masks and, where no boundary is within
    reach, without sequence masks; then the rows left at the bottom, one at a time. A step's x and
    dout rows are all loaded before its first dx row is stored: a load after a store waits for it.
    Returns the dw (taps 0..3) and db sums over the program's own rows."""
    t0 = pid_t * L
    t_own = tl.minimum(t0 + L, T) - 1  # the last row this program writes
    top = tl.minimum(t0 + L + 2, T - 1)  # the highest row whose dpre its rows need
    xa, xb, xc = (
        _row(x_ptr, xbase, top, XT, c, cm, T),
        _row(x_ptr, xbase, top - 1, XT, c, cm, T),
        _row(x_ptr, xbase, top - 2, XT, c, cm, T),
    )  # x[t], x[t−1], x[t−2] for t = top
    ia, ib, ic = (
        _seq_id(idx_ptr, pid_b, top, T, HAS_IDX, -1),
        _seq_id(idx_ptr, pid_b, top - 1, T, HAS_IDX, -1),
        _seq_id(idx_ptr, pid_b, top - 2, T, HAS_IDX, -1),
    )
    g1 = tl.zeros((BC,), dtype=tl.float32)  # dpre[t+1], dpre[t+2], dpre[t+3]
    g2 = tl.zeros((BC,), dtype=tl.float32)
    g3 = tl.zeros((BC,), dtype=tl.float32)
    j1 = _seq_id(idx_ptr, pid_b, top + 1, T, HAS_IDX, -3)
    j2 = _seq_id(idx_ptr, pid_b, top + 2, T, HAS_IDX, -3)
    j3 = _seq_id(idx_ptr, pid_b, top + 3, T, HAS_IDX, -3)
    dw0 = tl.zeros((BC,), dtype=tl.float32)
    dw1 = tl.zeros((BC,), dtype=tl.float32)
    dw2 = tl.zeros((BC,), dtype=tl.float32)
    dw3 = tl.zeros((BC,), dtype=tl.float32)
    db = tl.zeros((BC,), dtype=tl.float32)
    no = cm & False
    for i in range(top - t_own):  # rows above this program's own
        t = top - i
        dx, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db = _bwd_row(
            _row(x_ptr, xbase, t - 3, XT, c, cm, T),
            _seq_id(idx_ptr, pid_b, t - 3, T, HAS_IDX, -1),
            _row(dout_ptr, base, t, C, c, cm, T),
            xa,
            xb,
            xc,
            ia,
            ib,
            ic,
            g1,
            g2,
            g3,
            j1,
            j2,
            j3,
            dw0,
            dw1,
            dw2,
            dw3,
            db,
            w0,
            w1,
            w2,
            w3,
            bias,
            no,
            SILU,
            True,
        )
    # Whole steps t .. t−3 from t = t_own down, while rows t−3 (own) and t−6 (read) exist.
    lowest = tl.maximum(t0 + 3, 6)
    steps = tl.where(t_own >= lowest, (t_own - lowest) // 4 + 1, 0)
    px = x_ptr + _row_offsets(xbase, t_own - 3, XT, c)[0]
    pg = dout_ptr + _row_offsets(base, t_own, C, c)[0]
    pdx = dx_ptr + _row_offsets(base, t_own, C, c)[0]
    ps = idx_ptr + pid_b * T + t_own - 3 + tl.zeros((1,), dtype=tl.int32)
    # PREFETCH: each step's rows are loaded one step ahead, before the step's dx stores, so that eight
    # loads a thread are in flight while a step computes (the loop's own pipelining left these loads
    # unpipelined).
    nxt = cm & ((tl.zeros_like(c) + steps) > 0)
    nx0, nx1, nx2, nx3 = _rows4(px, -XT, nxt, PREFETCH)
    ng0, ng1, ng2, ng3 = _rows4(pg, -C, nxt, PREFETCH)
    ni0, ni1, ni2, ni3 = _ids4(ps, steps, 0, HAS_IDX and PREFETCH)
    for k in tl.range(0, steps, num_stages=STAGES):
        if PREFETCH:
            xd0, xd1, xd2, xd3 = nx0.to(tl.float32), nx1.to(tl.float32), nx2.to(tl.float32), nx3.to(tl.float32)
            go0, go1, go2, go3 = ng0.to(tl.float32), ng1.to(tl.float32), ng2.to(tl.float32), ng3.to(tl.float32)
            id0, id1, id2, id3 = ni0, ni1, ni2, ni3
            nxt = cm & ((tl.zeros_like(c) + steps) > k + 1)
            nx0, nx1, nx2, nx3 = _rows4(px - 4 * XT, -XT, nxt, True)
            ng0, ng1, ng2, ng3 = _rows4(pg - 4 * C, -C, nxt, True)
            ni0, ni1, ni2, ni3 = _ids4(ps - 4, steps, k + 1, HAS_IDX)
        else:
            xd0, xd1 = _load_row(px, cm, EVEN_C), _load_row(px - XT, cm, EVEN_C)
            xd2, xd3 = _load_row(px - 2 * XT, cm, EVEN_C), _load_row(px - 3 * XT, cm, EVEN_C)
            go0, go1 = _load_row(pg, cm, EVEN_C), _load_row(pg - C, cm, EVEN_C)
            go2, go3 = _load_row(pg - 2 * C, cm, EVEN_C), _load_row(pg - 3 * C, cm, EVEN_C)
            id0, id1, id2, id3 = _ids4(ps, steps, k, HAS_IDX)
        if HAS_IDX:
            masked = not _one_window(ia, ib, ic, id0, id1, id2, id3, j1, j2, j3)
        else:
            masked = False
        if masked:
            dxa, dxb, dxc, dxd, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db = _bwd_rows4(
                xd0,
                xd1,
                xd2,
                xd3,
                id0,
                id1,
                id2,
                id3,
                go0,
                go1,
                go2,
                go3,
                xa,
                xb,
                xc,
                ia,
                ib,
                ic,
                g1,
                g2,
                g3,
                j1,
                j2,
                j3,
                dw0,
                dw1,
                dw2,
                dw3,
                db,
                w0,
                w1,
                w2,
                w3,
                bias,
                cm,
                SILU,
                True,
            )
        else:
            dxa, dxb, dxc, dxd, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db = _bwd_rows4(
                xd0,
                xd1,
                xd2,
                xd3,
                id0,
                id1,
                id2,
                id3,
                go0,
                go1,
                go2,
                go3,
                xa,
                xb,
                xc,
                ia,
                ib,
                ic,
                g1,
                g2,
                g3,
                j1,
                j2,
                j3,
                dw0,
                dw1,
                dw2,
                dw3,
                db,
                w0,
                w1,
                w2,
                w3,
                bias,
                cm,
                SILU,
                False,
            )
        _store_rows(pdx, dxa, dxb, dxc, dxd, -C, cm, EVEN_C)
        px -= 4 * XT
        pg -= 4 * C
        pdx -= 4 * C
        ps -= 4
    for i in range(t_own - 4 * steps - t0 + 1):  # the rows left at the bottom
        t = t_own - 4 * steps - i
        dx, xa, xb, xc, ia, ib, ic, g1, g2, g3, j1, j2, j3, dw0, dw1, dw2, dw3, db = _bwd_row(
            _row(x_ptr, xbase, t - 3, XT, c, cm, T),
            _seq_id(idx_ptr, pid_b, t - 3, T, HAS_IDX, -1),
            _row(dout_ptr, base, t, C, c, cm, T),
            xa,
            xb,
            xc,
            ia,
            ib,
            ic,
            g1,
            g2,
            g3,
            j1,
            j2,
            j3,
            dw0,
            dw1,
            dw2,
            dw3,
            db,
            w0,
            w1,
            w2,
            w3,
            bias,
            cm,
            SILU,
            True,
        )
        _store_row(dx_ptr, dx, base, t, C, c, cm, 0, T)
    return dw0, dw1, dw2, dw3, db


def _launch_shape(x: torch.Tensor, bt: int, bc: int):
    """The grid of _tile_ids: (batch · time blocks, channel blocks)."""
    b, t, c = x.shape
    return (b * triton.cdiv(t, bt), triton.cdiv(c, bc))


# Tile: 32 time steps × 128 channels ran fastest of 7 shapes on an H200 (55% of the copy roofline,
# against 41% for 64 × 32): benchmarks/results/conv1d-h200.json, `python benchmarks/bench_conv1d.py --tiles`.
TILE_T, TILE_C = 32, 128
# Backward: each program walks BWD_STEPS tiles of BWD_TILE_T × BWD_TILE_C, so that the dw partial sums
# written per program stay small next to x. TWO_PASS writes the fp32 pre-activation gradient first (one
# more kernel, 8 more bytes per element) instead of rebuilding the pre-activation at each of the K
# shifts inside the gather. Fastest of 24 settings on an H200 at 4 × 16K × 5376 channels, with the dw
# products summed elementwise and reduced once per program: two-pass, 8 × 128, 64 steps — 2.71 ms with
# seq_idx (2.38 ms without), against 4.32 ms for the earlier 64 × 64 × 8 and 3.84 ms for the best
# one-pass setting (benchmarks/results/conv1d-h200-run2.json "bwd_tiles",
# `python benchmarks/bench_conv1d.py --tiles`).
BWD_TILE_T, BWD_TILE_C, BWD_STEPS = 8, 128, 64
TWO_PASS = True


def _rows_as_read(x: torch.Tensor, marching: bool) -> tuple[torch.Tensor, int]:
    """(x, the distance between its rows) as the kernels take it: the marching kernels read x where it
    lies (launch.token_rows) — Mamba-2's xBC, a column slice of the in_proj output, is then not copied
    in the forward, the backward's recompute and the backward: two mamba2-2.7b layers training at 16K
    on an H200 26.6-26.7 → 25.5-25.6 ms, gradients bit-equal
    (benchmarks/results/conv-in-place-ab-h200.json). The tiled kernels take a contiguous x."""
    return launch.token_rows(x) if marching else (x.contiguous(), x.shape[2])


def _bias_or_zeros(bias, weight):
    """The kernels always read a bias (contiguous, one per channel): zeros when there is none."""
    if bias is None:
        return torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
    return bias.contiguous()


# Time-marching kernels (K ≤ 4), forward and backward: each program walks MARCH_ROWS rows of
# MARCH_CHANNELS channels with MARCH_WARPS warps, four rows a step, reading every input once. On H200s
# at 4 × 16K × 5376 bf16 with seq_idx (sweeps of 18, 16 and 5 settings, then three interleaved rounds
# against the kernels before them: benchmarks/results/conv1d-fast-silu-h200.json, -ab2-, -ab3-; then
# `python benchmarks/bench_conv1d.py --march` twice, conv1d-march-cap-h200-r1.json and -r2):
# - forward, 128 rows × 128 channels, 1 warp, no pipelining: 0.437 ms (77% of the copy roofline; 0.44-
#   0.52 ms on the machines of the A/B runs), against 0.50-0.58 ms for the kernels before (a full-range
#   sigmoid, masks at every row) on the same machines;
# - backward, 256 rows × 256 channels, 2 warps, rows loaded a step ahead, 168 registers a thread: 0.73-
#   0.75 ms (68-69%), against 1.14-1.27 ms before; uncapped 0.84-0.94 ms, without the prefetch 0.93-1.09.
# Earlier sweeps: conv1d-rows4-ab-h200.json (27 settings), conv1d-march-h200.json and the files beside it.
MARCH_FWD, MARCH_BWD = True, True
MARCH_FWD_ROWS, MARCH_FWD_CHANNELS, MARCH_FWD_WARPS, MARCH_FWD_STAGES = 128, 128, 1, 1
MARCH_ROWS, MARCH_CHANNELS, MARCH_WARPS, MARCH_STAGES = 256, 256, 2, 1  # the backward's
MARCH_PREFETCH = True  # the backward loads each step's rows one step ahead
# The backward's register cap (Triton's maxnreg): uncapped it takes 255 a thread, so an SM holds 4
# programs of 2 warps; at 168, 6. 0.75-0.82 against 0.85-0.96 ms in two rounds on one H200; 128 and 144
# spill and run slower, 192 and 208 leave 5 programs (benchmarks/results/maxnreg-h200.json,
# conv1d-march-cap-h200-r*.json).
MARCH_MAXNREG = 168


def _reg_cap(regs: int) -> dict:
    """The launch option capping registers a thread (none for 0)."""
    return {"maxnreg": regs} if regs else {}


def _marching(weight, march, default):
    return (default if march is None else march) and weight.shape[1] <= 4


def causal_conv1d_fwd(
    x,
    weight,
    bias,
    seq_idx=None,
    silu=True,
    bt=TILE_T,
    bc=TILE_C,
    march=None,
    rows=None,
    channels=None,
    warps=None,
    stages=None,
):
    """out = act(conv(x)) (settings default to the module's)."""
    marching = _marching(weight, march, MARCH_FWD)
    x, xt = _rows_as_read(x, marching)
    b, t, c = x.shape
    out = torch.empty(b, t, c, dtype=x.dtype, device=x.device)
    idx = seq_idx.to(torch.int32).contiguous() if seq_idx is not None else x
    bias = _bias_or_zeros(bias, weight)
    if marching:
        rows, channels = rows or MARCH_FWD_ROWS, channels or MARCH_FWD_CHANNELS
        _conv_fwd_march[_launch_shape(x, rows, channels)](
            x,
            weight.contiguous(),
            bias,
            idx,
            out,
            t,
            c,
            rows,
            xt,
            K=weight.shape[1],
            HAS_IDX=seq_idx is not None,
            SILU=silu,
            BC=channels,
            STAGES=stages or MARCH_FWD_STAGES,
            EVEN_C=c % channels == 0,
            SPAN=triton.next_power_of_2(rows + 3),
            num_warps=warps or MARCH_FWD_WARPS,
        )
        return out
    _conv_fwd[_launch_shape(x, bt, bc)](
        x,
        weight.contiguous(),
        bias.contiguous(),
        idx,
        out,
        t,
        c,
        K=weight.shape[1],
        HAS_IDX=seq_idx is not None,
        SILU=silu,
        BT=bt,
        BC=bc,
    )
    return out


def causal_conv1d_bwd(
    grad_out,
    x,
    weight,
    bias,
    seq_idx=None,
    silu=True,
    bt=None,
    bc=None,
    steps=None,
    two_pass: bool | None = None,
    march=None,
    rows=None,
    channels=None,
    warps=None,
    stages=None,
    prefetch=None,
    maxnreg=None,
):
    """(dx, dw, db) of causal_conv1d_fwd given the output gradient (settings default to the module's)."""
    bt, bc, steps = bt or BWD_TILE_T, bc or BWD_TILE_C, steps or BWD_STEPS
    two_pass = TWO_PASS if two_pass is None else two_pass
    marching = _marching(weight, march, MARCH_BWD)
    x, xt = _rows_as_read(x, marching)
    b, t, c = x.shape
    k = weight.shape[1]
    dx = torch.empty(b, t, c, dtype=x.dtype, device=x.device)
    idx = seq_idx.to(torch.int32).contiguous() if seq_idx is not None else x
    bias_in = _bias_or_zeros(bias, weight)
    g = grad_out.contiguous()
    if marching:
        rows, channels = rows or MARCH_ROWS, channels or MARCH_CHANNELS
        grid = _launch_shape(x, rows, channels)
        dw_part = torch.empty(b * triton.cdiv(t, rows), c, 4, dtype=torch.float32, device=x.device)
        db_part = torch.empty(b * triton.cdiv(t, rows), c, dtype=torch.float32, device=x.device)
        _conv_bwd_march[grid](
            x,
            weight.contiguous(),
            bias_in,
            idx,
            g,
            dx,
            dw_part,
            db_part,
            t,
            c,
            rows,
            xt,
            K=k,
            HAS_IDX=seq_idx is not None,
            SILU=silu,
            BC=channels,
            STAGES=stages or MARCH_STAGES,
            EVEN_C=c % channels == 0,
            PREFETCH=MARCH_PREFETCH if prefetch is None else prefetch,
            SPAN=triton.next_power_of_2(rows + 9),
            num_warps=warps or MARCH_WARPS,
            **_reg_cap(MARCH_MAXNREG if maxnreg is None else maxnreg),
        )
        dw = dw_part.sum(0)[:, 4 - k :]
    else:
        grid = _launch_shape(x, bt * steps, bc)
        dw_part = torch.empty(b * triton.cdiv(t, bt * steps), c, k, dtype=torch.float32, device=x.device)
        db_part = torch.empty(b * triton.cdiv(t, bt * steps), c, dtype=torch.float32, device=x.device)
        if two_pass and silu:
            dpre = torch.empty(b, t, c, dtype=torch.float32, device=x.device)
            _conv_dpre[_launch_shape(x, bt, bc)](
                x,
                weight.contiguous(),
                bias_in.contiguous(),
                idx,
                g,
                dpre,
                t,
                c,
                K=k,
                HAS_IDX=seq_idx is not None,
                BT=bt,
                BC=bc,
            )
            g, silu = dpre, False
        _conv_bwd[grid](
            x,
            weight.contiguous(),
            bias_in.contiguous(),
            idx,
            g,
            dx,
            dw_part,
            db_part,
            t,
            c,
            K=k,
            HAS_IDX=seq_idx is not None,
            SILU=silu,
            BT=bt,
            BC=bc,
            STEPS=steps,
            KP=triton.next_power_of_2(k),
        )
        dw = dw_part.sum(0)
    return dx, dw.to(weight.dtype), (db_part.sum(0).to(bias.dtype) if bias is not None else None)


class CausalConv1dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, silu):
        ctx.save_for_backward(x, weight, bias, seq_idx)
        ctx.silu = silu
        return causal_conv1d_fwd(x, weight, bias, seq_idx, silu)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bias, seq_idx = ctx.saved_tensors
        return (*causal_conv1d_bwd(grad_out, x, weight, bias, seq_idx, ctx.silu), None, None)


@triton.jit
def _in_rows(c, cm, j, T):
    """The channel mask where row j exists (0 ≤ j < T)."""
    return cm & ((tl.zeros_like(c) + j) < T)


@triton.jit
def _state_row(sbase, c, cm, m: tl.constexpr, SK, K: tl.constexpr):
    """Row −m of the history from the initial state (its last of K − 1 rows is row −1), zeros where
    K − 1 < m, fp32."""
    if K - 1 >= m:
        return tl.load(sbase + (K - 1 - m) * SK, mask=cm, other=0.0).to(tl.float32)
    return tl.zeros((c.shape[0],), dtype=tl.float32)


@triton.jit
def _head_rows(x_ptr, st_ptr, pid_b, c, cm, T, XB, XT, SB, SC, SK, K: tl.constexpr):
    """A sequence shard's first three input rows (x at batch and row strides XB, XT; zeros past T) and
    the three before them from its initial state (b, c, K − 1) at strides SB, SC, SK (zeros where
    K − 1 < 3), fp32."""
    xbase = x_ptr + pid_b * XB + c
    x0 = tl.load(xbase, mask=_in_rows(c, cm, 0, T), other=0.0).to(tl.float32)
    x1 = tl.load(xbase + XT, mask=_in_rows(c, cm, 1, T), other=0.0).to(tl.float32)
    x2 = tl.load(xbase + 2 * XT, mask=_in_rows(c, cm, 2, T), other=0.0).to(tl.float32)
    sbase = st_ptr + pid_b * SB + c * SC
    return (
        x0,
        x1,
        x2,
        _state_row(sbase, c, cm, 1, SK, K),
        _state_row(sbase, c, cm, 2, SK, K),
        _state_row(sbase, c, cm, 3, SK, K),
    )


@triton.jit
def _state_id(sidx_ptr, pid_b, m: tl.constexpr, K: tl.constexpr, HAS_IDX: tl.constexpr):
    """Sequence id (shape (1,)) of row −m of the history: column K − 1 − m of the initial state's ids
    (b, K − 1); 0 without seq_idx, and where K − 1 < m (the row is zeros there)."""
    z = tl.zeros((1,), dtype=tl.int32)
    if HAS_IDX:
        if K - 1 >= m:
            return tl.load(sidx_ptr + pid_b * (K - 1) + (K - 1 - m) + z)
    return z


@triton.jit
def _head_ids(idx_ptr, sidx_ptr, pid_b, T, K: tl.constexpr, HAS_IDX: tl.constexpr):
    """Sequence ids (shape (1,) each) of a shard's rows 0, 1, 2 and of the history rows −1, −2, −3. Without
    seq_idx all are 0 (rows past T aside, which hold zeros and whose outputs nothing reads)."""
    return (
        _seq_id(idx_ptr, pid_b, 0, T, HAS_IDX, -2),
        _seq_id(idx_ptr, pid_b, 1, T, HAS_IDX, -2),
        _seq_id(idx_ptr, pid_b, 2, T, HAS_IDX, -2),
        _state_id(sidx_ptr, pid_b, 1, K, HAS_IDX),
        _state_id(sidx_ptr, pid_b, 2, K, HAS_IDX),
        _state_id(sidx_ptr, pid_b, 3, K, HAS_IDX),
    )


@triton.jit
def _if(same, v):
    """v where the two rows are one sequence, else 0."""
    return tl.where(same, v, 0.0)


@triton.jit
def _dpre(g, pre, SILU: tl.constexpr):
    if SILU:
        sig = _sigmoid(pre)
        return g * sig * (1 + pre * (1 - sig))
    return g


@triton.jit
def _head_program(
    x_ptr,
    st_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    sidx_ptr,
    T,
    C,
    XB,
    XT,
    SB,
    SC,
    SK,
    K: tl.constexpr,
    HAS_IDX: tl.constexpr,
    BC: tl.constexpr,
):
    """A head program's channels, their mask, its rows' base offset in a contiguous (b, T, C) output,
    its six input rows (_head_rows) and their sequence ids (_head_ids), the four right-aligned taps and
    the bias (fp32)."""
    pid_b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    cm = c < C
    x0, x1, x2, s1, s2, s3 = _head_rows(x_ptr, st_ptr, pid_b, c, cm, T, XB, XT, SB, SC, SK, K)
    i0, i1, i2, u1, u2, u3 = _head_ids(idx_ptr, sidx_ptr, pid_b, T, K, HAS_IDX)
    w0, w1, w2, w3 = (
        _tap(w_ptr, c, cm, 0, K),
        _tap(w_ptr, c, cm, 1, K),
        _tap(w_ptr, c, cm, 2, K),
        _tap(w_ptr, c, cm, 3, K),
    )
    bias = tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)
    rows = (x0, x1, x2, s1, s2, s3, i0, i1, i2, u1, u2, u3)
    return c, cm, pid_b * T * C + c, rows, w0, w1, w2, w3, bias


@triton.jit
def _conv_head_fwd(
    x_ptr,
    st_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    sidx_ptr,
    out_ptr,
    T,
    C,
    XB,
    XT,
    SB,
    SC,
    SK,
    K: tl.constexpr,
    HAS_IDX: tl.constexpr,
    SILU: tl.constexpr,
    BC: tl.constexpr,
):
    """Grid (batch, channel blocks): output rows 0..2 of a conv whose input continues an earlier
    shard's, from that shard's last K − 1 inputs (the initial state), over the zero-history rows the
    main kernel wrote. With seq_idx a tap reads a row (of x or of the history) only where that row's
    sequence id is the output row's (the history's ids: the initial state's, one per column)."""
    c, cm, base, rows, w0, w1, w2, w3, bias = _head_program(
        x_ptr, st_ptr, w_ptr, b_ptr, idx_ptr, sidx_ptr, T, C, XB, XT, SB, SC, SK, K, HAS_IDX, BC
    )
    x0, x1, x2, s1, s2, s3, i0, i1, i2, u1, u2, u3 = rows
    for t in tl.static_range(3):
        if t == 0:
            y = _fwd_out(x0, s1, s2, s3, i0, u1, u2, u3, w0, w1, w2, w3, bias, SILU)
        elif t == 1:
            y = _fwd_out(x1, x0, s1, s2, i1, i0, u1, u2, w0, w1, w2, w3, bias, SILU)
        else:
            y = _fwd_out(x2, x1, x0, s1, i2, i1, i0, u1, w0, w1, w2, w3, bias, SILU)
        tl.store(out_ptr + base + t * C, y.to(out_ptr.dtype.element_ty), mask=_in_rows(c, cm, t, T))


@triton.jit
def _conv_head_bwd(
    x_ptr,
    st_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    sidx_ptr,
    dout_ptr,
    dx_ptr,
    dst_ptr,
    dw_ptr,
    db_ptr,
    T,
    C,
    XB,
    XT,
    SB,
    SC,
    SK,
    K: tl.constexpr,
    HAS_IDX: tl.constexpr,
    SILU: tl.constexpr,
    BC: tl.constexpr,
):
    """Grid (batch, channel blocks): the backward of _conv_head_fwd over the main kernel's
    zero-history backward. Output rows 0..2's pre-activation gradients with the true history (dT) and
    with zeros before row 0 (dZ, what the main backward used) give dx rows 0..2 the difference, the
    initial state its gradient (b, c, K − 1, fp32), and dw, db their difference per batch row ((b, c,
    4) right-aligned taps and (b, c), fp32, for the caller to sum). With seq_idx every product of an
    output row's gradient with an input row (or a tap of it) counts only where the two rows are one
    sequence, as in the forward."""
    c, cm, base, rows, w0, w1, w2, w3, bias = _head_program(
        x_ptr, st_ptr, w_ptr, b_ptr, idx_ptr, sidx_ptr, T, C, XB, XT, SB, SC, SK, K, HAS_IDX, BC
    )
    x0, x1, x2, s1, s2, s3, i0, i1, i2, u1, u2, u3 = rows
    bc = tl.program_id(0).to(tl.int64) * C + c  # this batch row's channels in the (b, c, …) outputs
    g0 = tl.load(dout_ptr + base, mask=_in_rows(c, cm, 0, T), other=0.0).to(tl.float32)
    g1 = tl.load(dout_ptr + base + C, mask=_in_rows(c, cm, 1, T), other=0.0).to(tl.float32)
    g2 = tl.load(dout_ptr + base + 2 * C, mask=_in_rows(c, cm, 2, T), other=0.0).to(tl.float32)
    zero = tl.zeros_like(x0)
    t0 = _dpre(g0, _fwd_out(x0, s1, s2, s3, i0, u1, u2, u3, w0, w1, w2, w3, bias, False), SILU)
    t1 = _dpre(g1, _fwd_out(x1, x0, s1, s2, i1, i0, u1, u2, w0, w1, w2, w3, bias, False), SILU)
    t2 = _dpre(g2, _fwd_out(x2, x1, x0, s1, i2, i1, i0, u1, w0, w1, w2, w3, bias, False), SILU)
    z0 = _dpre(g0, _fwd_out(x0, zero, zero, zero, i0, u1, u2, u3, w0, w1, w2, w3, bias, False), SILU)
    z1 = _dpre(g1, _fwd_out(x1, x0, zero, zero, i1, i0, u1, u2, w0, w1, w2, w3, bias, False), SILU)
    z2 = _dpre(g2, _fwd_out(x2, x1, x0, zero, i2, i1, i0, u1, w0, w1, w2, w3, bias, False), SILU)
    e0, e1, e2 = t0 - z0, t1 - z1, t2 - z2
    # dx rows 0..2: the difference of what outputs 0..2 send back to them (output t reads row s by tap 3 − (t − s)).
    for s in tl.static_range(3):
        if s == 0:
            fix = e0 * w3 + _if(i1 == i0, e1 * w2) + _if(i2 == i0, e2 * w1)
        elif s == 1:
            fix = e1 * w3 + _if(i2 == i1, e2 * w2)
        else:
            fix = e2 * w3
        m = _in_rows(c, cm, s, T)
        cur = tl.load(dx_ptr + base + s * C, mask=m, other=0.0).to(tl.float32)
        tl.store(dx_ptr + base + s * C, (cur + fix).to(dx_ptr.dtype.element_ty), mask=m)
    sbase = dst_ptr + bc * (K - 1)
    if K >= 2:  # row −1
        tl.store(sbase + (K - 2), _if(u1 == i0, t0 * w2) + _if(u1 == i1, t1 * w1) + _if(u1 == i2, t2 * w0), mask=cm)
    if K >= 3:  # row −2
        tl.store(sbase + (K - 3), _if(u2 == i0, t0 * w1) + _if(u2 == i1, t1 * w0), mask=cm)
    if K >= 4:  # row −3
        tl.store(sbase + (K - 4), _if(u3 == i0, t0 * w0), mask=cm)
    wbase = dw_ptr + bc * 4
    tl.store(wbase + 3, e0 * x0 + e1 * x1 + e2 * x2, mask=cm)
    tl.store(wbase + 2, _if(u1 == i0, t0 * s1) + _if(i0 == i1, e1 * x0) + _if(i1 == i2, e2 * x1), mask=cm)
    tl.store(wbase + 1, _if(u2 == i0, t0 * s2) + _if(u1 == i1, t1 * s1) + _if(i0 == i2, e2 * x0), mask=cm)
    tl.store(wbase + 0, _if(u3 == i0, t0 * s3) + _if(u2 == i1, t1 * s2) + _if(u1 == i2, t2 * s1), mask=cm)
    tl.store(db_ptr + bc, e0 + e1 + e2, mask=cm)


HEAD_CHANNELS = 256  # channels per program of the shard-head kernels


def _channels_last(x):
    """x itself where its channels are contiguous (the head kernels read its first rows at its own batch
    and row strides), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _head_ids_in(x, seq_idx, state_idx, k):
    """(seq_idx, the initial state's ids) as the head kernels read them: int32, contiguous; the state's
    ids −1 (no sequence) when not given; both x (never read) without seq_idx."""
    if seq_idx is None:
        return x, x
    idx = seq_idx.to(torch.int32).contiguous()
    if state_idx is None:
        return idx, torch.full((x.shape[0], k - 1), -1, dtype=torch.int32, device=x.device)
    return idx, state_idx.to(device=x.device, dtype=torch.int32).contiguous()


def _head_launch(kernel, x, state, weight, bias, seq_idx, state_idx, silu, *outputs):
    """One launch of a head kernel over (batch, channel blocks); `outputs` go between the ids and T."""
    xh = _channels_last(x)
    b, t, c = xh.shape
    k = weight.shape[1]
    idx, sidx = _head_ids_in(xh, seq_idx, state_idx, k)
    kernel[(b, triton.cdiv(c, HEAD_CHANNELS))](
        xh,
        state,
        weight.contiguous(),
        _bias_or_zeros(bias, weight),
        idx,
        sidx,
        *outputs,
        t,
        c,
        xh.stride(0),
        xh.stride(1),
        *state.stride(),
        K=k,
        HAS_IDX=seq_idx is not None,
        SILU=silu,
        BC=HEAD_CHANNELS,
    )


class CausalConv1dHistoryFn(torch.autograd.Function):
    """The conv of a sequence shard that continues an earlier one: the main kernels run it as a
    sequence of its own (no copy of x with the history in front), and the head kernels redo output rows
    0..2 — and their share of the backward — with the initial state as the rows before. With seq_idx
    (packed documents on the shard) the initial state's columns carry their own ids (`state_idx`,
    (b, K − 1); −1, no sequence, when None): a row reads a history row only of its own sequence."""

    @staticmethod
    def forward(ctx, x, state, weight, bias, seq_idx, state_idx, silu):
        out = causal_conv1d_fwd(x, weight, bias, seq_idx, silu)
        _head_launch(_conv_head_fwd, x, state, weight, bias, seq_idx, state_idx, silu, out)
        ctx.save_for_backward(x, state, weight, bias, seq_idx, state_idx)
        ctx.silu = silu
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, state, weight, bias, seq_idx, state_idx = ctx.saved_tensors
        dx, dw, db = causal_conv1d_bwd(grad_out, x, weight, bias, seq_idx, ctx.silu)
        b, _, c = x.shape
        k = weight.shape[1]
        d_state = torch.empty(b, c, k - 1, dtype=torch.float32, device=x.device)
        dw_fix = torch.empty(b, c, 4, dtype=torch.float32, device=x.device)
        db_fix = torch.empty(b, c, dtype=torch.float32, device=x.device)
        _head_launch(
            _conv_head_bwd,
            x,
            state,
            weight,
            bias,
            seq_idx,
            state_idx,
            ctx.silu,
            grad_out.contiguous(),
            dx,
            d_state,
            dw_fix,
            db_fix,
        )
        dw = (dw.float() + dw_fix.sum(0)[:, 4 - k :]).to(weight.dtype)
        db = (db.float() + db_fix.sum(0)).to(bias.dtype) if bias is not None else None
        # The state's gradient in the state's own layout, as autograd through the reference gives it: the
        # executor's state is a transposed view of the (b, K − 1, c) tail, whose gradient then is contiguous
        # for the send back to the previous shard.
        d_state = torch.empty_like(state).copy_(d_state)
        return dx, d_state, dw, db, None, None, None


def causal_conv1d(
    x,
    weight,
    bias=None,
    seq_idx=None,
    activation: str | None = "silu",
    initial_state=None,
    initial_seq_idx=None,
):
    """x (b, t, c), weight (c, K), bias (c,), seq_idx (b, t) int: the packed-aware causal conv.

    `initial_state` (b, c, K − 1): the window a previous sequence shard ended with (K ≤ 4):
    CausalConv1dHistoryFn, its gradient among the outputs. With seq_idx, `initial_seq_idx` (b, K − 1)
    gives each of its columns' sequence (a row reads only its own sequence's; None: no sequence), as
    reference.causal_conv1d_ref takes them."""
    if initial_state is not None:
        if weight.shape[1] > 4:
            raise ValueError(f"causal_conv1d: initial_state needs a kernel of at most 4 taps, not {weight.shape[1]}")
        silu = activation == "silu"
        return CausalConv1dHistoryFn.apply(x, initial_state, weight, bias, seq_idx, initial_seq_idx, silu)
    return CausalConv1dFn.apply(x, weight, bias, seq_idx, activation == "silu")


@triton.jit
def _conv_update(x_ptr, state_ptr, w_ptr, b_ptr, out_ptr, C, K: tl.constexpr, SILU: tl.constexpr, BC: tl.constexpr):
    """One new token per row: out = act(bias + Σ_j w[:, j] · window[j]) over the window
    (state[0..K−2], x); then the state drops its oldest entry and takes x, in place."""
    pid_b, pid_c = tl.program_id(0), tl.program_id(1)
    c = pid_c * BC + tl.arange(0, BC)
    cm = c < C
    x = tl.load(x_ptr + pid_b * C + c, mask=cm, other=0.0)
    acc = tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32) + x.to(tl.float32) * tl.load(
        w_ptr + c * K + K - 1, mask=cm, other=0.0
    ).to(tl.float32)
    base = pid_b * (K - 1) * C
    prev = tl.load(state_ptr + base + c, mask=cm, other=0.0)  # the oldest entry
    for j in tl.static_range(1, K - 1):
        cur = tl.load(state_ptr + base + j * C + c, mask=cm, other=0.0)
        acc += prev.to(tl.float32) * tl.load(w_ptr + c * K + j - 1, mask=cm, other=0.0).to(tl.float32)
        tl.store(state_ptr + base + (j - 1) * C + c, cur, mask=cm)
        prev = cur
    acc += prev.to(tl.float32) * tl.load(w_ptr + c * K + K - 2, mask=cm, other=0.0).to(tl.float32)
    tl.store(state_ptr + base + (K - 2) * C + c, x.to(state_ptr.dtype.element_ty), mask=cm)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + pid_b * C + c, acc.to(out_ptr.dtype.element_ty), mask=cm)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation: str | None = "silu", bc: int = 256):
    """Decode: x (b, c) one token per row, conv_state (b, K−1, c) contiguous, the last K−1 inputs
    oldest first, updated in place. Returns (b, c). Reference: reference.causal_conv1d_update_ref."""
    b, c = x.shape
    k = weight.shape[1]
    assert conv_state.is_contiguous() and conv_state.shape == (b, k - 1, c)
    out = torch.empty_like(x)
    bias = _bias_or_zeros(bias, weight)
    _conv_update[(b, triton.cdiv(c, bc))](
        x.contiguous(),
        conv_state,
        weight.contiguous(),
        bias.contiguous(),
        out,
        c,
        K=k,
        SILU=activation == "silu",
        BC=bc,
    )
    return out

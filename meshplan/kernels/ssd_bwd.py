"""Mamba-2 chunked SSD scan, backward (Triton). Two steps, mirroring the forward:

1. the state recurrence run backwards, in one sequential pass over the chunks that also forms each
   chunk's dE_c = Σ_i exp(cum_i) dy_i ⊗ C_i, the gradient its outputs send to the state entering it
   (meshplan.kernels.ssd._pass_chunks, reversed): with G_c the total gradient of E_c (G_nc = d final),
   dS_c = G_{c+1} and G_c = dE_c + exp(Σ a over c) · keep_c · G_{c+1}; G_0 is the initial state's
   gradient. The decay's gradient, a reduction over each state, is left to the chunk kernel, which
   reads E and dS anyway;
2. one program per (chunk, head) for dx, ddt, the per-chunk shares of dA and dD, and the gradient of
   the chunk's C_i·B_j matrix; then one per (chunk, group of heads, d_state block) for dB and dC, which
   sum over the heads that share a group.

The entering states are recomputed here (the forward's pass again), not saved by the forward.
Reference for every gradient: autograd through meshplan.kernels.reference.ssd_chunked_ref
(tests/test_ssd_kernel.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from meshplan.kernels import launch
from meshplan.kernels.ssd import grid_ids, pass_states, prepare, state_tile


@triton.jit
def _chunk_weights(dt_ptr, a_ptr, sid_ptr, prev_ptr, row0, chunk, h, H, L: tl.constexpr, HAS_SID: tl.constexpr):
    """One head's per-token quantities in a chunk whose first token is row `row0` of the batch's rows
    (chunk `chunk` of the batch's chunks): dt, A, cum (inclusive cumsum of dt·A), reach (exp(cum) where
    the entering state reaches) and w without its dt factor (exp(cum_last − cum) on the chunk's last
    sequence). The int64 part of each address is in the scalar base; the per-token offsets are int32."""
    i = tl.arange(0, L)
    a_h = tl.load(a_ptr + h).to(tl.float32)
    dt = tl.load(dt_ptr + row0 * H + h + i * H).to(tl.float32)
    cum = tl.cumsum(dt * a_h, axis=0)
    reach = tl.exp(cum)
    w_nodt = tl.exp(tl.sum(dt * a_h, axis=0) - cum)
    if HAS_SID:
        sid = tl.load(sid_ptr + row0 + i)
        reach = tl.where(sid == tl.load(prev_ptr + chunk), reach, 0.0)
        w_nodt = tl.where(sid == tl.max(sid, axis=0), w_nodt, 0.0)
    return dt, a_h, cum, reach, w_nodt


@triton.jit
def _decay(sid_ptr, row0, cum, L: tl.constexpr, HAS_SID: tl.constexpr):
    """exp(cum_i − cum_j) for the pairs that interact (j ≤ i, one sequence), 0 elsewhere (L × L)."""
    i = tl.arange(0, L)
    pair = i[:, None] >= i[None, :]
    if HAS_SID:
        sid = tl.load(sid_ptr + row0 + i)
        pair = pair & (sid[:, None] == sid[None, :])
    return tl.exp(tl.where(pair, cum[:, None] - cum[None, :], -float("inf")))


@triton.jit
def _chunk_bwd_dx(
    x_ptr,
    dt_ptr,
    a_ptr,
    b_ptr,
    c_ptr,
    d_ptr,
    enter_ptr,
    e_starts_ptr,
    e_delta_ptr,
    ds_ptr,
    ds_starts_ptr,
    ds_delta_ptr,
    dy_ptr,
    sid_ptr,
    prev_ptr,
    keep_ptr,
    dx_ptr,
    ddt_ptr,
    dcb_ptr,
    da_ptr,
    dd_ptr,
    S,
    H,
    G,
    P,
    N,
    XT,
    BT,
    CT,
    K,
    NSEG,
    HAS_D: tl.constexpr,
    HAS_SID: tl.constexpr,
    SEGMENTED: tl.constexpr,
    L: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
):
    """Grid (batch · chunk · head,). With M_ij = (C_i·B_j) exp(cum_i − cum_j) dt_j [same sequence,
    j ≤ i] and w_j = exp(cum_last − cum_j) dt_j [last sequence]: y_i = Σ_j M_ij x_j + reach_i C_i·E
    + D x_i and S = Σ_j w_j x_j ⊗ B_j. Writes dx, ddt, the gradient of C_i·B_j (for dB, dC) and
    this chunk's share of dA and dD."""
    pid_bc, h, _ = grid_ids(H, 1)
    # Addresses: the int64 part (past 2^31 at long context) in scalar bases — the chunk's first row
    # across the batch, its state block — and int32 offsets within the chunk's tiles, so that no tile
    # of 64-bit offsets takes registers: 0.84 → 0.80 ms on an H200 at 16K × 80 heads, 18 → 10
    # registers spilled (benchmarks/results/ssd-bwd-offsets-masks-ab-h200.json, dxonly). The dB/dC
    # kernel built the same way ran slower (0.395 → 0.413 ms, ssd-bwd-int32-offsets-ab-h200.json) and
    # keeps its int64 offsets; unmasked tiles where every block is whole slowed dx (0.833 ms).
    pid_bc = pid_bc.to(tl.int64)
    n_chunks = S // L
    row0 = (pid_bc // n_chunks) * S + (pid_bc % n_chunks) * L
    g = h // (H // G)
    i = tl.arange(0, L)
    n = tl.arange(0, BN)
    nm = n < N
    bv = tl.load(b_ptr + row0 * BT + g * N + (i[:, None] * BT + n[None, :]), mask=nm[None, :], other=0.0)
    cv = tl.load(c_ptr + row0 * CT + g * N + (i[:, None] * CT + n[None, :]), mask=nm[None, :], other=0.0)
    dt, a_h, cum, reach, w_nodt = _chunk_weights(dt_ptr, a_ptr, sid_ptr, prev_ptr, row0, pid_bc, h, H, L, HAS_SID)
    w = w_nodt * dt
    # Only the transposed, rounded M is live through the headdim loop; C·Bᵀ and the decay are formed
    # again after it: 0.945 → 0.918 ms on an H200 at 16K × 80 heads (the kernel stays at 255 registers
    # a thread; benchmarks/results/ssd-dx-registers-h200.json).
    m_t = tl.trans(tl.dot(cv, tl.trans(bv)) * _decay(sid_ptr, row0, cum, L, HAS_SID) * dt[None, :])
    m_t = m_t.to(dy_ptr.dtype.element_ty)
    dm = tl.zeros((L, L), dtype=tl.float32)  # dy_i · x_j
    dw = tl.zeros((L,), dtype=tl.float32)
    dcum = tl.zeros((L,), dtype=tl.float32)
    dd = 0.0
    dse = 0.0  # Σ dS · E, for the gradient of the chunk's decay
    x_base = x_ptr + row0 * XT + h * P
    tok = (row0 * H + h) * P  # dy, dx: contiguous, H · P a token
    st = (pid_bc * H + h) * P * N  # this chunk and head's (P, N) state
    for p0 in range(0, P, BP):
        p = p0 + tl.arange(0, BP)
        pm = p < P
        tok_offs = i[:, None] * (H * P) + p[None, :]
        x_in = tl.load(x_base + (i[:, None] * XT + p[None, :]), mask=pm[None, :], other=0.0)
        dy_in = tl.load(dy_ptr + tok + tok_offs, mask=pm[None, :], other=0.0)
        x, dy = x_in.to(tl.float32), dy_in.to(tl.float32)
        st_offs = p[:, None] * N + n[None, :]
        st_mask = pm[:, None] & nm[None, :]
        ds = state_tile(
            ds_ptr + st + st_offs,
            st_mask,
            ds_starts_ptr,
            ds_delta_ptr,
            pid_bc,
            h,
            st_offs,
            H,
            P * N,
            n_chunks,
            K,
            NSEG,
            True,
            SEGMENTED,
        )
        e = state_tile(
            enter_ptr + st + st_offs,
            st_mask,
            e_starts_ptr,
            e_delta_ptr,
            pid_bc,
            h,
            st_offs,
            H,
            P * N,
            n_chunks,
            K,
            NSEG,
            False,
            SEGMENTED,
        )
        dse += tl.sum(tl.sum(ds.to(tl.float32) * e.to(tl.float32), axis=1), axis=0)
        bds = tl.dot(bv, tl.trans(ds.to(bv.dtype)))  # (L, BP)
        dx = tl.dot(m_t, dy_in) + w[:, None] * bds
        if HAS_D:
            dx += tl.load(d_ptr + h).to(tl.float32) * dy
            dd += tl.sum(tl.sum(dy * x, axis=1), axis=0)
        tl.store(dx_ptr + tok + tok_offs, dx.to(dx_ptr.dtype.element_ty), mask=pm[None, :])
        dm += tl.dot(dy_in, tl.trans(x_in))  # in the inputs' dtype: exact products, fp32 sums
        dw += tl.sum(x * bds, axis=1)
        dcum += tl.sum(dy * tl.dot(cv, tl.trans(e.to(cv.dtype))), axis=1)  # C_i · E[p]
    dm_decay = dm * _decay(sid_ptr, row0, cum, L, HAS_SID)
    cb = tl.dot(cv, tl.trans(bv))
    tl.store(
        dcb_ptr + (pid_bc * H + h) * L * L + (i[:, None] * L + i[None, :]),
        (dm_decay * dt[None, :]).to(dcb_ptr.dtype.element_ty),
    )
    # q = dm ∘ M is the gradient of log M_ij, and dcum_i = Σ_j q_ij − Σ_j q_ji − dw_i w_i (+ the entering
    # state's share). Σ_j q_ji + dw_i w_i = dt_i ddt_i, so two L × L reductions do where three did: the
    # kernel went 0.887 → 0.84 ms on an H200 at 16K × 80 heads with dA within 1e-6 of before
    # (benchmarks/results/ssd-bwd-rowsums2-ab-h200.json, variant vd).
    dmc = dm_decay * cb
    ddt = tl.sum(dmc, axis=0) + dw * w_nodt
    dcum = dcum * reach + tl.sum(dmc * dt[None, :], axis=1) - dt * ddt
    decay_c = tl.exp(tl.sum(dt * a_h, axis=0))
    if HAS_SID:  # keep exists with seq_idx: 0 where a boundary falls before the chunk's end
        decay_c = decay_c * tl.load(keep_ptr + pid_bc)
    dlast = tl.sum(dw * w, axis=0) + decay_c * dse
    # cum_i = Σ_{k ≤ i} a_k and last = Σ_k a_k, so da_k = Σ_{i ≥ k} dcum_i + dlast.
    da = tl.sum(dcum, axis=0) - tl.cumsum(dcum, axis=0) + dcum + dlast
    tl.store(ddt_ptr + row0 * H + h + i * H, ddt + da * a_h)
    tl.store(da_ptr + pid_bc * H + h, tl.sum(da * dt, axis=0))
    if HAS_D:
        tl.store(dd_ptr + pid_bc * H + h, dd)


@triton.jit
def _chunk_bwd_dbc(
    x_ptr,
    dt_ptr,
    a_ptr,
    b_ptr,
    c_ptr,
    enter_ptr,
    e_starts_ptr,
    e_delta_ptr,
    ds_ptr,
    ds_starts_ptr,
    ds_delta_ptr,
    dy_ptr,
    sid_ptr,
    prev_ptr,
    dcb_ptr,
    db_ptr,
    dc_ptr,
    S,
    H,
    G,
    P,
    N,
    XT,
    BT,
    CT,
    K,
    NSEG,
    HPP: tl.constexpr,
    HAS_SID: tl.constexpr,
    SEGMENTED: tl.constexpr,
    L: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
):
    """Grid (batch · chunk · group · split · d_state block,): dB_j = Σ_h Σ_i dCB_ij C_i + w_j x_j·dS and
    dC_i = Σ_h Σ_j dCB_ij B_j + reach_i dy_i·E over HPP heads of one group (a split's partial sum)."""
    splits = H // G // HPP
    pid_bc, pid_gs, pid_n = grid_ids(G * splits, tl.cdiv(N, BN))
    pid_bc = pid_bc.to(tl.int64)  # offsets pass 2^31 at long context
    n_chunks = S // L
    bi, ci = pid_bc // n_chunks, pid_bc % n_chunks
    g = pid_gs // splits
    t = ci * L + tl.arange(0, L)
    n = pid_n * BN + tl.arange(0, BN)
    nm = n < N
    i = tl.arange(0, L)
    bv = tl.load(b_ptr + (bi * S + t[:, None]) * BT + g * N + n[None, :], mask=nm[None, :], other=0.0)
    cv = tl.load(c_ptr + (bi * S + t[:, None]) * CT + g * N + n[None, :], mask=nm[None, :], other=0.0)
    db = tl.zeros((L, BN), dtype=tl.float32)
    dc = tl.zeros((L, BN), dtype=tl.float32)
    for k in range(HPP):
        h = g * (H // G) + (pid_gs % splits) * HPP + k
        dt, a_h, cum, reach, w_nodt = _chunk_weights(
            dt_ptr, a_ptr, sid_ptr, prev_ptr, bi * S + ci * L, pid_bc, h, H, L, HAS_SID
        )
        dcb = tl.load(dcb_ptr + (pid_bc * H + h) * L * L + i[:, None] * L + i[None, :])
        dc = tl.dot(dcb.to(bv.dtype), bv, dc)
        db = tl.dot(tl.trans(dcb).to(cv.dtype), cv, db)
        w = w_nodt * dt
        st_base = ((bi * n_chunks + ci) * H + h) * P
        for p0 in range(0, P, BP):
            p = p0 + tl.arange(0, BP)
            pm = p < P
            x = tl.load(x_ptr + (bi * S + t[:, None]) * XT + h * P + p[None, :], mask=pm[None, :], other=0.0)
            dy = tl.load(dy_ptr + ((bi * S + t[:, None]) * H + h) * P + p[None, :], mask=pm[None, :], other=0.0)
            st_offs = (st_base + p[:, None]) * N + n[None, :]
            st_mask = pm[:, None] & nm[None, :]
            # The per-token weights go onto the token operand (rounded to its dtype, as the forward's
            # chunk-state kernel puts them onto B), so that each product adds straight into dC or dB:
            # no (L, BN) fp32 partial a head beside the two accumulators.
            in_state = p[:, None] * N + n[None, :]
            e = state_tile(
                enter_ptr + st_offs,
                st_mask,
                e_starts_ptr,
                e_delta_ptr,
                pid_bc,
                h,
                in_state,
                H,
                P * N,
                n_chunks,
                K,
                NSEG,
                False,
                SEGMENTED,
            ).to(dy.dtype)
            dc = tl.dot((reach[:, None] * dy).to(dy.dtype), e, dc)
            ds = state_tile(
                ds_ptr + st_offs,
                st_mask,
                ds_starts_ptr,
                ds_delta_ptr,
                pid_bc,
                h,
                in_state,
                H,
                P * N,
                n_chunks,
                K,
                NSEG,
                True,
                SEGMENTED,
            ).to(x.dtype)
            db = tl.dot((w[:, None] * x).to(x.dtype), ds, db)
    out_offs = ((bi * S + t[:, None]) * (G * splits) + pid_gs) * N + n[None, :]
    tl.store(db_ptr + out_offs, db, mask=nm[None, :])
    tl.store(dc_ptr + out_offs, dc, mask=nm[None, :])


# Launch settings of the chunk backward kernels — warps, headdim block (and the dB/dC kernel's d_state
# block, meshplan.kernels.launch): the fastest of 12 settings on an H200 (2.82 ms, against 3.10 ms at
# 16 and 64): benchmarks/results/ssd-bwd-tune-h200.json, `python benchmarks/bench_ssd.py --tune`.
# Swept again with each kernel's time and the dB/dC kernel's warps apart (24 settings,
# ssd-bwd-tune-kernels-h200.json): dx is fastest at headdim block 32 and 4 warps (0.906 ms; 1.65-2.16
# ms elsewhere); dB/dC at block 16 would save 0.025 ms of its 0.527 (1% of the backward), and 8 warps
# slow it (0.56-0.70 ms).
BWD_WARPS = 4
BWD_HEADDIM_BLOCK = 32
BWD_DBC_WARPS = 4  # the dB/dC kernel's own warps
# Pipeline stages of both chunk kernels: 3 (Triton's default, pinned here) ran fastest of 1-5 on an
# H200 (dx 0.89 ms against 0.96-1.44, dB/dC 0.53 against 0.54-0.87; benchmarks/results/ssd-bwd-stages-h200.json).
BWD_STAGES = 3


def ssd_backward(
    dy,
    dfinal,
    x,
    dt,
    A,
    B,
    C,
    D,
    initial_state,
    seq_idx,
    chunk: int,
    bp: int | None = None,
    split_target: int | None = None,
    warps: int | None = None,
    dbc_warps: int | None = None,
):
    """Gradients of (x, dt, A, B, C, D, initial_state) (None where the input is None).

    The per-chunk buffers the chunk kernels read — the recomputed entering states, dS and the C·B
    gradient — are stored in the inputs' dtype, as mamba_ssm's backward stores its states and dstates:
    those kernels use them only as operands of products in that dtype. Every recurrence (both state
    passings) and every sum runs in fp32; dE, a sum over the chunk's tokens, stays in fp32 registers."""
    pk = prepare(x, dt, A, B, C, seq_idx, chunk, bp or BWD_HEADDIM_BLOCK)
    b, S, h, p, g, n, nc = pk.shape
    io = pk.x.dtype
    entering, _ = pass_states(pk, pk.x, pk.B, initial_state, io, backward=True)
    dy = torch.nn.functional.pad(dy, (0, 0, 0, 0, 0, S - pk.s)) if S > pk.s else dy
    dy = dy.contiguous()
    d_states, d_init = pass_states(pk, dy, pk.C, dfinal, io, reverse=True, xt=h * p, bt=pk.ct, backward=True)  # dS_c
    sid, prev, keep = pk.bookkeeping(dy)
    dx = torch.empty(b, S, h, p, device=x.device, dtype=x.dtype)
    ddt = torch.empty(b, S, h, device=x.device, dtype=torch.float32)
    dcb = torch.empty(b, nc, h, chunk, chunk, device=x.device, dtype=io)
    da = torch.empty(b, nc, h, device=x.device, dtype=torch.float32)
    dd = torch.empty_like(da) if D is not None else da
    # One program per (chunk, head): a loop over a group's heads sharing C·Bᵀ, as the forward's output
    # kernel has, made this kernel slower (1.14 against 0.99 ms on an H200 at 16K × 80 heads; the
    # dB/dC kernel below keeps its loop): benchmarks/results/ssd-head-loops-h200.json.
    segs = (entering.per, entering.segments)  # both passings cut the rows alike
    _chunk_bwd_dx[(b * nc * h,)](
        pk.x,
        pk.dt,
        pk.A,
        pk.B,
        pk.C,
        D if D is not None else pk.A,
        *entering.args(),
        *d_states.args(),
        dy,
        sid,
        prev,
        keep,
        dx,
        ddt,
        dcb,
        da,
        dd,
        S,
        h,
        g,
        p,
        n,
        pk.xt,
        pk.bt,
        pk.ct,
        *segs,
        HAS_D=D is not None,
        HAS_SID=pk.sid is not None,
        SEGMENTED=entering.segmented,
        L=chunk,
        BP=pk.bp,
        BN=pk.bn,
        num_warps=warps or BWD_WARPS,
        num_stages=BWD_STAGES,
    )
    hpg = h // g
    bn, n_blocks = launch.state_blocks(n)
    splits = launch.bwd_splits(b * nc, h, g, n, split_target)
    db = torch.empty(b, S, g * splits, n, device=x.device, dtype=torch.float32)
    dc = torch.empty_like(db)
    _chunk_bwd_dbc[(b * nc * g * splits * n_blocks,)](
        pk.x,
        pk.dt,
        pk.A,
        pk.B,
        pk.C,
        *entering.args(),
        *d_states.args(),
        dy,
        sid,
        prev,
        dcb,
        db,
        dc,
        S,
        h,
        g,
        p,
        n,
        pk.xt,
        pk.bt,
        pk.ct,
        *segs,
        HPP=hpg // splits,
        HAS_SID=pk.sid is not None,
        SEGMENTED=entering.segmented,
        L=chunk,
        BP=pk.bp,
        BN=bn,
        num_warps=dbc_warps or BWD_DBC_WARPS,
        num_stages=BWD_STAGES,
    )
    s = pk.s
    db = db.view(b, S, g, splits, n).sum(3)[:, :s].to(B.dtype)
    dc = dc.view(b, S, g, splits, n).sum(3)[:, :s].to(C.dtype)
    return (
        dx[:, :s],
        ddt[:, :s].to(dt.dtype),
        da.sum((0, 1)).to(A.dtype),
        db,
        dc,
        dd.sum((0, 1)).to(D.dtype) if D is not None else None,
        d_init.to(initial_state.dtype) if initial_state is not None else None,
    )

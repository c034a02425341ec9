"""Mamba-2 chunked SSD scan, backward (Triton). Three steps, mirroring the forward:

1. the gradient each chunk's outputs send to the state entering it, dE_c = Σ_i exp(cum_i) dy_i ⊗ C_i
   (the forward's chunk-state kernel, run on dy and C);
2. the state recurrence run backwards: with G_c the total gradient of E_c (G_nc = d final),
   dS_c = G_{c+1} and G_c = dE_c + exp(Σ a over c) · keep_c · G_{c+1}; G_0 is the initial state's gradient;
3. one program per (chunk, group of heads) for everything inside a chunk: dx, dB, dC, ddt, and the
   per-chunk partial sums of dA and dD.

The chunk states are recomputed here, not saved by the forward. Reference for every gradient:
autograd through meshplan.kernels.reference.ssd_chunked_ref (tests/test_ssd_kernel.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from meshplan.kernels.ssd import PASS_BLOCK, chunk_decay_sums, chunk_states, entering_states, prepare


@triton.jit
def _state_passing_bwd(enter_ptr, d_ptr, asum_ptr, keep_ptr, dfinal_ptr, dinit_ptr, dasum_ptr, NC, H, PN,
                       HAS_DFINAL: tl.constexpr, BLOCK: tl.constexpr):
    """d_ptr holds dE_c on entry and dS_c = G_{c+1} on exit; dasum_ptr (b, nc, h, blocks) gets
    Σ_k G_{c+1} · exp(asum_c) · keep_c · E_c over this program's block of state elements."""
    pid_b, pid_h, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_blocks = tl.num_programs(2)
    k = pid_k * BLOCK + tl.arange(0, BLOCK)
    km = k < PN
    if HAS_DFINAL:
        gr = tl.load(dfinal_ptr + (pid_b * H + pid_h) * PN + k, mask=km, other=0.0).to(tl.float32)
    else:
        gr = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(NC):
        c = NC - 1 - r
        base = ((pid_b * NC + c) * H + pid_h) * PN
        factor = tl.exp(tl.load(asum_ptr + (pid_b * NC + c) * H + pid_h)) * tl.load(keep_ptr + pid_b * NC + c)
        e = tl.load(enter_ptr + base + k, mask=km, other=0.0)
        direct = tl.load(d_ptr + base + k, mask=km, other=0.0)
        tl.store(d_ptr + base + k, gr, mask=km)
        tl.store(dasum_ptr + ((pid_b * NC + c) * H + pid_h) * n_blocks + pid_k, factor * tl.sum(gr * e, axis=0))
        gr = direct + factor * gr
    tl.store(dinit_ptr + (pid_b * H + pid_h) * PN + k, gr, mask=km)


@triton.jit
def _chunk_bwd(x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, enter_ptr, ds_ptr, dy_ptr, sid_ptr, prev_ptr, dasum_ptr,
               dx_ptr, ddt_ptr, db_ptr, dc_ptr, da_ptr, dd_ptr, S, H, G, P, N, HPP: tl.constexpr,
               HAS_D: tl.constexpr, HAS_SID: tl.constexpr, L: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr):
    """Grid (batch · chunk, group · split): HPP heads of one B/C group. With M_ij = (C_i·B_j)
    exp(cum_i − cum_j) dt_j [same sequence, j ≤ i] and w_j = exp(cum_last − cum_j) dt_j [last sequence]:
    y_i = Σ_j M_ij x_j + reach_i exp(cum_i) C_i·E + D x_i and S = Σ_j w_j x_j ⊗ B_j."""
    pid_bc, pid_gs = tl.program_id(0), tl.program_id(1)
    n_chunks = S // L
    bi, ci = pid_bc // n_chunks, pid_bc % n_chunks
    splits = tl.num_programs(1) // G
    g = pid_gs // splits
    t = ci * L + tl.arange(0, L)
    n = tl.arange(0, BN)
    nm = n < N
    bc_offs = ((bi * S + t[:, None]) * G + g) * N + n[None, :]
    bv = tl.load(b_ptr + bc_offs, mask=nm[None, :], other=0.0).to(tl.float32)
    cv = tl.load(c_ptr + bc_offs, mask=nm[None, :], other=0.0).to(tl.float32)
    cb = tl.dot(cv, tl.trans(bv))  # (L, L): C_i · B_j
    i = tl.arange(0, L)
    pair = i[:, None] >= i[None, :]
    if HAS_SID:
        sid = tl.load(sid_ptr + bi * S + t)
        pair = pair & (sid[:, None] == sid[None, :])
        enters = sid == tl.load(prev_ptr + bi * n_chunks + ci)
        own = sid == tl.max(sid, axis=0)
    db_acc = tl.zeros((L, BN), dtype=tl.float32)
    dc_acc = tl.zeros((L, BN), dtype=tl.float32)
    for k in range(HPP):
        h = g * (H // G) + (pid_gs % splits) * HPP + k
        a_h = tl.load(a_ptr + h).to(tl.float32)
        dt = tl.load(dt_ptr + (bi * S + t) * H + h).to(tl.float32)
        cum = tl.cumsum(dt * a_h, axis=0)
        last = tl.sum(dt * a_h, axis=0)
        decay = tl.exp(tl.where(pair, cum[:, None] - cum[None, :], -float("inf")))
        m_nodt = cb * decay
        m = m_nodt * dt[None, :]
        reach = tl.exp(cum)
        w_nodt = tl.exp(last - cum)
        if HAS_SID:
            reach = tl.where(enters, reach, 0.0)
            w_nodt = tl.where(own, w_nodt, 0.0)
        w = w_nodt * dt
        dm = tl.zeros((L, L), dtype=tl.float32)  # dy_i · x_j
        dw = tl.zeros((L,), dtype=tl.float32)
        dcum = tl.zeros((L,), dtype=tl.float32)
        dd = 0.0
        st_base = ((bi * n_chunks + ci) * H + h) * P
        for p0 in range(0, P, BP):
            p = p0 + tl.arange(0, BP)
            pm = p < P
            tok_offs = ((bi * S + t[:, None]) * H + h) * P + p[None, :]
            x = tl.load(x_ptr + tok_offs, mask=pm[None, :], other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + tok_offs, mask=pm[None, :], other=0.0).to(tl.float32)
            st_offs = (st_base + p[:, None]) * N + n[None, :]
            st_mask = pm[:, None] & nm[None, :]
            e = tl.load(enter_ptr + st_offs, mask=st_mask, other=0.0)  # (BP, BN)
            ds = tl.load(ds_ptr + st_offs, mask=st_mask, other=0.0)
            bds = tl.dot(bv, tl.trans(ds))  # (L, BP): Σ_n B_j[n] dS[p, n]
            dx = tl.dot(tl.trans(m), dy) + w[:, None] * bds
            if HAS_D:
                d_h = tl.load(d_ptr + h).to(tl.float32)
                dx += d_h * dy
                dd += tl.sum(tl.sum(dy * x, axis=1), axis=0)
            tl.store(dx_ptr + tok_offs, dx.to(dx_ptr.dtype.element_ty), mask=pm[None, :])
            dm += tl.dot(dy, tl.trans(x))
            dc_acc += reach[:, None] * tl.dot(dy, e)
            db_acc += w[:, None] * tl.dot(x, ds)
            dw += tl.sum(x * bds, axis=1)
            dcum += tl.sum(dy * tl.dot(cv, tl.trans(e)), axis=1)
        dcb = dm * decay * dt[None, :]
        dc_acc += tl.dot(dcb, bv)
        db_acc += tl.dot(tl.trans(dcb), cv)
        q = dm * m  # the gradient of log M_ij
        ddt = tl.sum(dm * m_nodt, axis=0) + dw * w_nodt
        dcum = dcum * reach + tl.sum(q, axis=1) - tl.sum(q, axis=0) - dw * w
        dlast = tl.sum(dw * w, axis=0) + tl.load(dasum_ptr + (bi * n_chunks + ci) * H + h)
        # cum_i = Σ_{k ≤ i} a_k and last = Σ_k a_k, so da_k = Σ_{i ≥ k} dcum_i + dlast.
        da = tl.sum(dcum, axis=0) - tl.cumsum(dcum, axis=0) + dcum + dlast
        ddt += da * a_h
        tl.store(ddt_ptr + (bi * S + t) * H + h, ddt)
        tl.store(da_ptr + (bi * n_chunks + ci) * H + h, tl.sum(da * dt, axis=0))
        if HAS_D:
            tl.store(dd_ptr + (bi * n_chunks + ci) * H + h, dd)
    out_offs = ((bi * S + t[:, None]) * tl.num_programs(1) + pid_gs) * N + n[None, :]
    tl.store(db_ptr + out_offs, db_acc, mask=nm[None, :])
    tl.store(dc_ptr + out_offs, dc_acc, mask=nm[None, :])


# Programs to aim for in the chunk backward: a few waves over an H200's 132 SMs.
SPLIT_TARGET = 1024


def head_splits(heads_per_group: int, programs: int, target: int | None = None) -> int:
    """How many programs share one group's heads: enough programs to fill the GPU (`target`), each
    split a whole number of heads. More splits mean more per-split dB/dC partial sums to add."""
    target = SPLIT_TARGET if target is None else target
    best = 1
    for s in range(1, heads_per_group + 1):
        if heads_per_group % s == 0:
            best = s
            if programs * s >= target:
                break
    return best


def ssd_backward(dy, dfinal, x, dt, A, B, C, D, initial_state, seq_idx, chunk: int, bp: int):
    """Gradients of (x, dt, A, B, C, D, initial_state) (None where the input is None)."""
    pk = prepare(x, dt, A, B, C, seq_idx, chunk, bp)
    b, S, h, p, g, n, nc = pk.shape
    entering, _ = entering_states(pk, initial_state)
    dy = torch.nn.functional.pad(dy, (0, 0, 0, 0, 0, S - pk.s)) if S > pk.s else dy
    dy = dy.contiguous()
    d_states = chunk_states(pk, dy, pk.C, to_entry=True)  # dE_c, turned into dS_c below
    n_blocks = triton.cdiv(p * n, PASS_BLOCK)
    dasum = torch.empty(b, nc, h, n_blocks, device=x.device, dtype=torch.float32)
    d_init = torch.empty(b, h, p, n, device=x.device, dtype=torch.float32)
    _state_passing_bwd[(b, h, n_blocks)](entering, d_states, chunk_decay_sums(pk), pk.keep,
                                         dfinal.contiguous() if dfinal is not None else d_init, d_init, dasum, nc, h,
                                         p * n, HAS_DFINAL=dfinal is not None, BLOCK=PASS_BLOCK)
    hpg = h // g
    splits = head_splits(hpg, b * nc * g)
    dx = torch.empty_like(pk.x)
    ddt = torch.empty(b, S, h, device=x.device, dtype=torch.float32)
    db = torch.empty(b, S, g * splits, n, device=x.device, dtype=torch.float32)
    dc = torch.empty_like(db)
    da = torch.empty(b, nc, h, device=x.device, dtype=torch.float32)
    dd = torch.empty_like(da) if D is not None else da
    sid = pk.sid if pk.sid is not None else x
    prev = pk.prev if pk.prev is not None else x
    _chunk_bwd[(b * nc, g * splits)](pk.x, pk.dt, pk.A, pk.B, pk.C, D if D is not None else pk.A, entering,
                                     d_states, dy, sid, prev, dasum.sum(-1).contiguous(), dx, ddt, db, dc, da, dd, S,
                                     h, g, p, n, HPP=hpg // splits, HAS_D=D is not None, HAS_SID=pk.sid is not None,
                                     L=chunk, BP=pk.bp, BN=pk.bn, num_warps=8)
    s = pk.s
    db = db.view(b, S, g, splits, n).sum(3)[:, :s].to(B.dtype)
    dc = dc.view(b, S, g, splits, n).sum(3)[:, :s].to(C.dtype)
    return (dx[:, :s], ddt[:, :s].to(dt.dtype), da.sum((0, 1)).to(A.dtype), db, dc,
            dd.sum((0, 1)).to(D.dtype) if D is not None else None,
            d_init.to(initial_state.dtype) if initial_state is not None else None)

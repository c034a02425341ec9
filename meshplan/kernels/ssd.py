"""Mamba-2 chunked SSD scan, forward (Triton): the decomposition of Dao & Gu 2024 (§6) in three
kernels — each chunk's own final state, the recurrence of states across chunks, and each chunk's
outputs (the attention-like intra-chunk term plus what the entering state contributes).

Same contract as meshplan.kernels.reference.ssd_chunked_ref, seq_idx included (no state crosses a
packed-sequence boundary): x (b, s, h, p), dt (b, s, h) after softplus, A (h,), B, C (b, s, g, n), D (h,).
Returns y like x and the final state (b, h, p, n) fp32. Forward only: the executor's Mamba-2 core
runs its forward without grad and recomputes with the reference in backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _chunk_tile(S, H, G, L: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr):
    """Grid (batch · chunk, head, headdim block) → batch, chunk, head, its B/C group, chunk count,
    and the token, headdim and state index vectors of this program's tile."""
    pid_bc, pid_h, pid_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_chunks = S // L
    t = (pid_bc % n_chunks) * L + tl.arange(0, L)
    return (pid_bc // n_chunks, pid_bc % n_chunks, pid_h, pid_h // (H // G), n_chunks, t,
            pid_p * BP + tl.arange(0, BP), tl.arange(0, BN))


@triton.jit
def _chunk_state(x_ptr, dt_ptr, a_ptr, b_ptr, sid_ptr, st_ptr, S, H, G, P, N, HAS_SID: tl.constexpr,
                 L: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr):
    """states[b, c, h] (P × N) = Σ_l exp(cum_last − cum_l) · dt_l · x_l ⊗ B_l over the chunk's tokens
    (with seq_idx: only those of the chunk's last sequence)."""
    bi, ci, pid_h, g, n_chunks, t, p, n = _chunk_tile(S, H, G, L, BP, BN)
    dt = tl.load(dt_ptr + (bi * S + t) * H + pid_h).to(tl.float32)
    a = dt * tl.load(a_ptr + pid_h).to(tl.float32)
    cum = tl.cumsum(a, axis=0)
    last = tl.sum(a, axis=0)
    w = tl.exp(last - cum) * dt  # (L,)
    if HAS_SID:
        sid = tl.load(sid_ptr + bi * S + t)
        w = tl.where(sid == tl.max(sid, axis=0), w, 0.0)  # seq_idx rises along a row: the max is the last
    x = tl.load(x_ptr + ((bi * S + t[:, None]) * H + pid_h) * P + p[None, :], mask=p[None, :] < P, other=0.0)
    bv = tl.load(b_ptr + ((bi * S + t[:, None]) * G + g) * N + n[None, :], mask=n[None, :] < N, other=0.0)
    xw = (x.to(tl.float32) * w[:, None])
    st = tl.dot(tl.trans(xw), bv.to(tl.float32))  # (BP, BN)
    offs = (((bi * n_chunks + ci) * H + pid_h) * P + p[:, None]) * N + n[None, :]
    tl.store(st_ptr + offs, st, mask=(p[:, None] < P) & (n[None, :] < N))


@triton.jit
def _state_passing(st_ptr, asum_ptr, keep_ptr, init_ptr, enter_ptr, final_ptr, NC, H, PN, HAS_INIT: tl.constexpr,
                   BLOCK: tl.constexpr):
    """entering[c] = state before chunk c; entering[c + 1] = states[c] + exp(Σ a over c) · entering[c]."""
    pid_b, pid_h, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k = pid_k * BLOCK + tl.arange(0, BLOCK)
    km = k < PN
    if HAS_INIT:
        e = tl.load(init_ptr + (pid_b * H + pid_h) * PN + k, mask=km, other=0.0).to(tl.float32)
    else:
        e = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in range(NC):
        base = ((pid_b * NC + c) * H + pid_h) * PN
        tl.store(enter_ptr + base + k, e, mask=km)
        decay = tl.exp(tl.load(asum_ptr + (pid_b * NC + c) * H + pid_h))
        keep = tl.load(keep_ptr + pid_b * NC + c)  # 0 where a sequence boundary falls before the chunk's end
        e = tl.load(st_ptr + base + k, mask=km, other=0.0) + decay * e * keep
    tl.store(final_ptr + (pid_b * H + pid_h) * PN + k, e, mask=km)


@triton.jit
def _chunk_scan(x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, enter_ptr, sid_ptr, prev_ptr, y_ptr, S, H, G, P, N,
                HAS_D: tl.constexpr, HAS_SID: tl.constexpr, L: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr):
    """y_i = Σ_{j ≤ i} (C_i · B_j) exp(cum_i − cum_j) dt_j x_j + exp(cum_i) C_i · entering + D x_i."""
    bi, ci, pid_h, g, n_chunks, t, p, n = _chunk_tile(S, H, G, L, BP, BN)
    pm, nm = p < P, n < N
    dt = tl.load(dt_ptr + (bi * S + t) * H + pid_h).to(tl.float32)
    cum = tl.cumsum(dt * tl.load(a_ptr + pid_h).to(tl.float32), axis=0)
    cv = tl.load(c_ptr + ((bi * S + t[:, None]) * G + g) * N + n[None, :], mask=nm[None, :], other=0.0).to(tl.float32)
    bv = tl.load(b_ptr + ((bi * S + t[:, None]) * G + g) * N + n[None, :], mask=nm[None, :], other=0.0).to(tl.float32)
    x = tl.load(x_ptr + ((bi * S + t[:, None]) * H + pid_h) * P + p[None, :], mask=pm[None, :], other=0.0)
    scores = tl.dot(cv, tl.trans(bv))  # (L, L)
    i = tl.arange(0, L)
    causal = i[:, None] >= i[None, :]
    decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], -float("inf")))
    scores = scores * decay * dt[None, :]
    reach = tl.exp(cum)
    if HAS_SID:
        sid = tl.load(sid_ptr + bi * S + t)
        scores = tl.where(sid[:, None] == sid[None, :], scores, 0.0)  # no pair across a boundary
        reach = tl.where(sid == tl.load(prev_ptr + bi * n_chunks + ci), reach, 0.0)  # the entering state's own sequence
    y = tl.dot(scores, x.to(tl.float32))  # (L, BP)
    e_offs = (((bi * n_chunks + ci) * H + pid_h) * P + p[None, :]) * N + n[:, None]  # (BN, BP): entering^T
    e = tl.load(enter_ptr + e_offs, mask=nm[:, None] & pm[None, :], other=0.0)
    y += tl.dot(cv * reach[:, None], e)
    if HAS_D:
        y += tl.load(d_ptr + pid_h).to(tl.float32) * x.to(tl.float32)
    tl.store(y_ptr + ((bi * S + t[:, None]) * H + pid_h) * P + p[None, :], y.to(y_ptr.dtype.element_ty),
             mask=pm[None, :])


def ssd_chunked(x, dt, A, B, C, D=None, initial_state=None, chunk: int = 64, bp: int = 32, seq_idx=None):
    b, s, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    pad = (-s) % chunk
    if pad:  # dt = 0 on padding: no decay, no input
        x, dt, B, C = (F.pad(t, (0,) * (2 * (t.dim() - 2)) + (0, pad)) for t in (x, dt, B, C))
    S = s + pad
    nc = S // chunk
    if seq_idx is not None:  # padding joins the last sequence; per chunk: whom the carried state belongs to
        sid = seq_idx.to(torch.int32)
        if pad:
            sid = torch.cat([sid, sid[:, -1:].expand(b, pad)], dim=1)
        sid = sid.contiguous()
        ends = sid.view(b, nc, chunk)[:, :, -1]
        prev = torch.cat([sid[:, :1], ends[:, :-1]], dim=1).contiguous()  # sequence of the state entering chunk c
        keep = (ends == prev).float().contiguous()
    else:
        sid = prev = x
        keep = torch.ones(b, nc, device=x.device)
    x, dt, B, C = x.contiguous(), dt.contiguous(), B.contiguous(), C.contiguous()
    A = A.float().contiguous()
    bn = max(16, triton.next_power_of_2(n))
    bp = min(bp, max(16, triton.next_power_of_2(p)))
    states = torch.empty(b, nc, h, p, n, device=x.device, dtype=torch.float32)
    grid = (b * nc, h, triton.cdiv(p, bp))
    _chunk_state[grid](x, dt, A, B, sid, states, S, h, g, p, n, HAS_SID=seq_idx is not None, L=chunk, BP=bp, BN=bn)
    asum = (dt.float() * A).view(b, nc, chunk, h).sum(2).contiguous()  # (b, nc, h)
    entering = torch.empty_like(states)
    final = torch.empty(b, h, p, n, device=x.device, dtype=torch.float32)
    init = initial_state.float().contiguous() if initial_state is not None else final
    block = 256
    _state_passing[(b, h, triton.cdiv(p * n, block))](states, asum, keep, init, entering, final, nc, h, p * n,
                                                      HAS_INIT=initial_state is not None, BLOCK=block)
    y = torch.empty(b, S, h, p, device=x.device, dtype=x.dtype)
    _chunk_scan[grid](x, dt, A, B, C, D if D is not None else A, entering, sid, prev, y, S, h, g, p, n,
                      HAS_D=D is not None, HAS_SID=seq_idx is not None, L=chunk, BP=bp, BN=bn)
    return y[:, :s], final

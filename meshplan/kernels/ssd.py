"""Mamba-2 chunked SSD scan, forward (Triton): the decomposition of Dao & Gu 2024 (§6) in three
kernels — each chunk's own final state, the recurrence of states across chunks, and each chunk's
outputs (the attention-like intra-chunk term plus what the entering state contributes).

Same contract as meshplan.kernels.reference.ssd_chunked_ref, seq_idx included (no state crosses a
packed-sequence boundary): x (b, s, h, p), dt (b, s, h) after softplus, A (h,), B, C (b, s, g, n), D (h,).
Returns y like x and the final state (b, h, p, n) fp32. Differentiable in every input and the
initial state: the backward (meshplan.kernels.ssd_bwd) recomputes the chunk states rather than saving
them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from meshplan.kernels import launch


@triton.jit
def grid_ids(n1, n2):
    """A program's (outer, middle, inner) indices on a one-axis grid of outer · n1 · n2 programs, the
    inner varying fastest. The chunk-state, passing and backward chunk kernels put the chunk (or
    batch) outermost, so that the programs resident at one time work on the same tokens' heads
    (neighbouring addresses) rather than on one head's strips of many chunks far apart: on an H200
    the chunk-state kernel went from 71% to 75% of the copy roofline, the dB/dC kernel from 56% to
    57%, and the backward from 2.80 to 2.76 ms at 16K × 80 heads
    (benchmarks/results/ssd-grid-order-h200.json). One axis also has room for 2^31 programs."""
    pid = tl.program_id(0)
    return pid // (n1 * n2), (pid // n2) % n1, pid % n2


@triton.jit
def _chunk_tile(S, H, G, P, L: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr):
    """Grid (batch · chunk · head · headdim block,) → batch, chunk, head, its B/C group, chunk count,
    and the token, headdim and state index vectors of this program's tile."""
    pid_bc, pid_h, pid_p = grid_ids(H, tl.cdiv(P, BP))
    n_chunks = S // L
    t = (pid_bc % n_chunks) * L + tl.arange(0, L)
    # The batch index is int64 so that every offset built on it is: at long context (s · conv channels,
    # or chunks · heads · state) they pass 2^31.
    return ((pid_bc // n_chunks).to(tl.int64), pid_bc % n_chunks, pid_h, pid_h // (H // G), n_chunks, t,
            pid_p * BP + tl.arange(0, BP), tl.arange(0, BN))


@triton.jit
def _chunk_state(x_ptr, dt_ptr, a_ptr, b_ptr, sid_ptr, prev_ptr, st_ptr, asum_ptr, S, H, G, P, N, XT, BT,
                 HAS_SID: tl.constexpr, TO_ENTRY: tl.constexpr, WRITE_ASUM: tl.constexpr, L: tl.constexpr,
                 BP: tl.constexpr, BN: tl.constexpr):
    """states[b, c, h] (P × N) = Σ_l exp(cum_last − cum_l) · dt_l · x_l ⊗ B_l over the chunk's tokens
    (with seq_idx: only those of the chunk's last sequence). WRITE_ASUM: also Σ_l dt_l·A, the log of the
    chunk's decay, to asum[b, c, h] (from the first headdim block's program).

    TO_ENTRY (the backward's use, x ← dy and B ← C): Σ_l exp(cum_l) · dy_l ⊗ C_l over the tokens the
    entering state reaches — the gradient of the chunk's outputs with respect to that state."""
    bi, ci, pid_h, g, n_chunks, t, p, n = _chunk_tile(S, H, G, P, L, BP, BN)
    dt = tl.load(dt_ptr + (bi * S + t) * H + pid_h).to(tl.float32)
    a = dt * tl.load(a_ptr + pid_h).to(tl.float32)
    cum = tl.cumsum(a, axis=0)
    if WRITE_ASUM:
        one = tl.arange(0, 1)
        total = tl.zeros((1,), dtype=tl.float32) + tl.sum(a, axis=0)
        tl.store(asum_ptr + (bi * n_chunks + ci) * H + pid_h + one, total, mask=one + tl.min(p, axis=0) == 0)
    if TO_ENTRY:
        w = tl.exp(cum)
    else:
        w = tl.exp(tl.sum(a, axis=0) - cum) * dt  # (L,)
    if HAS_SID:
        sid = tl.load(sid_ptr + bi * S + t)
        if TO_ENTRY:
            w = tl.where(sid == tl.load(prev_ptr + bi * n_chunks + ci), w, 0.0)
        else:
            w = tl.where(sid == tl.max(sid, axis=0), w, 0.0)  # seq_idx rises along a row: the max is the last
    x = tl.load(x_ptr + (bi * S + t[:, None]) * XT + pid_h * P + p[None, :], mask=p[None, :] < P, other=0.0)
    bv = tl.load(b_ptr + (bi * S + t[:, None]) * BT + g * N + n[None, :], mask=n[None, :] < N, other=0.0)
    # The weights go onto B, rounded to x's dtype, so that the product runs on the inputs' dtype
    # (bf16 tensor cores, fp32 sums) — as mamba_ssm's chunk-state kernel does.
    bw = (bv.to(tl.float32) * w[:, None]).to(x.dtype)
    st = tl.dot(tl.trans(x), bw)  # (BP, BN)
    offs = (((bi * n_chunks + ci) * H + pid_h) * P + p[:, None]) * N + n[None, :]
    tl.store(st_ptr + offs, st, mask=(p[:, None] < P) & (n[None, :] < N))


@triton.jit
def _passing_start(start_ptr, H, PN, HAS_START: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (batch · head · state block,) of the sequential state passings, forward and backward: batch
    (int64, for offsets past 2^31), head, this program's state elements and their mask, and the
    carried vector it starts from (the given one at start_ptr, or zeros)."""
    pid_b, pid_h, pid_k = grid_ids(H, tl.cdiv(PN, BLOCK))
    pid_b = pid_b.to(tl.int64)
    k = pid_k * BLOCK + tl.arange(0, BLOCK)
    km = k < PN
    if HAS_START:
        carried = tl.load(start_ptr + (pid_b * H + pid_h) * PN + k, mask=km, other=0.0).to(tl.float32)
    else:
        carried = tl.zeros((BLOCK,), dtype=tl.float32)
    return pid_b, pid_h, k, km, carried


@triton.jit
def _state_passing(st_ptr, asum_ptr, keep_ptr, init_ptr, enter_ptr, final_ptr, NC, H, PN, HAS_INIT: tl.constexpr,
                   HAS_KEEP: tl.constexpr, BLOCK: tl.constexpr):
    """entering[c] = state before chunk c; entering[c + 1] = states[c] + exp(Σ a over c) · entering[c]."""
    pid_b, pid_h, k, km, e = _passing_start(init_ptr, H, PN, HAS_INIT, BLOCK)
    for c in range(NC):
        base = ((pid_b * NC + c) * H + pid_h) * PN
        # The chunk's loads come before the store: a load after a store waits for it (the pointers
        # might alias), and then each step's load latency would be paid in turn. 0.334 → 0.279 ms on an
        # H200 at 16K × 80 heads, bit-equal; loading the next chunk a step ahead as well was slower
        # (benchmarks/results/ssd-passing-order-ab-h200.json).
        own = tl.load(st_ptr + base + k, mask=km, other=0.0)
        decay = tl.exp(tl.load(asum_ptr + (pid_b * NC + c) * H + pid_h))
        if HAS_KEEP:  # 0 where a sequence boundary falls before the chunk's end
            decay = decay * tl.load(keep_ptr + pid_b * NC + c)
        tl.store(enter_ptr + base + k, e.to(enter_ptr.dtype.element_ty), mask=km)
        e = own + decay * e
    tl.store(final_ptr + (pid_b * H + pid_h) * PN + k, e, mask=km)


@triton.jit
def _chunk_scan(x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, enter_ptr, sid_ptr, prev_ptr, y_ptr, S, H, G, P, N, XT, BT, CT,
                HPP: tl.constexpr, HAS_D: tl.constexpr, HAS_SID: tl.constexpr, L: tl.constexpr, BP: tl.constexpr,
                BN: tl.constexpr, STAGES: tl.constexpr):
    """y_i = Σ_{j ≤ i} (C_i · B_j) exp(cum_i − cum_j) dt_j x_j + exp(cum_i) C_i · entering + D x_i.

    Grid (batch · chunk, group · split, headdim block): each program takes HPP heads of one B/C group
    in turn, so that it loads the chunk's B and C and forms C·Bᵀ once for them all, and the next
    head's loads overlap this one's products (a pipelined loop). Unlike the other chunk kernels, the
    chunk varies fastest here: with the head outermost the kernel ran at 73% of the copy roofline
    against 76% (benchmarks/results/ssd-grid-order-h200.json)."""
    pid_bc, pid_gs, pid_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    splits = H // G // HPP
    n_chunks = S // L
    bi, ci = (pid_bc // n_chunks).to(tl.int64), pid_bc % n_chunks  # int64: offsets pass 2^31 at long context
    g = pid_gs // splits
    t = ci * L + tl.arange(0, L)
    p, n = pid_p * BP + tl.arange(0, BP), tl.arange(0, BN)
    pm, nm = p < P, n < N
    cv = tl.load(c_ptr + (bi * S + t[:, None]) * CT + g * N + n[None, :], mask=nm[None, :], other=0.0)
    bv = tl.load(b_ptr + (bi * S + t[:, None]) * BT + g * N + n[None, :], mask=nm[None, :], other=0.0)
    cb = tl.dot(cv, tl.trans(bv))  # (L, L), fp32 sums of the inputs' products; the same for every head
    i = tl.arange(0, L)
    pair = i[:, None] >= i[None, :]
    if HAS_SID:
        sid = tl.load(sid_ptr + bi * S + t)
        pair = pair & (sid[:, None] == sid[None, :])  # no pair across a boundary
        own = sid == tl.load(prev_ptr + bi * n_chunks + ci)  # tokens the entering state reaches
    for k in tl.range(0, HPP, num_stages=STAGES):
        h = g * (H // G) + (pid_gs % splits) * HPP + k
        dt = tl.load(dt_ptr + (bi * S + t) * H + h).to(tl.float32)
        cum = tl.cumsum(dt * tl.load(a_ptr + h).to(tl.float32), axis=0)
        x = tl.load(x_ptr + (bi * S + t[:, None]) * XT + h * P + p[None, :], mask=pm[None, :], other=0.0)
        e_offs = (((bi * n_chunks + ci) * H + h) * P + p[None, :]) * N + n[:, None]  # (BN, BP): entering^T
        e = tl.load(enter_ptr + e_offs, mask=nm[:, None] & pm[None, :], other=0.0)
        scores = cb * tl.exp(tl.where(pair, cum[:, None] - cum[None, :], -float("inf"))) * dt[None, :]
        reach = tl.exp(cum)
        if HAS_SID:
            reach = tl.where(own, reach, 0.0)
        # Both products run on the inputs' dtype (the scores and the entering states rounded to it, as
        # mamba_ssm's chunk-scan kernel does), with fp32 sums; reach scales C_i's row after the product.
        y = tl.dot(scores.to(x.dtype), x)  # (L, BP)
        y += tl.dot(cv, e.to(cv.dtype)) * reach[:, None]
        if HAS_D:
            y += tl.load(d_ptr + h).to(tl.float32) * x.to(tl.float32)
        tl.store(y_ptr + ((bi * S + t[:, None]) * H + h) * P + p[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=pm[None, :])


class Packing(NamedTuple):
    """The padded, contiguous inputs and the per-chunk sequence bookkeeping both passes use."""
    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    sid: torch.Tensor | None  # (b, S) int32, padding joined to each row's last sequence
    prev: torch.Tensor | None  # (b, nc): the sequence of the state entering chunk c
    keep: torch.Tensor | None  # (b, nc) float: 0 where a boundary falls before chunk c's end (with seq_idx)
    s: int  # unpadded length
    xt: int  # token strides of x, B and C (each token's heads × dim block is contiguous)
    bt: int
    ct: int
    chunk: int
    bn: int
    bp: int

    def bookkeeping(self, stand_in: torch.Tensor):
        """sid, prev and keep as the kernels take them: without seq_idx, `stand_in` takes their place
        (the kernels do not read it then)."""
        return tuple(t if t is not None else stand_in for t in (self.sid, self.prev, self.keep))

    @property
    def shape(self):  # b, S, h, p, g, n, nc
        b, S, h, p = self.x.shape
        return b, S, h, p, self.B.shape[2], self.B.shape[3], S // self.chunk


def prepare(x, dt, A, B, C, seq_idx, chunk: int, bp: int) -> Packing:
    b, s, h, p = x.shape
    pad = (-s) % chunk
    if pad:  # dt = 0 on padding: no decay, no input
        x, dt, B, C = (F.pad(t, (0,) * (2 * (t.dim() - 2)) + (0, pad)) for t in (x, dt, B, C))
    S = s + pad
    nc = S // chunk
    sid = prev = keep = None
    if seq_idx is not None:  # padding joins the last sequence; per chunk: whom the carried state belongs to
        sid = seq_idx.to(torch.int32)
        if pad:
            sid = torch.cat([sid, sid[:, -1:].expand(b, pad)], dim=1)
        sid = sid.contiguous()
        ends = sid.view(b, nc, chunk)[:, :, -1]
        prev = torch.cat([sid[:, :1], ends[:, :-1]], dim=1).contiguous()
        keep = (ends == prev).float().contiguous()
    n = B.shape[3]
    (x, xt), (B, bt), (C, ct) = (launch.token_rows(t) for t in (x, B, C))
    return Packing(x, dt.contiguous(), A.float().contiguous(), B, C, sid, prev, keep, s, xt, bt, ct, chunk,
                   max(16, triton.next_power_of_2(n)), min(bp, max(16, triton.next_power_of_2(p))))


def chunk_states(pk: Packing, x, b_or_c, to_entry: bool = False, xt: int | None = None,
                 bt: int | None = None, asum: torch.Tensor | None = None) -> torch.Tensor:
    """(b, nc, h, p, n) fp32: each chunk's own final state — or, with to_entry, Σ exp(cum) dy ⊗ C
    (token strides default to the packing's x and B); with `asum` (b, nc, h) fp32, each chunk's
    Σ dt·A written there too."""
    b, S, h, p, g, n, nc = pk.shape
    out = torch.empty(b, nc, h, p, n, device=x.device, dtype=torch.float32)
    sid, prev, _ = pk.bookkeeping(x)
    bp = min(STATE_HEADDIM_BLOCK, max(16, triton.next_power_of_2(p)))  # its own: the backward's pk.bp is smaller
    _chunk_state[(b * nc * h * triton.cdiv(p, bp),)](x, pk.dt, pk.A, b_or_c, sid, prev, out,
                                                  asum if asum is not None else out, S, h, g, p, n,
                                                  xt or pk.xt, bt or pk.bt, HAS_SID=pk.sid is not None,
                                                  TO_ENTRY=to_entry, WRITE_ASUM=asum is not None, L=pk.chunk,
                                                  BP=bp, BN=pk.bn, num_warps=STATE_WARPS)
    return out


PASS_BLOCK = 256  # state elements per program of the (sequential over chunks) state-passing kernels
# Forward launch settings — headdim block and warps of the output kernel — the fastest of 12 on an H200
# at 16K × 80 heads of 64, swept when the kernel took one head per program (1.09 ms; 1.33 ms at a
# block of 32, 1.53 ms with 8 warps):
# benchmarks/results/ssd-fwd-tune-h200.json, `python benchmarks/bench_ssd.py --tune-forward`.
FWD_HEADDIM_BLOCK, FWD_WARPS = 64, 4
# The output kernel's programs (meshplan.kernels.launch.SPLIT_TARGET) and its pipelined head loop's
# stages: on an H200 at the shape above the loop took the kernel from 0.32 to 0.27 ms, and 3 stages
# took the forward from 0.97 to 0.91 ms (targets of 132 to 4096 programs within 6% of each other):
# benchmarks/results/ssd-head-loops-h200.json.
FWD_STAGES = 3
# The chunk-state kernel's headdim block and warps, forward and backward (the backward ran it with its
# own headdim block of 16 at first: 0.50 ms per call against 0.28 ms at 64, on an H200 at the shape
# above: ssd-bf16-forward-h200.json against ssd-bf16-operands-h200.json in benchmarks/results; its
# warps: ssd-fwd-tune-h200.json, 2 to 8 within 3%).
STATE_HEADDIM_BLOCK, STATE_WARPS = 64, 4


def entering_states(pk: Packing, initial_state, dtype=torch.float32):
    """The state entering each chunk (b, nc, h, p, n) in `dtype`, the final state (b, h, p, n) fp32,
    and each chunk's Σ dt·A (b, nc, h) fp32, the log of its decay. The passing carries fp32 whatever
    `dtype` is: the forward rounds only what its output kernel reads (to the inputs' dtype, as
    mamba_ssm's forward does); the backward keeps fp32."""
    b, S, h, p, g, n, nc = pk.shape
    asum = torch.empty(b, nc, h, device=pk.x.device, dtype=torch.float32)
    states = chunk_states(pk, pk.x, pk.B, asum=asum)
    entering = torch.empty_like(states, dtype=dtype)
    final = torch.empty(b, h, p, n, device=pk.x.device, dtype=torch.float32)
    init = initial_state.float().contiguous() if initial_state is not None else final
    _state_passing[(b * h * triton.cdiv(p * n, PASS_BLOCK),)](states, asum, pk.bookkeeping(asum)[2],
                                                           init, entering, final, nc, h, p * n,
                                                           HAS_INIT=initial_state is not None,
                                                           HAS_KEEP=pk.keep is not None, BLOCK=PASS_BLOCK)
    return entering, final, asum


def ssd_forward(x, dt, A, B, C, D=None, initial_state=None, chunk: int = 64, bp: int | None = None, seq_idx=None,
                split_target: int | None = None):
    pk = prepare(x, dt, A, B, C, seq_idx, chunk, bp or FWD_HEADDIM_BLOCK)
    b, S, h, p, g, n, nc = pk.shape
    entering, final, _ = entering_states(pk, initial_state, pk.x.dtype)
    y = torch.empty(b, S, h, p, device=x.device, dtype=x.dtype)
    sid, prev, _ = pk.bookkeeping(x)
    p_blocks = triton.cdiv(p, pk.bp)
    splits = launch.head_splits(h // g, b * nc * g * p_blocks, split_target)
    _chunk_scan[(b * nc, g * splits, p_blocks)](pk.x, pk.dt, pk.A, pk.B, pk.C, D if D is not None else pk.A,
                                                entering, sid, prev, y, S, h, g, p, n, pk.xt, pk.bt, pk.ct,
                                                HPP=h // g // splits, HAS_D=D is not None,
                                                HAS_SID=pk.sid is not None, L=chunk, BP=pk.bp, BN=pk.bn,
                                                STAGES=FWD_STAGES, num_warps=FWD_WARPS)
    return y[:, :pk.s], final


class SSDChunkedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, initial_state, seq_idx, chunk, bp):
        y, final = ssd_forward(x, dt, A, B, C, D, initial_state, chunk, bp, seq_idx)
        ctx.save_for_backward(x, dt, A, B, C, D, initial_state, seq_idx)
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        from meshplan.kernels.ssd_bwd import ssd_backward

        x, dt, A, B, C, D, initial_state, seq_idx = ctx.saved_tensors
        if dy is None:  # only the final state was used (a sequence shard's summary)
            dy = torch.zeros_like(x)
        grads = ssd_backward(dy, dfinal, x, dt, A, B, C, D, initial_state, seq_idx, ctx.chunk)
        return (*grads, None, None, None)


def ssd_chunked(x, dt, A, B, C, D=None, initial_state=None, chunk: int = 64, bp: int | None = None, seq_idx=None):
    """The chunked scan; differentiable (Triton backward) when any input requires grad."""
    return SSDChunkedFn.apply(x, dt, A, B, C, D, initial_state, seq_idx, chunk, bp)

"""Mamba-2 chunked SSD scan, forward (Triton): the decomposition of Dao & Gu 2024 (§6) in two
kernels — each chunk's own final state and the recurrence of states across chunks in one sequential
pass, then each chunk's outputs (the attention-like intra-chunk term plus what the entering state
contributes).

Same contract as meshplan.kernels.reference.ssd_chunked_ref, seq_idx included (no state crosses a
packed-sequence boundary): x (b, s, h, p), dt (b, s, h) after softplus, A (h,), B, C (b, s, g, n), D (h,).
Returns y like x and the final state (b, h, p, n) fp32. Differentiable in every input and the
initial state: the backward (meshplan.kernels.ssd_bwd) recomputes the chunk states rather than saving
them; meshplan.kernels.ssd_combined joins the two under autograd.
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
    inner varying fastest. The passings and the backward chunk kernels put the batch (or chunk)
    outermost, so that the programs resident at one time work on the same tokens' heads (neighbouring
    addresses) rather than on one head's strips of many chunks far apart: on an H200 the chunk-state
    kernel the passing later absorbed went from 71% to 75% of the copy roofline, the dB/dC kernel from
    56% to 57%, and the backward from 2.80 to 2.76 ms at 16K × 80 heads
    (benchmarks/results/ssd-grid-order-h200.json). One axis also has room for 2^31 programs."""
    pid = tl.program_id(0)
    return pid // (n1 * n2), (pid // n2) % n1, pid % n2


@triton.jit
def _chunk_weights_kernel(
    dt_ptr,
    a_ptr,
    sid_ptr,
    prev_ptr,
    keep_ptr,
    w_ptr,
    decay_ptr,
    S,
    H,
    HAS_SID: tl.constexpr,
    REVERSE: tl.constexpr,
    L: tl.constexpr,
    BH: tl.constexpr,
):
    """Grid (batch · chunk, head block): the per-token weights and per-chunk decay a state passing
    takes (see _pass_chunks), for BH heads of one chunk — w (b, S, h) fp32 and decay (b, nc, h) fp32."""
    pid_bc, pid_h = tl.program_id(0), tl.program_id(1)
    NC = S // L
    bi, c = (pid_bc // NC).to(tl.int64), pid_bc % NC
    i = tl.arange(0, L)
    hh = pid_h * BH + tl.arange(0, BH)
    hm = hh < H
    row0 = bi * S + c * L
    offs = i[:, None] * H + hh[None, :]
    dt = tl.load(dt_ptr + row0 * H + offs, mask=hm[None, :], other=0.0).to(tl.float32)
    a = dt * tl.load(a_ptr + hh, mask=hm, other=0.0)[None, :]
    cum = tl.cumsum(a, axis=0)
    total = tl.sum(a, axis=0)
    if REVERSE:
        w = tl.exp(cum)
    else:
        w = tl.exp(total[None, :] - cum) * dt
    decay = tl.exp(total)
    if HAS_SID:
        sid = tl.load(sid_ptr + row0 + i)
        if REVERSE:  # the tokens the entering state reaches
            w = tl.where((sid == tl.load(prev_ptr + bi * NC + c))[:, None], w, 0.0)
        else:  # the chunk's last sequence (seq_idx rises along a row: the max is the last)
            w = tl.where((sid == tl.max(sid, axis=0))[:, None], w, 0.0)
        decay = decay * tl.load(keep_ptr + bi * NC + c)
    tl.store(w_ptr + row0 * H + offs, w, mask=hm[None, :])
    tl.store(decay_ptr + (bi * NC + c) * H + hh, decay, mask=hm)


@triton.jit
def _pass_chunks(
    x_ptr,
    w_ptr,
    decay_ptr,
    b_ptr,
    start_ptr,
    out_ptr,
    end_ptr,
    delta_ptr,
    span_ptr,
    S,
    H,
    G,
    P,
    N,
    XT,
    BT,
    K,
    NSEG,
    HAS_START: tl.constexpr,
    REVERSE: tl.constexpr,
    SEGMENTED: tl.constexpr,
    L: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    STAGES: tl.constexpr,
):
    """The chunk states and their recurrence in one loop over a row's chunks, for one (BP, BN) tile of
    one head's state; the carried state stays in registers (fp32) and only what the chunk kernels read
    is stored. Forward (REVERSE False): out[c] = E_c, the state entering chunk c, and
    E_{c+1} = Σ_l w_l x_l ⊗ B_l + decay_c E_c with w_l = exp(cum_last − cum_l) dt_l on the chunk's last
    sequence (0 elsewhere). Backward (REVERSE True, x ← dy, B ← C, chunks in reverse): out[c] = dS_c =
    G_{c+1} and G_c = Σ_l w_l dy_l ⊗ C_l + decay_c G_{c+1} with w_l = exp(cum_l) on the tokens the
    entering state reaches. decay_c = exp(Σ dt·A over c), times keep_c with seq_idx. The weights and
    decays come from _chunk_weights_kernel. `start` (E_0, or the final state's gradient) is read when
    given; the carried state after the last chunk goes to `end` (fp32).

    Each step waits on the one before only through the carried state, but a program runs its steps in
    turn, and its warps are busy issuing (with the weights formed in the loop, an instruction every 4.9
    cycles, DRAM at 36%: ncu on an H200, ncu-state-passing-h200.txt). A row of 256 chunks took 0.32 ms
    at 16K × 80 heads with the weights formed in the loop, against 0.55 ms for the chunk-state kernel
    and the passing this replaces (fp32 states written and read back); with the weights formed
    beforehand, 0.28 ms (0.24 → 0.17 at 40 heads). Two chunks a step, both products formed before the
    recurrence takes them, ran no faster (0.32-0.46 ms); benchmarks/results/ssd-fused-passing-ab-h200.json,
    ssd-pass-pairs-ab-h200.json, ssd-pass-weights-ab-h200.json.

    SEGMENTED: the row's chunks, in marching order, are cut into NSEG segments of K (the grid's outer
    index is row · NSEG + segment), each passed from a zero state. Then `out` holds each chunk's state
    from its segment's own tokens, `end` each segment's last carried state (b, NSEG, h, p, n) fp32,
    `delta` (b, nc, h) the decay from the segment's start to each chunk (the product of the decays
    the carried state took before it was stored) and `span` (b, NSEG, h) the whole segment's decay:
    the true state is out[c] + delta[c] · (the state entering c's segment), which _join_segments and
    the chunk kernels' state_tile put together. `start` is then the join's to read."""
    n_blocks = tl.cdiv(N, BN)
    pid_b, h, pid_t = grid_ids(H, tl.cdiv(P, BP) * n_blocks)
    pid_b = pid_b.to(tl.int64)  # offsets pass 2^31 at long context
    p = (pid_t // n_blocks) * BP + tl.arange(0, BP)
    n = (pid_t % n_blocks) * BN + tl.arange(0, BN)
    g = h // (H // G)
    NC = S // L
    lo, hi = 0, NC
    if SEGMENTED:
        seg = pid_b % NSEG
        pid_b = pid_b // NSEG
        lo = seg * K
        hi = tl.minimum(lo + K, NC)
    i = tl.arange(0, L)
    st_offs = p[:, None] * N + n[None, :]
    st_mask = (p[:, None] < P) & (n[None, :] < N)
    if HAS_START and not SEGMENTED:
        carried = tl.load(start_ptr + (pid_b * H + h) * P * N + st_offs, mask=st_mask, other=0.0).to(tl.float32)
    else:
        carried = tl.zeros((BP, BN), dtype=tl.float32)
    run = 1.0  # the decays since the segment's start
    for r in tl.range(lo, hi, num_stages=STAGES):
        if REVERSE:
            c = NC - 1 - r
        else:
            c = r
        row0 = pid_b * S + c * L
        w = tl.load(w_ptr + row0 * H + h + i * H)
        decay = tl.load(decay_ptr + (pid_b * NC + c) * H + h)
        bv = tl.load(b_ptr + row0 * BT + g * N + (i[:, None] * BT + n[None, :]), mask=n[None, :] < N, other=0.0)
        # The product runs on the inputs' dtype (bf16 tensor cores, fp32 sums), the weights rounded with
        # one operand — as mamba_ssm's chunk-state kernel does.
        if REVERSE:
            # dy read transposed and weighted in registers, the product's A operand; C goes to it from
            # shared memory as loaded: 0.279 → 0.240 ms at 16K × 80 heads, 2.15 → 1.91 ms at 128K on an
            # H200, where the forward gained nothing (benchmarks/results/ssd-pass-v2-ab-h200.json).
            xt = tl.load(x_ptr + row0 * XT + h * P + (i[None, :] * XT + p[:, None]), mask=p[:, None] < P, other=0.0)
            own = tl.dot((xt.to(tl.float32) * w[None, :]).to(xt.dtype), bv)  # (BP, BN)
        else:
            x = tl.load(x_ptr + row0 * XT + h * P + (i[:, None] * XT + p[None, :]), mask=p[None, :] < P, other=0.0)
            own = tl.dot(tl.trans(x), (bv.to(tl.float32) * w[:, None]).to(x.dtype))  # (BP, BN)
        # The state's offset in int64 (pid_b is): chunks · heads · P · N passes 2^31 from 512K tokens at 80
        # heads, and an int32 c · H · P · N wrapped there.
        tl.store(
            out_ptr + ((pid_b * NC + c) * H + h) * P * N + st_offs, carried.to(out_ptr.dtype.element_ty), mask=st_mask
        )
        carried = own + decay * carried
        if SEGMENTED:
            tl.store(delta_ptr + (pid_b * NC + c) * H + h, run, mask=pid_t == 0)
            run = run * decay
    if SEGMENTED:
        tl.store(end_ptr + ((pid_b * NSEG + seg) * H + h) * P * N + st_offs, carried, mask=st_mask)
        tl.store(span_ptr + (pid_b * NSEG + seg) * H + h, run, mask=pid_t == 0)
    else:
        tl.store(end_ptr + (pid_b * H + h) * P * N + st_offs, carried, mask=st_mask)


@triton.jit
def _join_segments(
    end_ptr, span_ptr, start_ptr, starts_ptr, final_ptr, H, PN, NSEG, HAS_START: tl.constexpr, BLOCK: tl.constexpr
):
    """Grid (batch · head, state block): the state entering each segment of a segmented passing
    (see _pass_chunks), S_0 = start (or 0) and S_{k+1} = end_k + span_k · S_k, stored in `starts` (b,
    NSEG, h, p, n) in its dtype; the last, S_NSEG, is the passing's end (fp32)."""
    bh, pid = tl.program_id(0).to(tl.int64), tl.program_id(1)
    b, h = bh // H, bh % H
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < PN
    if HAS_START:
        carried = tl.load(start_ptr + bh * PN + offs, mask=m, other=0.0).to(tl.float32)
    else:
        carried = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in range(NSEG):
        at = ((b * NSEG + k) * H + h) * PN
        tl.store(starts_ptr + at + offs, carried.to(starts_ptr.dtype.element_ty), mask=m)
        carried = tl.load(end_ptr + at + offs, mask=m, other=0.0) + tl.load(span_ptr + (b * NSEG + k) * H + h) * carried
    tl.store(final_ptr + bh * PN + offs, carried, mask=m)


@triton.jit
def state_tile(
    ptrs, mask, starts_ptr, delta_ptr, bc, h, offs, H, PN, NC, K, NSEG, REVERSE: tl.constexpr, SEGMENTED: tl.constexpr
):
    """A tile of the state a passing left for chunk `bc` (row · chunks + chunk, int64) and head h, at
    `ptrs` (the caller's addresses into the passing's output; `offs`, the same tile's offsets within
    one (p, n) state): as stored, or — from a segmented passing — its segment's part plus the decayed
    state entering the segment (see _pass_chunks), in the stored dtype."""
    t = tl.load(ptrs, mask=mask, other=0.0)
    if SEGMENTED:
        delta, s = segment_start(starts_ptr, delta_ptr, bc, h, offs, mask, H, PN, NC, K, NSEG, REVERSE)
        t = t + delta.to(s.dtype) * s
    return t


@triton.jit
def segment_start(starts_ptr, delta_ptr, bc, h, offs, mask, H, PN, NC, K, NSEG, REVERSE: tl.constexpr):
    """(the decay from chunk `bc`'s segment start to it, fp32; the tile at `offs` of the state entering
    that segment) from a segmented passing: the chunk's state is its stored part plus their product."""
    c = bc % NC
    if REVERSE:
        c = NC - 1 - c
    at = ((bc // NC * NSEG + c // K) * H + h) * PN
    return tl.load(delta_ptr + bc * H + h), tl.load(starts_ptr + at + offs, mask=mask, other=0.0)


# The two directions as kernels of their own names, so that the profiler tells them apart.
@triton.jit
def _state_passing(
    x_ptr,
    w_ptr,
    decay_ptr,
    b_ptr,
    start_ptr,
    out_ptr,
    end_ptr,
    delta_ptr,
    span_ptr,
    S,
    H,
    G,
    P,
    N,
    XT,
    BT,
    K,
    NSEG,
    HAS_START: tl.constexpr,
    SEGMENTED: tl.constexpr,
    L: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    STAGES: tl.constexpr,
):
    _pass_chunks(
        x_ptr,
        w_ptr,
        decay_ptr,
        b_ptr,
        start_ptr,
        out_ptr,
        end_ptr,
        delta_ptr,
        span_ptr,
        S,
        H,
        G,
        P,
        N,
        XT,
        BT,
        K,
        NSEG,
        HAS_START,
        False,
        SEGMENTED,
        L,
        BP,
        BN,
        STAGES,
    )


@triton.jit
def _state_passing_bwd(
    x_ptr,
    w_ptr,
    decay_ptr,
    b_ptr,
    start_ptr,
    out_ptr,
    end_ptr,
    delta_ptr,
    span_ptr,
    S,
    H,
    G,
    P,
    N,
    XT,
    BT,
    K,
    NSEG,
    HAS_START: tl.constexpr,
    SEGMENTED: tl.constexpr,
    L: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    STAGES: tl.constexpr,
):
    _pass_chunks(
        x_ptr,
        w_ptr,
        decay_ptr,
        b_ptr,
        start_ptr,
        out_ptr,
        end_ptr,
        delta_ptr,
        span_ptr,
        S,
        H,
        G,
        P,
        N,
        XT,
        BT,
        K,
        NSEG,
        HAS_START,
        True,
        SEGMENTED,
        L,
        BP,
        BN,
        STAGES,
    )


@triton.jit
def _chunk_scan(
    x_ptr,
    dt_ptr,
    a_ptr,
    b_ptr,
    c_ptr,
    d_ptr,
    enter_ptr,
    starts_ptr,
    delta_ptr,
    sid_ptr,
    prev_ptr,
    y_ptr,
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
    HAS_D: tl.constexpr,
    HAS_SID: tl.constexpr,
    SEGMENTED: tl.constexpr,
    L: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    STAGES: tl.constexpr,
):
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
        e = state_tile(
            enter_ptr + e_offs,
            nm[:, None] & pm[None, :],
            starts_ptr,
            delta_ptr,
            bi * n_chunks + ci,
            h,
            p[None, :] * N + n[:, None],
            H,
            P * N,
            n_chunks,
            K,
            NSEG,
            False,
            SEGMENTED,
        )
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
        tl.store(
            y_ptr + ((bi * S + t[:, None]) * H + h) * P + p[None, :], y.to(y_ptr.dtype.element_ty), mask=pm[None, :]
        )


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
    return Packing(
        x,
        dt.contiguous(),
        A.float().contiguous(),
        B,
        C,
        sid,
        prev,
        keep,
        s,
        xt,
        bt,
        ct,
        chunk,
        max(16, triton.next_power_of_2(n)),
        min(bp, max(16, triton.next_power_of_2(p))),
    )


# Warps and pipeline stages of the state passings (_pass_chunks); their tile: meshplan.kernels.launch.pass_tile
# (the sweep behind all three: benchmarks/results/ssd-pass-tune-h200.json).
PASS_WARPS, PASS_STAGES = 4, 4
WEIGHTS_HEAD_BLOCK = 32  # heads per program of the weights kernel (a chunk's dt rows read across heads)


class Passed(NamedTuple):
    """What a state passing leaves for the chunk kernels (see _pass_chunks): each chunk's state as
    stored, and — from a segmented passing (segments > 1) — the state entering each segment and each
    chunk's decay since its segment's start, which state_tile adds. Unsegmented, `starts` and `delta`
    are stand-ins the kernels do not read."""

    out: torch.Tensor
    starts: torch.Tensor
    delta: torch.Tensor
    per: int  # chunks a segment
    segments: int

    def args(self):
        return self.out, self.starts, self.delta

    @property
    def segmented(self) -> bool:
        return self.segments > 1


# Elements of a state each program of _join_segments takes.
JOIN_BLOCK = 1024


def pass_states(
    pk: Packing,
    x,
    b_or_c,
    start,
    out_dtype,
    reverse: bool = False,
    xt: int | None = None,
    bt: int | None = None,
    backward: bool = False,
):
    """(passed, end): the chunks' states passed along each row (meshplan.kernels.ssd._pass_chunks) —
    forward, the state entering each chunk (b, nc, h, p, n) in `out_dtype` and the final state (b, h, p,
    n) fp32 from x and B; reverse (x ← dy, B ← C), each chunk's dS and the initial state's gradient.
    `start`: the initial state, or the final state's gradient (None: zeros). Token strides default to
    the packing's x and B. Where the rows, heads and state tiles give too few programs, each row passes
    in segments (meshplan.kernels.launch.pass_segments) and a short join carries the state across them:
    `passed` then leaves the last step to the chunk kernels (Passed, state_tile); `backward`: one of the
    backward's passings (cut by their own threshold)."""
    b, S, h, p, g, n, nc = pk.shape
    out = torch.empty(b, nc, h, p, n, device=x.device, dtype=out_dtype)
    end = torch.empty(b, h, p, n, device=x.device, dtype=torch.float32)
    w = torch.empty(b, S, h, device=x.device, dtype=torch.float32)
    decay = torch.empty(b, nc, h, device=x.device, dtype=torch.float32)
    sid, prev, keep = pk.bookkeeping(x)
    bh = min(WEIGHTS_HEAD_BLOCK, triton.next_power_of_2(h))
    _chunk_weights_kernel[(b * nc, triton.cdiv(h, bh))](
        pk.dt, pk.A, sid, prev, keep, w, decay, S, h, HAS_SID=pk.sid is not None, REVERSE=reverse, L=pk.chunk, BH=bh
    )
    bp, bn = launch.pass_tile(p, n)
    segments, per = launch.pass_segments(b, h, p, n, nc, backward)
    start = start.float().contiguous() if start is not None else None
    if segments > 1:
        seg_end = torch.empty(b, segments, h, p, n, device=x.device, dtype=torch.float32)
        span = torch.empty(b, segments, h, device=x.device, dtype=torch.float32)
        delta = torch.empty(b, nc, h, device=x.device, dtype=torch.float32)
    else:
        seg_end, span, delta = end, decay, decay
    kernel = _state_passing_bwd if reverse else _state_passing
    kernel[(b * segments * h * triton.cdiv(p, bp) * triton.cdiv(n, bn),)](
        x,
        w,
        decay,
        b_or_c,
        start if start is not None else end,
        out,
        seg_end,
        delta,
        span,
        S,
        h,
        g,
        p,
        n,
        xt or pk.xt,
        bt or pk.bt,
        per,
        segments,
        HAS_START=start is not None,
        SEGMENTED=segments > 1,
        L=pk.chunk,
        BP=bp,
        BN=bn,
        STAGES=PASS_STAGES,
        num_warps=PASS_WARPS,
    )
    if segments == 1:
        return Passed(out, out, decay, per, 1), end
    starts = torch.empty(b, segments, h, p, n, device=x.device, dtype=out_dtype)
    _join_segments[(b * h, triton.cdiv(p * n, JOIN_BLOCK))](
        seg_end,
        span,
        start if start is not None else end,
        starts,
        end,
        h,
        p * n,
        segments,
        HAS_START=start is not None,
        BLOCK=JOIN_BLOCK,
    )
    return Passed(out, starts, delta, per, segments), end


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


def ssd_forward(
    x,
    dt,
    A,
    B,
    C,
    D=None,
    initial_state=None,
    chunk: int = 64,
    bp: int | None = None,
    seq_idx=None,
    split_target: int | None = None,
):
    pk = prepare(x, dt, A, B, C, seq_idx, chunk, bp or FWD_HEADDIM_BLOCK)
    b, S, h, p, g, n, nc = pk.shape
    # The output kernel reads the entering states in the inputs' dtype, as mamba_ssm's does; the
    # passing carries fp32.
    entering, final = pass_states(pk, pk.x, pk.B, initial_state, pk.x.dtype)
    y = torch.empty(b, S, h, p, device=x.device, dtype=x.dtype)
    sid, prev, _ = pk.bookkeeping(x)
    p_blocks = triton.cdiv(p, pk.bp)
    splits = launch.head_splits(h // g, b * nc * g * p_blocks, split_target)
    _chunk_scan[(b * nc, g * splits, p_blocks)](
        pk.x,
        pk.dt,
        pk.A,
        pk.B,
        pk.C,
        D if D is not None else pk.A,
        *entering.args(),
        sid,
        prev,
        y,
        S,
        h,
        g,
        p,
        n,
        pk.xt,
        pk.bt,
        pk.ct,
        entering.per,
        entering.segments,
        HPP=h // g // splits,
        HAS_D=D is not None,
        HAS_SID=pk.sid is not None,
        SEGMENTED=entering.segmented,
        L=chunk,
        BP=pk.bp,
        BN=pk.bn,
        STAGES=FWD_STAGES,
        num_warps=FWD_WARPS,
    )
    return y[:, : pk.s], final

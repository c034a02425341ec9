"""A Mamba-2 block on a tensor axis (TP-SSM), a sequence axis (SP), or both.

TP-SSM (Dutt et al., arXiv 2602.21144): in_proj is split segment by segment (z, x, B, C, dt each by
rank), so conv1d and the scan stay local; out_proj is row-parallel and its output all-reduced once.
B/C groups are split when T divides ngroups; with one group (the mamba2-* presets) every rank keeps
B and C, their gradients are all-reduced, and the gated RMSNorm, whose group then spans the ranks,
all-reduces its sum of squares.
SP: each rank holds s/Σ contiguous tokens; the conv's last d_conv − 1 inputs go to the next rank.
Each shard scans once from a zero state; one all-gather shares every shard's final state and total
decay, from which each builds the state entering it and corrects its outputs (the recurrence is
linear in its entering state), so no shard waits for another's scan and none scans twice
(Mamba2SeqShardFn); backward reduce-scatters the summaries' gradients.
Twin of meshplan/costmodel/axes/tp.py (tpssm) and sp.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from meshplan.executor.blocks import (
    Mamba2Block,
    Mamba2CoreFn,
    _conv_scan_inputs,
    _scan,
    _scan_grads,
    cat_last,
    gated_norm,
)
from meshplan.executor.comm import (
    AllReduceBoth,
    CopyToAxis,
    Mesh,
    QuantizedReduceFromAxis,
    ReduceFromAxis,
    all_gather,
    all_reduce,
    broadcast,
    exchange,
    reduce_scatter,
)
from meshplan.executor.layouts.common import Sublayer
from meshplan.executor.layouts.splits import mamba2_splits
from meshplan.kernels.reference import acc, entering_state_ref

TAG_TAIL = 2
# Decode's conv step as one Triton launch with the window shifted in place (3.7× faster than the
# torch ops on the GPU at batch 8: benchmarks/results/conv1d-h200.json "decode"), or the torch ops.
TRITON_DECODE_CONV = True


class _ShiftTail(torch.autograd.Function):
    """Forward: this rank's last d_conv − 1 conv inputs go to the next rank; returns the previous
    rank's (zeros on the first). Backward: the gradient goes back the other way."""

    @staticmethod
    def forward(ctx, tail, mesh, axis):
        ax = mesh.axis(axis)
        ctx.mesh, ctx.axis = mesh, axis
        nxt = ax.rank + 1 if ax.rank + 1 < ax.size else None
        prv = ax.rank - 1 if ax.rank > 0 else None
        got = exchange(mesh, axis, tail, nxt, tail, prv, TAG_TAIL)
        return torch.zeros_like(tail) if got is None else got

    @staticmethod
    def backward(ctx, grad):
        mesh, axis = ctx.mesh, ctx.axis
        ax = mesh.axis(axis)
        prv = ax.rank - 1 if ax.rank > 0 else None
        nxt = ax.rank + 1 if ax.rank + 1 < ax.size else None
        got = exchange(mesh, axis, grad, prv, grad, nxt, TAG_TAIL)
        return (torch.zeros_like(grad) if got is None else got), None, None


class _SpanningGatedNorm:
    """Mamba-2's gated RMSNorm when its one group spans the tensor axis: the sum of squares is all-reduced."""

    def __init__(self, mesh: Mesh, axis: str, group_size: int, eps: float = 1e-5):
        self.mesh, self.axis, self.group_size, self.eps = mesh, axis, group_size, eps

    def __call__(self, y, z, weight):
        if y.is_cuda:  # Triton kernels; the per-row statistics (sum of squares, backward's dot) all-reduced
            from meshplan.kernels.gated_norm import gated_rmsnorm_triton

            return gated_rmsnorm_triton(
                y,
                z,
                weight,
                self.group_size,
                self.eps,
                local=y.shape[-1],
                reduce=lambda t: all_reduce(self.mesh, t, self.axis),
            )
        h = acc(y) * F.silu(acc(z))
        ss = AllReduceBoth.apply(h.pow(2).sum(-1, keepdim=True), self.mesh, self.axis)
        return (h * torch.rsqrt(ss / self.group_size + self.eps) * acc(weight)).to(y.dtype)


def _entering(gathered: torch.Tensor, rank: int, state_shape, decay_shape) -> torch.Tensor:
    """The SSM state entering shard `rank` from every shard's zero-start summary — row q of `gathered`
    holds shard q's final state then its log decay Σ_t dt_t·A: E_r = Σ_{q<r} exp(Σ_{q<k<r} log decay_k)
    · final_q. Every row enters (weight 0 from `rank` on), so the gradient reaches every row."""
    n = gathered.shape[0]
    numel = torch.Size(state_shape).numel()
    finals = gathered[:, :numel].view(n, *state_shape)
    decay = gathered[:, numel:].view(n, *decay_shape)  # (Σ, b, h); −inf where a shard passes no state on
    # Σ_{q<k<r} as sums from the rank down (suffix sums of rows 1..r−1), not as differences of one
    # cumulative sum, which a −inf row would turn into NaN.
    inner = decay[1:rank]
    log_w = (
        torch.cat(
            [inner.flip(0).cumsum(0).flip(0), torch.zeros_like(decay[:1]), torch.full_like(decay[rank:], -float("inf"))]
        )
        if rank
        else torch.full_like(decay, -float("inf"))
    )
    return torch.einsum("qbh,qbhpn->bhpn", torch.exp(log_w), finals)


def _finish_shard(y0, C, dt, A, z, E, final0, norm_w, out_w, dims, norm, docs=None):
    """A sequence shard's output from its zero-start scan y0 and the state E entering it: the scan is
    linear in its entering state, so y_t = y0_t + exp(cum_t) · C_t·E (cum_t = Σ_{k≤t} dt_k·A, per head)
    and the state leaving it is final0 + exp(cum_last)·E. C·E takes C's dtype — bf16 on the GPU, as the
    Triton scan's entering states are stored — and y y0's. Then the gated norm and out_proj. With packed
    documents (`docs`), E reaches only the tokens of the document that continues into the shard: the
    others' cum_t is −inf."""
    d_inner, ngroups = dims[:2]
    b, s = y0.shape[:2]
    # (b, s, h), fp32, summed along the tokens with them innermost: torch's cumsum over a middle
    # dimension took 1.4 ms for 8K tokens × 80 heads on an H200, more than the scan it replaces
    # (benchmarks/results/validation-h200-run39-x2-mamba2-sp-one-scan.json, `tensor_kernel_scan_outer_dim`).
    cum_hs = torch.cumsum((dt * A).transpose(1, 2).contiguous(), dim=-1)
    if docs is not None:
        cum_hs = cum_hs.masked_fill(~docs.keep[:, None, :], -float("inf"))
    cum = cum_hs.transpose(1, 2)
    if y0.is_cuda:  # Triton: y0 read and y written once (meshplan/kernels/shard_state.py)
        from meshplan.kernels.shard_state import EnteringStateFn

        y = EnteringStateFn.apply(y0, C, cum_hs, E)
    else:
        y = entering_state_ref(y0, C, cum, E)
    final = final0 + torch.exp(cum[:, -1])[..., None, None] * E
    y = y.reshape(b, s, d_inner)
    y = norm(y, z, norm_w) if norm is not None else gated_norm(y, z, norm_w, d_inner // ngroups)
    return F.linear(y, out_w), final


@dataclass
class ShardDocs:
    """Packed documents on one contiguous sequence shard: its tokens' document ids `seq_idx` (b, t), those
    of the previous shard's last d_conv − 1 conv inputs `tail_idx` (−1: none), `keep` (b, t): the tokens
    the state entering the shard reaches (the document that continues into it), and `breaks` (b,): no
    state passes through the shard (a document starts in it, or at its first token)."""

    seq_idx: torch.Tensor
    tail_idx: torch.Tensor
    keep: torch.Tensor
    breaks: torch.Tensor

    @classmethod
    def of(cls, packed: torch.Tensor | None, index: int, t: int, d_conv: int) -> "ShardDocs | None":
        """Shard `index` of length t of the whole sequence's document ids `packed` (b, s); None without."""
        if packed is None:
            return None
        start = index * t
        local = packed[:, start : start + t]
        k = d_conv - 1
        tail = packed[:, max(start - k, 0) : start]
        tail = torch.cat([tail.new_full((tail.shape[0], k - tail.shape[1]), -1), tail], 1)
        if start == 0:
            keep = torch.zeros_like(local, dtype=torch.bool)
        else:
            keep = local == packed[:, start - 1 : start]
        return cls(local, tail, keep, ~keep.all(1))


def _shard_decay(dt, A, docs: ShardDocs | None) -> torch.Tensor:
    """(b, h) log decay a shard applies to the state passing through it: Σ_t dt_t·A, or −inf where a
    document boundary stops the state."""
    decay = (dt * A).sum(1)
    if docs is None:
        return decay
    return decay.masked_fill(docs.breaks[:, None], -float("inf"))


def last_document_tail(tail: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """A prefill's last d_conv − 1 conv inputs, as decode continues from them: zero where they belong to
    an earlier document than the last."""
    tail = tail.clone()
    if packed is not None:
        same = packed[:, -tail.shape[1] :] == packed[:, -1:]
        tail *= same.unsqueeze(-1).to(tail.dtype)
    return tail


def seq_shard_forward(zxbcdt, conv_state, weights, dims, norm, mesh, axis, docs=None):
    """The mixer core of one sequence shard with one scan, not two: conv and the scan from a zero state
    (y0, final0, total decay); one all-gather of every shard's final state and decay; the entering
    state E (_entering); then y corrected for E (_finish_shard), gated norm, out_proj. `weights`:
    conv_w, conv_b, dt_bias, a_log, d_skip, norm_w, out_w. Returns (out, the state leaving this shard,
    E, the gathered summaries) — the last two are what seq_shard_backward needs beside the inputs.
    `docs`: packed documents on this shard (ShardDocs), or None."""
    conv_w, conv_b, dt_bias, a_log, d_skip, norm_w, out_w = weights
    seq_idx, tail_idx = (docs.seq_idx, docs.tail_idx) if docs is not None else (None, None)
    with torch.no_grad():
        (x, dt, A, B, C), z = _conv_scan_inputs(
            zxbcdt, conv_w, conv_b, dt_bias, a_log, dims, seq_idx, conv_state=conv_state, conv_state_idx=tail_idx
        )
        y0, final0 = _scan(x, dt, A, B, C, d_skip, seq_idx=seq_idx)
        flat = torch.cat([final0.flatten(), _shard_decay(dt, A, docs).flatten()]).unsqueeze(0)
        gathered = all_gather(mesh, flat, axis, 0)  # (Σ, state + decay)
        E = _entering(gathered, mesh.axis(axis).rank, final0.shape, (dt.shape[0], dt.shape[2]))
        out, final = _finish_shard(y0, C, dt, A, z, E, final0, norm_w, out_w, dims, norm, docs)
    return out, final, E, gathered


def seq_shard_backward(zx, conv_state, weights, E, gathered, grad_out, grad_final, dims, norm, mesh, axis, docs=None):
    """Gradients of seq_shard_forward's (out, final) in its inputs: (zxbcdt, conv_state, conv_w, conv_b,
    dt_bias, a_log, d_skip, norm_w, out_w). The scan forward once more (its output as data only); the
    gradient of E, through _entering, gives every shard's final state and decay a gradient, which one
    reduce-scatter sums onto its owner; then one scan backward takes both its output's gradient and
    its final state's."""
    conv_w, conv_b, dt_bias, a_log, d_skip, norm_w, out_w = weights
    ax = mesh.axis(axis)
    inputs = [t.detach().requires_grad_(True) for t in (zx, conv_state, conv_w, conv_b, dt_bias, a_log)]
    seq_idx, tail_idx = (docs.seq_idx, docs.tail_idx) if docs is not None else (None, None)
    with torch.enable_grad():
        (x, dt, A, B, C), z, xbc = _conv_scan_inputs(
            inputs[0], *inputs[2:], dims, seq_idx, conv_state=inputs[1], conv_out=True, conv_state_idx=tail_idx
        )
        decay = _shard_decay(dt, A, docs)
    # The scan once more, outside autograd: its output y0 is only data for the correction (dropped
    # before the scan's backward, which recomputes from the inputs what it needs).
    with torch.no_grad():
        y0, final0 = _scan(x, dt, A, B, C, d_skip, seq_idx=seq_idx)
    # The correction, norm and out_proj first, on leaves: their gradients of E and of the scan's
    # outputs come before the scan's backward.
    mid = [t.detach().requires_grad_(True) for t in (y0, C, dt, A, z, final0)]
    e_leaf = E.detach().requires_grad_(True)
    w = [t.detach().requires_grad_(True) for t in (norm_w, out_w)]
    with torch.enable_grad():
        out, final = _finish_shard(*mid[:5], e_leaf, mid[5], *w, dims, norm, docs)
        outs, grads = ([out, final], [grad_out, grad_final]) if grad_final is not None else ([out], [grad_out])
        d_mid = torch.autograd.grad(outs, mid + [e_leaf] + w, grads, allow_unused=True)
    del out, final, outs, mid, y0
    dy0, dC, ddt, dA, dz, d_final_out, dE, d_norm_w, d_out_w = d_mid
    # E's gradient onto every shard's summary, summed on its owner.
    g_leaf = gathered.detach().requires_grad_(True)
    with torch.enable_grad():
        (d_gathered,) = torch.autograd.grad(_entering(g_leaf, ax.rank, E.shape, decay.shape), g_leaf, dE)
    d_mine = reduce_scatter(mesh, d_gathered.contiguous(), axis, 0)[0]
    d_final0 = d_mine[: final0.numel()].view_as(final0)
    if d_final_out is not None:
        d_final0 = d_final0 + d_final_out
    sx, sdt, sA, sB, sC, sD = _scan_grads(
        x.detach(), dt.detach(), A.detach(), B.detach(), C.detach(), d_skip, dy0, d_final0, seq_idx
    )
    del dy0, d_mid
    if dC is not None:
        sC = sC + dC
    # The conv output's gradient in one tensor, its parts dropped before the conv's backward.
    b, s = xbc.shape[:2]
    d_xbc = cat_last([g.reshape(b, s, -1) for g in (sx, sB, sC)])
    del sx, sB, sC
    pairs = [
        (xbc, d_xbc),
        (dt, sdt + ddt if ddt is not None else sdt),
        (A, sA + dA if dA is not None else sA),
        (z, dz),
        (decay, d_mine[final0.numel() :].view_as(decay)),
    ]
    pairs = [(o, g) for o, g in pairs if g is not None]
    with torch.enable_grad():
        d_in = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
    return (*d_in, sD, d_norm_w, d_out_w)


class Mamba2SeqShardFn(torch.autograd.Function):
    """seq_shard_forward under autograd: saves zxbcdt, the conv tail, the weights, E and the gathered
    summaries; backward is seq_shard_backward. Returns (out, the state leaving this shard)."""

    @staticmethod
    def forward(
        ctx,
        zxbcdt,
        conv_state,
        conv_w,
        conv_b,
        dt_bias,
        a_log,
        d_skip,
        norm_w,
        out_w,
        dims,
        norm,
        mesh,
        axis,
        docs=None,
    ):
        weights = (conv_w, conv_b, dt_bias, a_log, d_skip, norm_w, out_w)
        out, final, E, gathered = seq_shard_forward(zxbcdt, conv_state, weights, dims, norm, mesh, axis, docs)
        ctx.dims, ctx.norm, ctx.mesh, ctx.axis, ctx.docs = dims, norm, mesh, axis, docs
        ctx.save_for_backward(zxbcdt, conv_state, *weights, E, gathered)
        return out, final

    @staticmethod
    def backward(ctx, grad_out, grad_final):
        zx, conv_state, *weights, E, gathered = ctx.saved_tensors
        grads = seq_shard_backward(
            zx, conv_state, weights, E, gathered, grad_out, grad_final, ctx.dims, ctx.norm, ctx.mesh, ctx.axis, ctx.docs
        )
        return (*grads, None, None, None, None, None)


def share_last_shard_state(mesh: Mesh, axis: str, cache):
    """After a prefill over a sequence axis only the last shard holds the true SSM state and conv
    tail: (state, tail) broadcast from it to every rank of the axis."""
    ax = mesh.axis(axis)
    state, tail = (t.contiguous() for t in cache)
    broadcast(mesh, state, axis, ax.size - 1)
    broadcast(mesh, tail, axis, ax.size - 1)
    return state, tail


@torch.no_grad()
def decode_step(x, norm, in_proj, conv_w, conv_b, dt_bias, a_log, d_skip, norm_w, out_proj, dims, cache, norm_fn):
    """One new token per sequence through a Mamba-2 mixer holding `dims`' heads (all, or a tensor
    rank's): conv window and SSM state advanced from `cache` (state (b, nh, hd, ds) fp32, tail (b,
    d_conv − 1, channels)). Returns (out_proj's output before any reduction, the new cache)."""
    di_l, ng_l, ds, nh_l, hd = dims
    b = x.shape[0]
    zxbcdt = F.linear(norm(x), in_proj)[:, 0]
    z, xbc, dt = zxbcdt.split([di_l, di_l + 2 * ng_l * ds, nh_l], dim=-1)
    state, tail = cache
    if xbc.is_cuda and TRITON_DECODE_CONV:
        from meshplan.kernels.conv1d import causal_conv1d_update

        tail = tail.contiguous()
        conv = causal_conv1d_update(xbc, tail, conv_w, conv_b)
    else:
        window = torch.cat([tail, xbc.unsqueeze(1)], 1)  # (b, d_conv, channels)
        conv = F.silu(acc(window).mul(acc(conv_w).t().unsqueeze(0)).sum(1) + acc(conv_b))
        tail = window[:, 1:]
    xs, B, C = conv.split([di_l, ng_l * ds, ng_l * ds], dim=-1)
    dt = F.softplus(acc(dt) + acc(dt_bias))  # (b, nh)
    A = -torch.exp(acc(a_log))
    xs = xs.view(b, nh_l, hd)
    Bh = B.view(b, ng_l, ds).repeat_interleave(nh_l // ng_l, 1)
    Ch = C.view(b, ng_l, ds).repeat_interleave(nh_l // ng_l, 1)
    # torch ops, not meshplan.kernels.state_update: at batch 8 the Triton launch costs more than it
    # saves (2 layers: 2.46 ms against 1.98 ms per token on an H200,
    # benchmarks/results/validation-h200-run6-x1-triton.json vs run5).
    state = state * torch.exp(dt * A).view(b, nh_l, 1, 1) + (dt.view(b, nh_l, 1) * xs).unsqueeze(-1) * Bh.unsqueeze(2)
    y = (state * Ch.unsqueeze(2)).sum(-1) + acc(d_skip).view(1, nh_l, 1) * xs
    y = y.reshape(b, 1, di_l).to(x.dtype)
    if norm_fn is not None:
        y = norm_fn(y, z.unsqueeze(1), norm_w)
    else:
        y = gated_norm(y, z.unsqueeze(1), norm_w, di_l // ng_l)
    return F.linear(y, out_proj), (state, tail)


class ParallelMamba2(Sublayer):
    """A Mamba-2 layer's one sublayer, its mixer: RMSNorm → in_proj → conv1d → SSD scan → gated norm →
    out_proj, heads split over the tensor axis and tokens over the sequence axis."""

    def __init__(
        self, ref: Mamba2Block, mesh: Mesh, tensor_axis: str | None, seq_axis: str | None, int8_allreduce: bool = False
    ):
        super().__init__()
        self.reduce = QuantizedReduceFromAxis if int8_allreduce else ReduceFromAxis
        self.mesh, self.tensor_axis, self.seq_axis = mesh, tensor_axis, seq_axis
        di, ng, ds, nh, hd = ref.dims
        t = mesh.axis(tensor_axis).size if tensor_axis else 1
        r = mesh.axis(tensor_axis).rank if tensor_axis else 0
        if ng % t and ng != 1:
            raise NotImplementedError(f"TP-SSM with ngroups={ng} not divisible by {t} (only ngroups=1 replicates)")
        self.replicated_groups = ng % t != 0  # ngroups = 1 < T
        ng_l = 1 if self.replicated_groups else ng // t
        di_l, nh_l = di // t, nh // t
        self.dims = (di_l, ng_l, ds, nh_l, hd)
        self.d_conv = ref.conv_w.shape[1]
        self.take_splits(ref, mamba2_splits(di, ng, ds, nh, t), t, r)
        # Rows of in_proj / channels of conv that every tensor rank holds (B and C when ngroups = 1).
        self.bc_in_rows = slice(2 * di_l, 2 * di_l + 2 * ng_l * ds)
        self.bc_conv_rows = slice(di_l, di_l + 2 * ng_l * ds)
        self.norm_fn = _SpanningGatedNorm(mesh, tensor_axis, di) if (t > 1 and self.replicated_groups) else None
        self.keep_cache, self.ssm_cache = False, None
        self.packed = None  # (b, s) document ids of the whole sequence when documents are packed

    def replicated_grad_params(self) -> list:
        """The weights whose B/C rows every tensor rank holds (ngroups < T): their gradients are partial
        sums until sync_replicated_grads."""
        if not (self.tensor_axis and self.replicated_groups and self.mesh.axis(self.tensor_axis).size > 1):
            return []
        return [self.in_proj, self.conv_w, self.conv_b]

    def sync_replicated_grads(self) -> None:
        """All-reduce the partial gradients of the B/C weights every tensor rank holds (ngroups < T)."""
        rows = {
            id(self.in_proj): self.bc_in_rows,
            id(self.conv_w): self.bc_conv_rows,
            id(self.conv_b): self.bc_conv_rows,
        }
        for param in self.replicated_grad_params():
            sl = rows[id(param)]
            if param.grad is not None:
                part = param.grad[sl].contiguous()
                param.grad[sl] = all_reduce(self.mesh, part, self.tensor_axis)

    def forward(self, x):
        xn = self.norm(x)
        if self.tensor_axis:
            xn = CopyToAxis.apply(xn, self.mesh, self.tensor_axis)
        zxbcdt = F.linear(xn, self.in_proj)
        di_l, ng_l, ds, nh_l, hd = self.dims
        if self.seq_axis:
            xbc = zxbcdt[..., di_l : 2 * di_l + 2 * ng_l * ds]
            tail = _ShiftTail.apply(xbc[:, -(self.d_conv - 1) :, :], self.mesh, self.seq_axis)
            docs = ShardDocs.of(self.packed, self.mesh.axis(self.seq_axis).rank, x.shape[1], self.d_conv)
            out, state = Mamba2SeqShardFn.apply(
                zxbcdt,
                tail.transpose(1, 2),
                self.conv_w,
                self.conv_b,
                self.dt_bias,
                self.a_log,
                self.d_skip,
                self.norm_w,
                self.out_proj,
                self.dims,
                self.norm_fn,
                self.mesh,
                self.seq_axis,
                docs,
            )
        else:
            out, state = Mamba2CoreFn.apply(
                zxbcdt,
                None,
                None,
                self.conv_w,
                self.conv_b,
                self.dt_bias,
                self.a_log,
                self.d_skip,
                self.norm_w,
                self.out_proj,
                self.dims,
                self.norm_fn,
                self.packed,
            )
        if self.keep_cache:  # prefill: the conv tail and SSM state decode continues from
            tail = zxbcdt[:, -(self.d_conv - 1) :, di_l : 2 * di_l + 2 * ng_l * ds]
            self.ssm_cache = (state, last_document_tail(tail, self.packed))
        if self.tensor_axis:
            out = self.reduce.apply(out, self.mesh, self.tensor_axis)
        return out

    def drop_cache(self) -> None:
        self.ssm_cache = None

    def share_final_state(self) -> None:
        """After an SP prefill only the last sequence shard holds the true state: give it to all."""
        if self.seq_axis:
            self.ssm_cache = share_last_shard_state(self.mesh, self.seq_axis, self.ssm_cache)

    @torch.no_grad()
    def decode(self, x):
        """One new token per sequence: conv window and SSM state updated in place (heads split by TP)."""
        out, self.ssm_cache = decode_step(
            x,
            self.norm,
            self.in_proj,
            self.conv_w,
            self.conv_b,
            self.dt_bias,
            self.a_log,
            self.d_skip,
            self.norm_w,
            self.out_proj,
            self.dims,
            self.ssm_cache,
            self.norm_fn,
        )
        if self.tensor_axis:
            out = self.reduce.apply(out, self.mesh, self.tensor_axis)
        return out

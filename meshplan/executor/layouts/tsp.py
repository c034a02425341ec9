"""TSP on one axis D: each rank owns 1/D of every weight matrix and 1/D of the tokens (zigzag; a
contiguous shard beside Mamba-2 blocks). A dense layer's two sublayers, TSPAttention and TSPMLP
(meshplan.executor.layouts.layer.Layer puts them in order); an MoE's shared expert streamed as an MLP
(TSPSharedExpert) and its router's rows (RingRowsFn), for meshplan.executor.layouts.ep.

Attention: the packed W_Q, W_K, W_V, W_O shard of rank j is broadcast in turn; each rank computes
q, k, v of its tokens for shard j's heads (q and k normed per head where the model norms them, as
Qwen3's; then turned by the rotary, where the model has one),
all-gathers that shard's K/V, attends, and adds the shard's W_O contribution to its output — no
all-reduce. MLP (SwiGLU, or Nemotron-H's squared ReLU): the packed [W_gate; W_up] (or W_up), W_down
shards travel a send/recv ring, the next shard in flight while the GEMMs of the one in hand run.
Backward streams the shards again, re-gathers K/V, reduce-scatters dK/dV, and reduce-scatters the
weight gradients (each rank has partial gradients of every shard from its own tokens) to the owner.
Both directions gather the next shard's K/V while the current shard attends (or is differentiated).
Twin of meshplan/costmodel/axes/tsp.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshplan.executor.blocks import DenseLayer, rms_norm_rows, rms_norm_rows_grad
from meshplan.executor.comm import (
    Mesh,
    all_gather,
    all_gather_start,
    broadcast,
    reduce_scatter,
    ring_shards,
    ring_shift,
    ring_weight_grads,
)
from meshplan.executor.experts import swiglu, swiglu_grad
from meshplan.executor.layouts.common import (
    KVCache,
    Sublayer,
    ZigzagKeys,
    attend_prefix,
    attend_zigzag,
    combine_partials,
    contiguous_tokens,
    partial_attention,
    token_sum,
    zigzag_tokens,
)
from meshplan.executor.layouts.splits import attention_splits, mlp_splits


def _attend(q, k, v, attn):
    """Causal attention of this rank's queries to the gathered K/V: zigzag (common.attend_zigzag, with
    the sublayer's key order and chunk ends), or, for contiguous shards, every key up to the end of the
    rank's own (common.attend_prefix)."""
    if attn.keys is None:
        return attend_prefix(q, k, v, attn.kv_len)
    return attend_zigzag(q, k, v, attn.keys)


def _turn(attn, t, positions, inverse=False):
    """t turned by the sublayer's rotary (in place), or left as it is where the model has none (rope
    kind "none": Nemotron-H's attention has no positions)."""
    return t if attn.rotary is None else attn.rotary.apply(t, positions, inverse=inverse)


def _start_broadcast(mesh: Mesh, packed: torch.Tensor, owner: int):
    """Begin broadcasting shard `owner`: from this rank's own packed weights if it is the owner (which
    the broadcast only reads), else into a buffer of their size."""
    w = packed.detach() if owner == mesh.axis("tsp").rank else torch.empty_like(packed)
    return w, broadcast(mesh, w, "tsp", owner, async_op=True)


def _project(attn, xn, w, positions):
    """q, k, v of this rank's tokens (at `positions`) for one shard's heads, q and k normed per head
    (where the model norms them) and turned by the rotary (where the model has one); the shard's W_O;
    and what the norms' backward needs — the projection's q and k and each head's fp32 rstd — or None
    without norms."""
    b, t, _ = xn.shape
    wq, wk, wv, wo = attn.unpack(w)
    hd = attn.head_dim
    q, k = (xn @ wq.t()).view(b, t, attn.lq // hd, hd), (xn @ wk.t()).view(b, t, attn.lkv // hd, hd)
    kept = None
    if attn.qk_norm:
        q_in, k_in = q, k
        q, q_rstd = rms_norm_rows(q_in, attn.q_norm.weight, attn.q_norm.eps)
        k, k_rstd = rms_norm_rows(k_in, attn.k_norm.weight, attn.k_norm.eps)
        kept = (q_in, k_in, q_rstd, k_rstd)
    _turn(attn, q, positions)
    _turn(attn, k, positions)
    return q, k, (xn @ wv.t()).view(b, t, attn.lkv // hd, hd), wo, kept


class _TSPAttentionFn(torch.autograd.Function):
    """TSP's attention of this rank's tokens xn over every shard's heads; `q_norm`, `k_norm`: the
    query/key norms' scales where the model has them (None without), whose gradients from this rank's
    tokens it returns."""

    @staticmethod
    def forward(ctx, xn, w_qkv, w_o, q_norm, k_norm, attn):
        mesh, ax = attn.mesh, attn.mesh.axis("tsp")
        packed = torch.cat([w_qkv.flatten(), w_o.flatten()])
        b, t, _ = xn.shape
        y = None
        qs, ks, vs, outs, norms_kept = [], [], [], [], []

        def take(j, pending):
            """Wait for shard j's weights, start shard j + 1's broadcast, project, and start gathering
            the shard's K/V — which then travel while the previous shard attends."""
            w, work = pending
            if work is not None:
                work.wait()
            nxt = _start_broadcast(mesh, packed, j + 1) if j + 1 < ax.size else None
            q, k, v, wo, kept = _project(attn, xn, w, attn.q_positions)
            if kept is not None:
                norms_kept.append(kept)
            return (q, k, v, wo, all_gather_start(mesh, k, "tsp", 1), all_gather_start(mesh, v, "tsp", 1)), nxt

        # Prologue: shard 0's weights broadcast, its q/k/v projected, its K/V gather started.
        cur, pending = take(0, _start_broadcast(mesh, packed, 0))
        for j in range(ax.size):
            # Step j: shard j + 1's broadcast and K/V gather are started (take) before shard j attends,
            # so they travel behind this shard's attention and W_O GEMM (costmodel/axes/tsp.py
            # prices them as overlapped with the GEMMs).
            if j + 1 < ax.size:
                nxt, pending = take(j + 1, pending)
            q, k, v, wo, gather_k, gather_v = cur
            o = _attend(q, gather_k(), gather_v(), attn).reshape(b, t, attn.lq)
            y = o @ wo.t() if y is None else y + o @ wo.t()
            qs.append(q)
            ks.append(k)
            vs.append(v)
            outs.append(o)
            if j + 1 < ax.size:
                cur = nxt
        # Saved for backward: the local q/k/v and outputs of every shard's heads (not the gathered K/V,
        # re-gathered there), this rank's own weight shards (the others are broadcast again), and
        # where queries and keys are normed, the projection's q and k and the norms' rstd, all heads'.
        ctx.attn = attn
        k_all, v_all = torch.cat(ks, 2), torch.cat(vs, 2)
        if attn.keep_cache:
            attn.kv_cache = KVCache(k_all, v_all)
            attn.next_position = attn.seq
        norms = [torch.cat(parts, 2) for parts in zip(*norms_kept)]
        ctx.save_for_backward(
            xn, w_qkv, w_o, q_norm, k_norm, torch.cat(qs, 2), k_all, v_all, torch.cat(outs, -1), *norms
        )
        return y

    @staticmethod
    def backward(ctx, dy):
        xn, w_qkv, w_o, q_norm, k_norm, q_all, k_all, v_all, o_all, *norms = ctx.saved_tensors
        packed = torch.cat([w_qkv.flatten(), w_o.flatten()])
        attn = ctx.attn
        mesh, ax = attn.mesh, attn.mesh.axis("tsp")
        lq, lkv, hd = attn.lq, attn.lkv, attn.head_dim
        nq, nkv = lq // hd, lkv // hd
        dxn = torch.zeros_like(xn)
        # Each hop's weight gradients are written straight into their row (every row is: one per shard)
        grads = torch.empty(ax.size, packed.numel(), dtype=packed.dtype, device=packed.device)
        d_norms = [torch.zeros_like(w) for w in (q_norm, k_norm)] if norms else [None, None]

        def gather(j):
            """Start gathering shard j's K/V (saved from the forward: nothing to wait for)."""
            return tuple(all_gather_start(mesh, t[:, :, j * nkv : (j + 1) * nkv], "tsp", 1) for t in (k_all, v_all))

        # Backward streams the shards again in the same order: shard j's weights and gathered K/V in
        # hand while shard j + 1's broadcast and gather travel.
        pending = _start_broadcast(mesh, packed, 0)
        gathers = gather(0)
        for j in range(ax.size):
            w, work = pending
            if work is not None:
                work.wait()
            if j + 1 < ax.size:
                pending = _start_broadcast(mesh, packed, j + 1)
                upcoming = gather(j + 1)  # the next shard's K/V travel while this one is differentiated
            wq, wk, wv, wo = attn.unpack(w)
            q = q_all[:, :, j * nq : (j + 1) * nq]
            o = o_all[..., j * lq : (j + 1) * lq]
            kk, vv = (finish() for finish in gathers)
            if j + 1 < ax.size:
                gathers = upcoming
            # Attention recomputed on the gathered K/V for its gradients; dK/dV of the whole sequence
            # are reduce-scattered back to the tokens' owners.
            with torch.enable_grad():
                q_, kk_, vv_ = (t.detach().requires_grad_(True) for t in (q, kk, vv))
                o_ = _attend(q_, kk_, vv_, attn)
                do = (dy @ wo).view_as(o_)
                dq, dkk, dvv = torch.autograd.grad(o_, (q_, kk_, vv_), do)
            dk = reduce_scatter(mesh, dkk, "tsp", 1)
            dv = reduce_scatter(mesh, dvv, "tsp", 1).flatten(2)
            # q and k were turned after the projection (and its norms): their gradients turn back
            # before them, then go back through the norms of shard j's heads.
            dq = _turn(attn, dq, attn.q_positions, inverse=True)
            dk = _turn(attn, dk, attn.q_positions, inverse=True)
            if norms:
                q_in, k_in, q_rstd, k_rstd = (t[:, :, j * n : (j + 1) * n] for t, n in zip(norms, (nq, nkv, nq, nkv)))
                dq, dqn = rms_norm_rows_grad(q_in, q_norm, q_rstd, dq)
                dk, dkn = rms_norm_rows_grad(k_in, k_norm, k_rstd, dk)
                d_norms[0] += dqn
                d_norms[1] += dkn
            dq, dk = dq.flatten(2), dk.flatten(2)
            # This rank's tokens' share of shard j's weight gradients, into row j, and the input's gradient.
            gq, gk, gv, go = attn.unpack(grads[j])
            token_sum(dy, o, go)
            for g, into in ((dq, gq), (dk, gk), (dv, gv)):
                token_sum(g, xn, into)
            dxn += dq @ wq + dk @ wk + dv @ wv
        # Every rank holds partial gradients of all D shards: one reduce-scatter sums each onto its owner.
        own = reduce_scatter(mesh, grads.flatten(), "tsp", 0)
        dw_qkv, dw_o = own[: w_qkv.numel()].view_as(w_qkv), own[w_qkv.numel() :].view_as(w_o)
        return dxn, dw_qkv, dw_o, *d_norms, None


def _mlp_hop(xn, w_in, down, gated):
    """One shard's partial MLP output for this rank's tokens, and what its backward keeps: SwiGLU of the
    [gate; up] rows where `gated` (kept: their output h and the product, as experts.SwiGLUFn keeps them),
    else the squared ReLU of Nemotron-H's up rows (experts.activate)."""
    h = xn @ w_in.t()
    p = swiglu(h) if gated else torch.square(F.relu(h))
    return p @ down.t(), (h, p)


def _mlp_hop_grads(dy, xn, w_in, down, saved, gated, d_in, d_down):
    """One shard's input gradient; its weight gradients ([gate; up] or up, down) from this rank's tokens
    written into d_in and d_down."""
    dp = dy @ down
    token_sum(dy, saved[-1], d_down)
    if gated:
        dh = swiglu_grad(saved[0], dp)
    else:
        u, _ = saved
        dh = dp * 2 * F.relu(u)
    token_sum(dh, xn, d_in)
    return dh @ w_in


class _TSPMlpFn(torch.autograd.Function):
    """A dense MLP (or an MoE's shared expert) whose [gate; up] (or up) row shards and W_down column
    shards lie one on each rank of tsp; `ring`: its mesh and whether it is gated (.mesh, .gated)."""

    @staticmethod
    def forward(ctx, xn, w_in, w_down, ring):
        mesh, ax = ring.mesh, ring.mesh.axis("tsp")
        cur = torch.cat([w_in.flatten(), w_down.flatten()])
        y = None
        saved = []
        # Hop k: this rank holds shard (rank − k) mod D; it sends it on and receives the next while the
        # gate / up / down GEMMs of the one in hand run, and adds that shard's partial output — the
        # MLP's output needs no all-reduce.
        for hop in range(ax.size):
            reqs = []
            if hop < ax.size - 1:
                nxt, reqs = ring_shift(mesh, cur, "tsp")  # the next shard travels while this one computes
            part, kept = _mlp_hop(xn, *_mlp_shard(cur, w_in.shape, w_down.shape), ring.gated)
            y = part if y is None else y + part
            saved += kept
            for r in reqs:
                r.wait()
            if hop < ax.size - 1:
                cur = nxt
        ctx.ring = ring
        ctx.save_for_backward(xn, w_in, w_down, *saved)
        return y

    @staticmethod
    def backward(ctx, dy):
        xn, w_in, w_down, *saved = ctx.saved_tensors
        packed = torch.cat([w_in.flatten(), w_down.flatten()])
        ring = ctx.ring
        mesh, ax = ring.mesh, ring.mesh.axis("tsp")
        per_hop = len(saved) // ax.size
        dxn = torch.zeros_like(xn)
        grads = torch.empty(ax.size, packed.numel(), dtype=packed.dtype, device=packed.device)
        # The ring again, in the forward's order: hop k's saved activations go with shard (rank − k) mod
        # D; its weight gradients (from this rank's tokens) are written into row j, reduce-scattered at the end.
        cur = packed
        for hop in range(ax.size):
            reqs = []
            if hop < ax.size - 1:
                nxt, reqs = ring_shift(mesh, cur, "tsp")
            j = (ax.rank - hop) % ax.size
            w_in_j, down = _mlp_shard(cur, w_in.shape, w_down.shape)
            kept = saved[per_hop * hop : per_hop * (hop + 1)]
            into = _mlp_shard(grads[j], w_in.shape, w_down.shape)  # row j's views: the gradients land there
            dxn += _mlp_hop_grads(dy, xn, w_in_j, down, kept, ring.gated, *into)
            for r in reqs:
                r.wait()
            if hop < ax.size - 1:
                cur = nxt
        own = reduce_scatter(mesh, grads.flatten(), "tsp", 0)
        return dxn, own[: w_in.numel()].view_as(w_in), own[w_in.numel() :].view_as(w_down), None


def _mlp_shard(w, in_shape, down_shape):
    """A packed MLP shard → its [gate; up] (or up) rows and W_down columns."""
    n = in_shape[0] * in_shape[1]
    return w[:n].view(in_shape), w[n:].view(down_shape)


class RingRowsFn(torch.autograd.Function):
    """x @ W.T for a W whose row shards lie one on each rank of tsp (an MoE router's experts): the
    shards go around the send/recv ring, each hop filling the output columns of the shard in hand while
    the next travels (costmodel/axes/tsp.py's "weight shard ring"). Backward: the ring again, x's
    gradient summed over the shards, each shard's weight gradient (from this rank's tokens)
    reduce-scattered onto its owner."""

    @staticmethod
    def forward(ctx, x, w, mesh):
        ax, rows = mesh.axis("tsp"), w.shape[0]
        out = x.new_empty(*x.shape[:-1], rows * ax.size)

        def rows_of(j, shard):
            out[..., j * rows : (j + 1) * rows] = x @ shard.t()

        ring_shards(mesh, w, rows_of)
        ctx.mesh = mesh
        ctx.save_for_backward(x, w)
        return out

    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        rows = w.shape[0]
        dx = torch.zeros_like(x)

        def grad_of(j, shard, out):
            d_j = dout[..., j * rows : (j + 1) * rows]
            dx.add_(d_j @ shard)
            token_sum(d_j, x, out)

        return dx, ring_weight_grads(ctx.mesh, w, grad_of), None


class RingColumnsFn(torch.autograd.Function):
    """x @ W.T for a W whose column shards lie one on each rank of tsp (Qwen2-MoE's shared-expert gate,
    one row of hidden columns): the shards go around the send/recv ring, each hop adding the product of
    x's columns of the shard in hand. Backward: the ring again, x's gradient filled column shard by
    column shard, each shard's weight gradient (from this rank's tokens) reduce-scattered onto its owner."""

    @staticmethod
    def forward(ctx, x, w, mesh):
        cols = w.shape[1]
        out = x.new_zeros(*x.shape[:-1], w.shape[0])

        def add_columns(j, shard):
            out.add_(x[..., j * cols : (j + 1) * cols] @ shard.t())

        ring_shards(mesh, w, add_columns)
        ctx.mesh = mesh
        ctx.save_for_backward(x, w)
        return out

    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        cols = w.shape[1]
        dx = torch.empty_like(x)

        def grad_of(j, shard, out):
            x_j = x[..., j * cols : (j + 1) * cols]
            dx[..., j * cols : (j + 1) * cols] = dout @ shard
            token_sum(dout, x_j, out)

        return dx, ring_weight_grads(ctx.mesh, w, grad_of), None


class TSPAttention(Sublayer):
    """RMSNorm of this rank's tokens → every rank's packed W_Q, W_K, W_V, W_O shard broadcast in turn,
    each shard's heads attended over its all-gathered K/V (_TSPAttentionFn). Every rank keeps the norms'
    scales whole (the input's; the query and key norms', Qwen3's): their gradients, from the rank's own
    tokens, are summed over tsp after the backward.
    `zigzag`: the rank holds zigzag chunks (attention-only stacks), else a contiguous shard (beside Mamba
    blocks, whose recurrence runs along the ranks in order: layer.tokens_held)."""

    def __init__(self, ref: DenseLayer, mesh: Mesh, seq: int, zigzag: bool = True):
        super().__init__()
        ax = mesh.axis("tsp")
        d, r = ax.size, ax.rank
        self.mesh = mesh
        self.head_dim = ref.head_dim
        q_w, kv_w = ref.heads * ref.head_dim, ref.kv_heads * ref.head_dim
        self.lq, self.lkv, self.hidden = q_w // d, kv_w // d, ref.w_o.shape[0]
        self.qk_norm = ref.qk_norms is not None
        self.take_splits(ref, attention_splits(q_w, kv_w, self.qk_norm), d, r, local={"attn_norm": "norm"})
        self.q_positions = zigzag_tokens(seq, d, r) if zigzag else contiguous_tokens(seq, d, r)
        self.rotary, self.seq = ref.rotary, seq
        self.next_position = seq  # decode's next token (prefill resets it)
        self.keys = ZigzagKeys(seq, d, r) if zigzag else None
        self.kv_len = int(self.q_positions[-1]) + 1  # the keys a contiguous shard's queries see
        self.keep_cache, self.kv_cache = False, None

    def unpack(self, w):
        """A packed attention shard → its W_Q, W_K, W_V, W_O."""
        h, lq, lkv = self.hidden, self.lq, self.lkv
        n_qkv = (lq + 2 * lkv) * h
        qkv = w[:n_qkv].view(lq + 2 * lkv, h)
        return qkv[:lq], qkv[lq : lq + lkv], qkv[lq + lkv :], w[n_qkv:].view(h, lq)

    def forward(self, x):
        q_norm, k_norm = (self.q_norm.weight, self.k_norm.weight) if self.qk_norm else (None, None)
        return _TSPAttentionFn.apply(self.norm(x), self.w_qkv, self.w_o, q_norm, k_norm, self)

    def partial_grads(self) -> dict:
        qk = [self.q_norm.weight, self.k_norm.weight] if self.qk_norm else []
        return {"tsp": [self.norm.weight, *qk]}

    def drop_cache(self) -> None:
        self.kv_cache = None

    @torch.no_grad()
    def decode(self, x):
        """One new token per sequence: every shard's weights are broadcast again; each rank attends over
        its part of the cache (the last rank keeps the new tokens) and the partial outputs are gathered
        and combined."""
        ax = self.mesh.axis("tsp")
        b, hd = x.shape[0], self.head_dim
        xn = self.norm(x)
        nkv = self.lkv // hd
        owner = ax.rank == ax.size - 1
        packed = torch.cat([self.w_qkv.flatten(), self.w_o.flatten()])
        y = torch.zeros_like(x)
        position = self.q_positions.new_full((1,), self.next_position)
        self.next_position += 1
        for j in range(ax.size):
            w, work = _start_broadcast(self.mesh, packed, j)
            if work is not None:
                work.wait()
            q, k, v, wo, _ = _project(self, xn, w, position)
            if owner:  # the new token sees itself: write its shard-j heads into the next cache slot
                self.kv_cache.write_next(k, v, j * nkv, (j + 1) * nkv)
            out, lse = partial_attention(q, *self.kv_cache.heads(j * nkv, (j + 1) * nkv, pending=int(owner)))
            outs = all_gather(self.mesh, out.contiguous(), "tsp", 0).chunk(ax.size)
            lses = all_gather(self.mesh, lse.contiguous(), "tsp", 0).chunk(ax.size)
            y = y + combine_partials(list(zip(outs, lses))).reshape(b, 1, -1) @ wo.t()
        if owner:
            self.kv_cache.length += 1
        return y


class TSPMLP(Sublayer):
    """RMSNorm of this rank's tokens → the packed [W_gate; W_up] (Nemotron-H's squared-ReLU MLP: W_up),
    W_down shards around the send/recv ring, each hop's GEMMs overlapped with the next shard's transfer
    (_TSPMlpFn); decode is the forward. The norm's scale is whole on every rank, its gradient summed over
    tsp after the backward."""

    def __init__(self, ref: DenseLayer, mesh: Mesh):
        super().__init__()
        ax = mesh.axis("tsp")
        d, r = ax.size, ax.rank
        self.mesh, self.gated = mesh, ref.gated
        if not ref.gated and not ref.relu2:
            raise NotImplementedError("TSP's MLP ring runs gated and squared-ReLU MLPs")
        f = ref.w_down.shape[1]
        self.take_splits(ref, mlp_splits(f, gated=ref.gated), d, r, local={"mlp_norm": "norm"})

    def forward(self, x):
        return _TSPMlpFn.apply(self.norm(x), self.w_in, self.w_down, self)

    def partial_grads(self) -> dict:
        return {"tsp": [self.norm.weight]}


class TSPSharedExpert:
    """An MoE's shared expert streamed around the tsp ring as TSPMLP streams a dense MLP (the owning
    ep.ExpertParallelMoE holds its [gate; up] (or up) row shard and down column shard; no norm of its
    own), behind Qwen2-MoE's sigmoid gate where it has one (its hidden columns streamed too:
    RingColumnsFn): what it adds for every token of xn (T, h)."""

    def __init__(self, mesh: Mesh, gated: bool):
        self.mesh, self.gated = mesh, gated

    def __call__(self, xn, w_in, w_down, w_gate=None):
        out = _TSPMlpFn.apply(xn.unsqueeze(0), w_in, w_down, self).squeeze(0)
        return out if w_gate is None else out * torch.sigmoid(RingColumnsFn.apply(xn, w_gate, self.mesh))

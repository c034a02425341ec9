"""TSP over a Mamba-2 block: one axis D holds 1/D of the block's weights and 1/D of the tokens.

Each rank owns a contiguous 1/D of every weight: in_proj's rows, the conv's channels, the heads'
dt_bias, A and D, the gated norm's scale, out_proj's columns (the input RMSNorm's scale, applied to
the rank's own tokens, every rank keeps). The tokens are split contiguously, as SP splits them for a
Mamba block: the recurrence runs along the ranks in order.

Forward: the rank's packed shard travels a send/recv ring (D − 1 hops) until every rank holds every
shard; with the whole block's weights the rank projects its own tokens, and the mixer runs as SP's
sequence shard (meshplan.executor.layouts.mamba.seq_shard_forward: the conv tail from the rank before,
one all-gather of the shards' final states and decays, the output corrected for the state entering
it). The gathered weights are dropped once the block's forward ends; the block keeps what SP's keeps
(its input, the in_proj output and the shards' summaries). Backward gathers the shards again along the
ring, runs SP's backward, sends the conv tail's gradient back to the rank before, and reduce-scatters
the weight gradients — each rank holds partial gradients of every shard from its own tokens — so that
each rank gets the sum for its own shard. The ring is not overlapped with the GEMMs here (the cost
model prices Mamba blocks' ring as exposed: meshplan/costmodel/axes/tsp.py).
Twin of meshplan/costmodel/axes/tsp.py (Mamba blocks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshplan.executor.blocks import Mamba2Block
from meshplan.executor.comm import Mesh, exchange, reduce_scatter, ring_shift
from meshplan.executor.layouts.common import Sublayer
from meshplan.executor.layouts.mamba import (
    TAG_TAIL,
    ShardDocs,
    decode_step,
    last_document_tail,
    seq_shard_backward,
    seq_shard_forward,
    share_last_shard_state,
)
from meshplan.executor.layouts.splits import WHOLE, contiguous_splits

AXIS = "tsp"
# The block's weights in the order each rank packs its shard, and the dimension each is split along.
SPLIT = (
    ("in_proj", 0),
    ("conv_w", 0),
    ("conv_b", 0),
    ("dt_bias", 0),
    ("a_log", 0),
    ("d_skip", 0),
    ("norm_w", 0),
    ("out_proj", 1),
)


def ring_gather(mesh: Mesh, own: torch.Tensor) -> torch.Tensor:
    """(D, numel): row j is rank j's packed shard, gathered along the send/recv ring in D − 1 hops."""
    ax = mesh.axis(AXIS)
    out = own.new_empty(ax.size, own.numel())
    out[ax.rank] = own
    cur = own
    for hop in range(1, ax.size):
        cur, reqs = ring_shift(mesh, cur, AXIS)
        for r in reqs:
            r.wait()
        out[(ax.rank - hop) % ax.size] = cur
    return out


class _TSPMamba2Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xn, layer, *own):
        full = layer.gather(own)
        zx = F.linear(xn, full["in_proj"])
        tail = layer.shift_tail(zx)
        docs = ShardDocs.of(layer.packed, layer.mesh.axis(AXIS).rank, xn.shape[1], layer.d_conv)
        out, state, E, gathered = seq_shard_forward(
            zx, tail.transpose(1, 2), [full[n] for n, _ in SPLIT[1:]], layer.dims, None, layer.mesh, AXIS, docs
        )
        ctx.layer, ctx.docs = layer, docs
        ctx.save_for_backward(xn, zx, tail, E, gathered, *own)
        if layer.keep_cache:  # prefill: the SSM state and conv tail decode continues from
            layer.ssm_cache = (state, last_document_tail(layer.xbc_tail(zx), layer.packed))
        return out

    @staticmethod
    def backward(ctx, dout):
        xn, zx, tail, E, gathered, *own = ctx.saved_tensors
        layer = ctx.layer
        full = layer.gather(own)
        d_zx, d_state_in, *d_small = seq_shard_backward(
            zx,
            tail.transpose(1, 2),
            [full[n] for n, _ in SPLIT[1:]],
            E,
            gathered,
            dout.contiguous(),
            None,
            layer.dims,
            None,
            layer.mesh,
            AXIS,
            ctx.docs,
        )
        d_zx = d_zx.clone()
        layer.tail_grad_back(d_zx, d_state_in.transpose(1, 2))
        grads = dict(zip([n for n, _ in SPLIT[1:]], d_small))
        grads["in_proj"] = d_zx.flatten(0, 1).t() @ xn.flatten(0, 1)
        d_xn = d_zx @ full["in_proj"]
        mine = reduce_scatter(layer.mesh, layer.pack_all(grads).flatten(), AXIS, 0)
        return (d_xn, None, *layer.split_packed(mine))


class TSPMamba2(Sublayer):
    """A Mamba-2 layer's mixer under TSP; every rank keeps the input norm's scale whole, its gradient (from
    the rank's own tokens) summed over tsp after the backward."""

    def __init__(self, ref: Mamba2Block, mesh: Mesh):
        super().__init__()
        ax = mesh.axis(AXIS)
        d, r = ax.size, ax.rank
        self.mesh, self.dims, self.d_conv = mesh, ref.dims, ref.conv_w.shape[1]
        di, ng, ds = ref.dims[0], ref.dims[1], ref.dims[2]
        self.conv_channels = di + 2 * ng * ds
        self.shapes = [(name, dim, tuple(getattr(ref, name).shape)) for name, dim in SPLIT]  # each whole shape
        table = contiguous_splits({name: shape for name, _, shape in self.shapes}, dict(SPLIT))
        self.take_splits(ref, {"norm.weight": WHOLE, **table}, d, r)
        self.keep_cache, self.ssm_cache = False, None
        self.packed = None  # (b, s) document ids of the whole sequence when documents are packed

    def own(self) -> list[torch.Tensor]:
        return [getattr(self, n) for n, _ in SPLIT]

    def pack(self, parts) -> torch.Tensor:
        return torch.cat([p.reshape(-1) for p in parts])

    def split_packed(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A packed shard back into the rank's weight shapes."""
        out, at = [], 0
        for p in self.own():
            out.append(flat[at : at + p.numel()].view_as(p))
            at += p.numel()
        return out

    def unpack(self, shards: torch.Tensor) -> dict[str, torch.Tensor]:
        """(D, numel) gathered shards → the block's whole weights."""
        parts = [self.split_packed(row) for row in shards]
        return {name: torch.cat([p[i] for p in parts], dim) for i, (name, dim, _) in enumerate(self.shapes)}

    def gather(self, own) -> dict[str, torch.Tensor]:
        """The block's whole weights from every rank's shard (`own`: this rank's), along the ring."""
        return self.unpack(ring_gather(self.mesh, self.pack(own)))

    def pack_all(self, whole: dict[str, torch.Tensor]) -> torch.Tensor:
        """Whole-weight tensors (gradients) → (D, numel): row j is what rank j's shard packs."""
        d = self.mesh.axis(AXIS).size
        chunks = {name: whole[name].chunk(d, dim) for name, dim, _ in self.shapes}
        return torch.stack([torch.cat([chunks[name][j].reshape(-1) for name, _, _ in self.shapes]) for j in range(d)])

    def xbc_tail(self, zx: torch.Tensor) -> torch.Tensor:
        di = self.dims[0]
        return zx[:, -(self.d_conv - 1) :, di : di + self.conv_channels]

    def shift_tail(self, zx: torch.Tensor) -> torch.Tensor:
        """The previous rank's last d_conv − 1 conv inputs (zeros on the first rank)."""
        ax = self.mesh.axis(AXIS)
        tail = self.xbc_tail(zx)
        nxt = ax.rank + 1 if ax.rank + 1 < ax.size else None
        prv = ax.rank - 1 if ax.rank > 0 else None
        got = exchange(self.mesh, AXIS, tail, nxt, tail, prv, TAG_TAIL)
        return torch.zeros_like(tail) if got is None else got

    def tail_grad_back(self, d_zx: torch.Tensor, d_tail: torch.Tensor) -> None:
        """The gradient of the tail this rank received goes back to the rank before; the one from the
        rank after lands on this rank's last conv inputs."""
        ax = self.mesh.axis(AXIS)
        prv = ax.rank - 1 if ax.rank > 0 else None
        nxt = ax.rank + 1 if ax.rank + 1 < ax.size else None
        got = exchange(self.mesh, AXIS, d_tail, prv, d_tail, nxt, TAG_TAIL)
        if got is not None:
            self.xbc_tail(d_zx).add_(got)

    def forward(self, x):
        return _TSPMamba2Fn.apply(self.norm(x), self, *self.own())

    def partial_grads(self) -> dict:
        return {AXIS: [self.norm.weight]}

    def drop_cache(self) -> None:
        self.ssm_cache = None

    def share_final_state(self) -> None:
        """After a prefill only the last rank holds the true state and conv tail: give them to all."""
        self.ssm_cache = share_last_shard_state(self.mesh, AXIS, self.ssm_cache)

    @torch.no_grad()
    def decode(self, x):
        """One new token per sequence, on the whole block's weights gathered along the ring."""
        full = self.gather(self.own())
        out, self.ssm_cache = decode_step(x, self.norm, *(full[n] for n, _ in SPLIT), self.dims, self.ssm_cache, None)
        return out

"""A mixture of experts split over an expert-parallel axis (ep) and an expert-tensor axis (etp) — the
executor's twin of the cost model's meshplan/costmodel/axes/ep.py, with Megatron-Core's alltoall token
dispatcher (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher).

The experts fold onto the stage's ranks as etp × ep × edp (rank_order.EXPERT_ORDER, etp innermost):
rank r of the ep axis holds experts [r·E/ep, (r+1)·E/ep), rank j of the etp axis the j-th etp-th of
each one's FFN (its gate and up rows alike, down's matching columns: splits.expert_splits); the router
and the norm whole. Each rank routes the tokens it holds (T_d), sorts their T_d·top_k copies by expert,
exchanges the per-expert counts, then all-to-alls the copies to their experts' ranks (dispatch); the
local experts run what arrived, and the outputs go back by the reverse all-to-all (combine), are
weighted by their routing probabilities and summed per token. Backward runs the two all-to-alls'
gradients (each the reverse exchange).

etp > 1, two cases, as the cost model prices them (axes.ep.etp_gathers):

- the etp group lies within a tensor group (etp dividing tp; etp = tp is the default): its ranks route
  the same tokens in the same order, so each rank's copies are the same as its etp peers'. The partial
  outputs of its FFN slices are all-reduced over etp where the copies were routed (after the combine),
  and their input gradients likewise (T_d·top_k·h a rank each way, under any routing);
- the etp group reaches over sp or dp ranks, which hold other tokens: after the dispatch each etp rank
  gathers the group's arrived copies (uneven counts: comm.all_gather_rows), runs its FFN slices on all
  of them and reduce-scatters the outputs back to the rank each copy arrived at, before the combine
  (as Megatron-Core's dispatcher does under Megatron-SP); backward the reverse.

The experts' gradients are then summed over the tokens of the ep ranks (and the etp group's, gathered);
GradientSync sums them over the expert-data-parallel ranks (edp) and everything else over dp. A copy
whose token several tensor ranks hold reaches each expert shard once from each that dispatches it to
that shard (copies_per_shard); its gradient there is scaled down by as many (ScaleGrad).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshplan.executor.blocks import MoELayer, route, shared_expert, top_k_of
from meshplan.executor.comm import (
    AllToAllSplits,
    CopyToAxis,
    GatherRows,
    Mesh,
    ReduceFromAxis,
    ScatterRows,
    exchange_counts,
    gather_counts,
)
from meshplan.executor.experts import counts_of, expert_mlp, routed_experts, take
from meshplan.executor.layouts.common import Sublayer
from meshplan.executor.layouts.splits import expert_splits, router_split, shared_expert_splits
from meshplan.executor.layouts.tsp import RingRowsFn, TSPSharedExpert


class ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times `scale` backward."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def copies_per_shard(tensor: int, etp: int, expert_axes: bool, gather: bool = False) -> int:
    """How many times each routed copy reaches each shard of its expert, summed over the ep and edp
    ranks that hold that shard. The `tensor` ranks of a tensor group route the same tokens and each
    dispatches them: where the etp group lies within the tensor group the `tensor` / `etp` of them on
    one etp rank reach that shard (1 when etp = tp); where the etp ranks gather each other's copies
    (`gather`) every dispatch reaches every shard: `tensor` times. Without the experts' own axes every
    rank runs its own tokens through its own copy of every expert: once."""
    if not expert_axes:
        return 1
    return tensor if gather else tensor // etp


class ExpertParallelMoE(Sublayer):
    """RMSNorm → the router (whole) → the token copies dispatched to their experts' ep ranks (and over
    etp: gathered, or all-reduced where its ranks route the same copies) → this rank's FFN slice of its
    E/ep experts → combined back, weighted and summed. `sent_rows`: the routed copies this rank sent in
    the last forward (its dispatch's rows, T_d·top_k); `received_rows`: those that arrived here and went
    back (the combine's rows: T_d·top_k only when the routing is even, as the cost model prices it)."""

    def __init__(self, ref: MoELayer, mesh: Mesh, axis: str = "ep", tensor_axis: str | None = None):
        super().__init__()
        self.mesh, self.axis, self.tensor_axis = mesh, axis, tensor_axis
        t = mesh.axis(tensor_axis).size if tensor_axis else 1
        t_rank = mesh.axis(tensor_axis).rank if tensor_axis else 0
        ax = mesh.axes.get(axis)
        ep, r = (ax.size, ax.rank) if ax is not None else (1, 0)
        moe = ref.moe
        experts = moe.w_gate_up.shape[0]
        if experts % ep:
            raise ValueError(f"ep={ep} does not divide {experts} experts")
        self.top_k, self.experts, self.ep = moe.top_k, experts, ep
        etp_ax = mesh.axes.get("etp")
        self.etp, e_rank = (etp_ax.size, etp_ax.rank) if etp_ax is not None else (1, 0)
        # The etp group within one tensor group holds the same tokens (their partial outputs all-reduced);
        # reaching past it (etp innermost in rank_order.EXPERT_ORDER), over sp or dp ranks, other tokens:
        # each etp rank gathers the group's arrived copies and reduce-scatters their outputs back.
        self.gather = self.etp > 1 and t % self.etp != 0
        self.holders = copies_per_shard(t, self.etp, mesh.layout.expert_axes, self.gather)
        self.local = experts // ep
        mine = torch.arange(r * self.local, (r + 1) * self.local)
        self.take_norm("moe.mlp_norm", ref, "norm")
        self.index["norm.weight"] = ("moe.mlp_norm.weight", None, None)
        # Under TSP the router's expert rows are split over tsp and streamed (tsp.RingRowsFn).
        self.tsp = mesh.layout.tsp > 1
        ring = (0, router_split(experts).indices(mesh.axis("tsp").size, mesh.axis("tsp").rank)) if self.tsp else ()
        self.take("w_router", ref, "moe.w_router", *ring)
        # This rank's experts (over ep), and of each its FFN slice (over etp: gate and up rows alike)
        for name, split in expert_splits(moe.w_down.shape[2], moe.gated).items():
            cut = ((0, split.dim), (mine, split.indices(self.etp, e_rank))) if self.etp > 1 else (0, mine)
            self.take(name, ref, f"moe.{name}", *cut)
        self.spec, self.gated = moe.spec, moe.gated
        if hasattr(moe, "score_bias"):  # the sigmoid router's correction bias: a buffer, whole on every rank
            self.register_buffer("score_bias", moe.score_bias.detach().clone())
        if hasattr(moe, "w_shared_gate_up"):
            # split over the tensor axis as a dense MLP (whole without one); under TSP over tsp, streamed
            # around its ring as TSP streams a dense MLP (tsp.TSPSharedExpert)
            n, n_rank = (mesh.axis("tsp").size, mesh.axis("tsp").rank) if self.tsp else (t, t_rank)
            splits = shared_expert_splits(moe.w_shared_down.shape[1], moe.gated, moe.w_router.shape[1], self.tsp)
            for name, split in splits.items():
                if hasattr(moe, name):
                    cut = (split.dim, split.indices(n, n_rank)) if n > 1 else (None, None)
                    self.take(name, ref, f"moe.{name}", *cut)
            self.streamed_shared = TSPSharedExpert(mesh, moe.gated) if self.tsp else None
        self.sent_rows = self.received_rows = 0

    def partial_grads(self) -> dict:
        """TSP: the norm's scale, whole on every rank, has each rank's tokens' gradient."""
        return {"tsp": [self.norm.weight]} if self.tsp else {}

    def expert_params(self) -> list:
        """The weights split over etp × ep, whose gradients are summed over edp (not dp)."""
        return [self.w_gate_up, self.w_down]

    def _exchange(self, counts):
        return exchange_counts(self.mesh, counts, self.axis) if self.ep > 1 else counts

    def _all_to_all(self, rows, send, recv):
        return AllToAllSplits.apply(rows, self.mesh, self.axis, send, recv) if self.ep > 1 else rows

    def _dispatch(self, routed, send, recv, rows):
        """This rank's routed copies to their experts' ep ranks; over etp, where its ranks route the same
        copies, their input gradients summed there (the partial sums of its FFN slices); where they route
        others, the group's arrived copies gathered (rank j's rows[j] in turn)."""
        if self.etp > 1 and not self.gather:
            routed = CopyToAxis.apply(routed, self.mesh, "etp")
        arrived = self._all_to_all(routed, send, recv)
        return GatherRows.apply(arrived, self.mesh, "etp", rows) if self.gather else arrived

    def _combine(self, ran, send, recv, rows):
        """The experts' outputs back to where each copy was routed (_dispatch's reverse): over etp, the
        partial outputs of the group's gathered copies reduce-scattered back to the rank each arrived
        at, or those of the same copies all-reduced where they were routed."""
        if self.gather:
            ran = ScatterRows.apply(ran, self.mesh, "etp", rows)
        back = self._all_to_all(ran, recv, send)
        return ReduceFromAxis.apply(back, self.mesh, "etp") if self.etp > 1 and not self.gather else back

    def forward(self, x):
        xn = self.norm(x).reshape(-1, x.shape[-1])
        bias = getattr(self, "score_bias", None)
        if self.tsp:
            weights, experts = top_k_of(RingRowsFn.apply(xn, self.w_router, self.mesh), self.spec, bias)
        else:
            weights, experts = route(xn, self.w_router, self.spec, bias)
        # The T·k copies sorted by expert (so by destination rank); gathers both ways (experts.take), no scatter-add.
        k = self.top_k
        expert_of = experts.reshape(-1)
        order = torch.argsort(expert_of, stable=True)
        inverse = torch.empty_like(order).index_copy_(0, order, torch.arange(len(order), device=x.device))
        per_expert = counts_of(expert_of, self.experts)
        # recv_counts[j, e]: copies rank j sends to this rank's local expert e. The split sizes come to the
        # host together, once a layer's forward (the all-to-all takes them as lists).
        recv_counts = self._exchange(per_expert).view(self.ep, self.local)
        # Gathering over etp: every etp rank's arrived counts too (source-major: etp rank, ep rank, expert)
        run_counts = gather_counts(self.mesh, recv_counts.reshape(-1), "etp") if self.gather else recv_counts
        parts = [per_expert.view(self.ep, self.local).sum(1), recv_counts.sum(1)]
        sizes = torch.cat(parts + ([run_counts.view(self.etp, -1).sum(1)] if self.gather else [])).tolist()
        send, recv, rows = sizes[: self.ep], sizes[self.ep : 2 * self.ep], sizes[2 * self.ep :]
        self.sent_rows, self.received_rows = len(order), sum(recv)
        arrived = self._dispatch(take(xn, order // k, inverse, k), send, recv, rows)
        # Rows arrive source-major, expert-minor: through this rank's experts, one grouped GEMM a
        # projection (meshplan.executor.experts), and back in arrival order for the combine.
        # (output_size given: repeat_interleave would read the total back from the GPU, another host sync)
        local_of = (
            torch.arange(self.local, device=x.device)
            .repeat(run_counts.numel() // self.local)
            .repeat_interleave(run_counts.reshape(-1), output_size=sum(rows) if self.gather else self.received_rows)
        )
        w_gate_up, w_down = self.w_gate_up, self.w_down
        if self.holders > 1:  # each copy reached this shard from every tensor rank that dispatched it
            w_gate_up, w_down = ScaleGrad.apply(w_gate_up, 1 / self.holders), ScaleGrad.apply(w_down, 1 / self.holders)
        ran = routed_experts(arrived, local_of, self.local, w_gate_up, w_down, gated=self.gated)
        copies = take(self._combine(ran, send, recv, rows), inverse, order)  # each token's k copies, in order
        out = (copies.view(*experts.shape, -1) * weights.unsqueeze(-1)).sum(1)
        shared = self._shared(xn)
        return (out if shared is None else out + shared).view_as(x)

    def _shared(self, xn):
        """The shared experts' output for every token of xn: whole, or their FFN columns on this tensor
        rank, summed over the axis (TP's "f" and "g"), then behind the whole sigmoid gate; under TSP
        their shards (the gate's hidden columns too) streamed around the tsp ring."""
        if self.tsp and hasattr(self, "w_shared_gate_up"):
            gate = getattr(self, "w_shared_gate", None)
            return self.streamed_shared(xn, self.w_shared_gate_up, self.w_shared_down, gate)
        if self.tensor_axis is None or not hasattr(self, "w_shared_gate_up"):
            return shared_expert(self, xn)
        partial = expert_mlp(
            CopyToAxis.apply(xn, self.mesh, self.tensor_axis), self.w_shared_gate_up, self.w_shared_down, self.gated
        )
        out = ReduceFromAxis.apply(partial, self.mesh, self.tensor_axis)
        gate = getattr(self, "w_shared_gate", None)
        return out * torch.sigmoid(F.linear(xn, gate)) if gate is not None else out

"""The expert-parallel axis, E ranks folded onto the data and sequence ranks (Megatron-Core's MoE
parallel folding, Liu et al. 2025, arXiv 2504.14960): each rank holds 1/E of every MoE layer's routed
experts; the router, the shared experts and every other block are not split by it. With the tensor
axis an expert is split T ways too (ETP = TP, Megatron's default).

Its collectives (Megatron-Core's all-to-all token dispatcher): each rank sends its tokens' top_k routed
copies to the ranks holding their experts and gets the experts' outputs back — two all-to-alls of
tokens·top_k·h elements forward, their gradients' two backward; under Megatron-SP a tensor rank
dispatches its own sequence shard's tokens. Balanced routing is assumed (token-drop training with
capacity factor 1, or an auxiliary loss that keeps the load even): a rank's experts run as many
copies as its own tokens made. The experts' gradients are summed over the expert-data-parallel ranks
(edp = dp·sp/E), ZeRO shards their optimizer states there (meshplan.costmodel.axes.dp, memory)."""

from meshplan.costmodel.axes.base import Sharding
from meshplan.costmodel.collectives import Comm
from meshplan.layout import Layout


def active(layout: Layout) -> bool:
    return layout.ep > 1


def sharding(layout: Layout, options, kind: str | None = None) -> Sharding:
    return Sharding(layout.ep if kind == "experts" else 1, 1, 1, 1, 1)


def block_comms(ctx, kind: str):
    if kind != "experts":
        return []
    m, e = ctx.model.moe, ctx.act_bytes
    # The routed copies of this rank's tokens (its sequence shard's under Megatron-SP).
    copies = ctx.tokens * m.top_k * m.hidden * e / ctx.sharding.hidden_div
    ep = ctx.layout.ep
    return [
        Comm("all_to_all", "ep", copies, ep, phase="fwd", block=kind, what="dispatch tokens to experts"),
        Comm("all_to_all", "ep", copies, ep, phase="fwd", block=kind, what="combine expert outputs"),
        Comm("all_to_all", "ep", copies, ep, phase="bwd", block=kind, what="combine's gradient"),
        Comm("all_to_all", "ep", copies, ep, phase="bwd", block=kind, what="dispatch's gradient"),
    ]

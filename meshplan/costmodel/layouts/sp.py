"""SP (sequence / context split): tokens split Σ ways, weights replicated.

Each rank keeps the activations of its b·s/Σ tokens; attention gathers the whole sequence's K/V per
layer (a transient; re-gathered in backward rather than saved), and weight gradients are
all-reduced over Σ once per step.
"""

from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def sharding(layout: Layout, options: MemoryOptions):
    from meshplan.costmodel.layouts import Sharding

    return Sharding(weight_div=1, token_div=layout.sp, head_div=1, hidden_div=1, vocab_div=1, gathers_kv=True)


def block_comms(ctx, kind: str, axis: str = "sp"):
    """Attention: all-gather K/V of the whole sequence (heads already split by T under TP+SP); the
    backward re-gathers them and reduce-scatters dK/dV. Mamba: the chunk-final state and the conv
    tail pass from each sequence shard to the next, in order (forward), and back (backward)."""
    from meshplan.costmodel.collectives import Comm

    sigma = ctx.layout.sp * ctx.layout.tsp
    if sigma == 1:
        return []
    head_div = ctx.sharding.head_div
    if kind == "attention":
        kv = ctx.batch * ctx.seq * 2 * ctx.model.attention.kv_width * ctx.act_bytes / head_div
        # Our executor gathers before attending (no ring attention yet): exposed. A ring-attention
        # implementation would mark these overlap="attention".
        return [Comm("all_gather", axis, kv, sigma, phase="fwd", block=kind, what="K/V all-gather"),
                Comm("all_gather", axis, kv, sigma, phase="bwd", block=kind, what="K/V re-gather"),
                Comm("reduce_scatter", axis, kv, sigma, phase="bwd", block=kind, what="dK/dV reduce-scatter")]
    if kind in ("mamba2", "mamba1"):
        state = ctx.mamba_state_bytes(head_div)
        # One hop per rank, but the hops run one after another along the sequence: Σ − 1 in series.
        return [Comm("send_recv", axis, state, sigma, phase="fwd", block=kind, what="state hand-off", chain=True),
                Comm("send_recv", axis, state, sigma, phase="bwd", block=kind, what="state-grad hand-off", chain=True)]
    return []

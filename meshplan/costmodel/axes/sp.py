"""The sequence axis, Σ ranks (sp: sequence / context split): tokens split Σ ways, weights replicated.

Each rank keeps the activations of its b·s/Σ tokens; attention gathers the whole sequence's K/V per
layer (a transient; re-gathered in backward rather than saved), and weight gradients are
all-reduced over Σ once per step.
"""

from meshplan.costmodel.axes.base import Sharding
from meshplan.costmodel.collectives import Comm
from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def active(layout: Layout) -> bool:
    return layout.sp > 1


def sharding(layout: Layout, options: MemoryOptions, kind: str | None = None) -> Sharding:
    return Sharding(weight_div=1, token_div=layout.sp, head_div=1, hidden_div=1, vocab_div=1, gathers_kv=True)


def block_comms(ctx, kind: str, axis: str = "sp"):
    """Attention: all-gather K/V of the whole sequence (heads already split by T under TP+SP); the
    backward re-gathers them and reduce-scatters dK/dV. Mamba: each shard's conv tail goes to the next
    shard, and every shard's zero-start summary (final state, log decay) is all-gathered, so that each
    rebuilds the state entering it without waiting (meshplan/executor/layouts/mamba.py); backward
    sends the tail's gradient back and reduce-scatters the summaries' gradients."""
    sigma = ctx.layout.sp * ctx.layout.tsp
    if sigma == 1:
        return []
    head_div = ctx.sharding.head_div
    if kind == "attention":
        kv = ctx.batch * ctx.seq * ctx.model.attention.kv_pair_width * ctx.act_bytes / head_div
        # Our executor gathers before attending (no ring attention yet): exposed. A ring-attention
        # implementation would mark these overlap="attention".
        return [
            Comm("all_gather", axis, kv, sigma, phase="fwd", block=kind, what="K/V all-gather"),
            Comm("all_gather", axis, kv, sigma, phase="bwd", block=kind, what="K/V re-gather"),
            Comm("reduce_scatter", axis, kv, sigma, phase="bwd", block=kind, what="dK/dV reduce-scatter"),
        ]
    if kind in ("mamba2", "mamba1"):
        summary, tail = ctx.mamba_shard_summary_bytes(head_div)
        return [
            Comm("send_recv", axis, tail, sigma, phase="fwd", block=kind, what="conv tail", line=True),
            Comm("all_gather", axis, sigma * summary, sigma, phase="fwd", block=kind, what="shard summaries"),
            Comm("send_recv", axis, tail, sigma, phase="bwd", block=kind, what="conv-tail grad", line=True),
            Comm("reduce_scatter", axis, sigma * summary, sigma, phase="bwd", block=kind, what="summary grads"),
        ]
    return []


def decode_comms(ctx, kind: str, axis: str = "sp") -> list[Comm]:
    """A decode step over KV shards: every shard's partial attention output and log-sum-exp (fp32),
    gathered and combined on each rank."""
    sigma = ctx.layout.sp * ctx.layout.tsp
    if kind != "attention" or sigma == 1:
        return []
    attn = ctx.model.attention
    partial = ctx.batch * (attn.out_width * ctx.act_bytes + attn.heads * 4) / ctx.sharding.head_div
    return [Comm("all_gather", axis, sigma * partial, sigma, block=kind, what="partial attention over KV shards")]

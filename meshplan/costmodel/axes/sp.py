"""The sequence axis, Σ ranks (sp: sequence / context split): tokens split Σ ways, weights replicated.

Each rank keeps the activations of its b·s/Σ tokens; attention reaches the other shards' K/V per layer
as the stack does (Stack.cp_comm_type: gathered, passed around a ring, or swapped for heads by
all-to-alls; a transient, exchanged again in backward rather than saved), and weight gradients are
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
        attn = ctx.model.attention
        kv = ctx.batch * ctx.seq * attn.kv_pair_width * ctx.act_bytes / head_div
        comm = exchange(ctx.layout, ctx.opts)
        if comm == "a2a":
            # Sequence for heads before the whole-sequence attention, heads for sequence after it; the
            # backward swaps the output's gradient and then dQ, dK, dV back. Not overlapped.
            local = ctx.batch * ctx.seq / sigma * ctx.act_bytes / head_div
            qkv, out = local * (attn.q_width + attn.kv_pair_width), local * attn.out_width
            return [
                Comm("all_to_all", axis, qkv, sigma, phase="fwd", block=kind, what="Q/K/V all-to-all (to heads)"),
                Comm("all_to_all", axis, out, sigma, phase="fwd", block=kind, what="output all-to-all (to tokens)"),
                Comm("all_to_all", axis, out, sigma, phase="bwd", block=kind, what="output-gradient all-to-all"),
                Comm("all_to_all", axis, qkv, sigma, phase="bwd", block=kind, what="dQ/dK/dV all-to-all"),
            ]
        # allgather: gathered before attending (meshplan's executor), exposed. p2p: the same bytes as a
        # ring of K/V blocks, each step's transfer beside the attention of the block in hand; its
        # backward passes K/V and their gradients around again (TE's AttnFuncWithCPAndKVP2P).
        overlap, how = ("attention", "ring") if comm == "p2p" else ("none", "all-gather")
        return [
            Comm("all_gather", axis, kv, sigma, phase="fwd", block=kind, what=f"K/V {how}", overlap=overlap),
            Comm("all_gather", axis, kv, sigma, phase="bwd", block=kind, what=f"K/V {how} again", overlap=overlap),
            Comm("reduce_scatter", axis, kv, sigma, phase="bwd", block=kind, what=f"dK/dV {how}", overlap=overlap),
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


def exchange(layout: Layout, opts) -> str:
    """How this layout's sequence shards reach each other's K/V (Stack.cp_comm_type's names): as the
    run's options say on the sp axis; TSP gathers its own, in zigzag."""
    return opts.cp_comm if layout.sp > 1 else "allgather"


def violation(model, layout: Layout, opts) -> str | None:
    """Why context parallelism cannot run as `opts` makes it, or None: Ulysses-style all-to-alls deal
    each rank whole heads (query and K/V heads alike, after tensor parallelism's split)."""
    if model.attention is None or exchange(layout, opts) != "a2a":
        return None
    tensor = layout.tensor_degree
    heads, kv_heads = model.attention.heads // tensor, model.attention.kv_heads // tensor
    if heads % layout.sp or kv_heads % layout.sp:
        return (
            f"--cp-comm-type a2a deals whole heads: sp={layout.sp} must divide the {heads} query and {kv_heads} "
            f"K/V heads a tensor rank holds; use --cp-comm-type p2p or allgather, or a smaller sp"
        )
    return None


def decode_comms(ctx, kind: str, axis: str = "sp") -> list[Comm]:
    """A decode step over KV shards: every shard's partial attention output and log-sum-exp (fp32),
    gathered and combined on each rank."""
    sigma = ctx.layout.sp * ctx.layout.tsp
    if kind != "attention" or sigma == 1:
        return []
    attn = ctx.model.attention
    partial = ctx.batch * (attn.out_width * ctx.act_bytes + attn.heads * 4) / ctx.sharding.head_div
    return [Comm("all_gather", axis, sigma * partial, sigma, block=kind, what="partial attention over KV shards")]

"""TP (Megatron): weights split T ways by heads / FFN columns; every rank sees every token.

Memory: Korthikanti et al. 2022 §4.2.1 — without Megatron-SP the full-width tensors (norm inputs,
QKV / MLP inputs, dropout masks) are replicated on every TP rank (the "10" in s·b·h·(10 + 24/T));
with Megatron-SP they are split along the sequence too (34/T).
"""

import math

from meshplan.costmodel.collectives import Comm
from meshplan.costmodel.layouts.base import Sharding
from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def sharding(layout: Layout, options: MemoryOptions):
    t = layout.tensor_degree
    return Sharding(
        weight_div=t, token_div=1, head_div=t, hidden_div=t if options.tp_sequence_parallel else 1, vocab_div=t
    )


INT8_GROUP = 128  # elements per fp32 scale in our int8 all-reduce (meshplan/kernels/quant.py)


def int8_block(opts, layout, kind: str) -> bool:
    """Whether this block's forward all-reduce runs in int8: TP-SSM's Mamba blocks, when asked for."""
    return opts.int8_allreduce and layout.tpssm > 1 and kind in ("mamba2", "mamba1")


def block_comms(ctx, kind: str, axis: str = "tp", int8_forward: bool = False):
    """Megatron TP: one all-reduce after the row-parallel projection (forward) and one of the input
    gradient after the column-parallel one (backward). Megatron-SP swaps each for an all-gather and a
    reduce-scatter of the same total size; the backward re-gathers the saved sequence shard.
    Mamba-1 adds the all-reduce of x_proj's output (dt, B, C come from all d_inner channels)."""
    t = ctx.layout.tensor_degree
    if t == 1 or kind == "hybrid_proj":
        return []
    e = ctx.act_bytes
    w_in, w_out = ctx.widths(kind)
    fwd_bytes = ctx.tokens * w_out * e
    if int8_forward:
        fwd_bytes = ctx.tokens * w_out * (1 + 4 / INT8_GROUP)
    bwd_bytes = ctx.tokens * w_in * e
    if ctx.opts.tp_sequence_parallel:
        out = [
            Comm("all_gather", axis, ctx.tokens * w_in * e, t, phase="fwd", block=kind, what="gather sequence shards"),
            Comm("reduce_scatter", axis, fwd_bytes, t, phase="fwd", block=kind, what="reduce-scatter output"),
            Comm("all_gather", axis, ctx.tokens * w_out * e, t, phase="bwd", block=kind, what="gather output grad"),
            Comm("all_gather", axis, ctx.tokens * w_in * e, t, phase="bwd", block=kind, what="re-gather input"),
            Comm("reduce_scatter", axis, bwd_bytes, t, phase="bwd", block=kind, what="reduce-scatter input grad"),
        ]
    elif int8_forward and t == 2:
        # meshplan.executor.comm.quantized_all_reduce on two ranks: the int8 tensors (and their scales)
        # all-gathered, dequantized and summed on each rank — or, over peer-mapped memory
        # (meshplan/executor/peer.py), each rank's tensor read by the other: the same bytes each way.
        out = [
            Comm("all_gather", axis, t * fwd_bytes, t, phase="fwd", block=kind, what="int8 all-reduce: all-gather"),
            Comm("all_reduce", axis, bwd_bytes, t, phase="bwd", block=kind, what="all-reduce input grad"),
        ]
    elif int8_forward:
        # On more ranks: int8 chunks (and their scales) all-to-all, summed in fp32 per rank,
        # re-quantized and all-gathered.
        out = [
            Comm("all_to_all", axis, fwd_bytes, t, phase="fwd", block=kind, what="int8 all-reduce: all-to-all"),
            Comm("all_gather", axis, fwd_bytes, t, phase="fwd", block=kind, what="int8 all-reduce: all-gather"),
            Comm("all_reduce", axis, bwd_bytes, t, phase="bwd", block=kind, what="all-reduce input grad"),
        ]
    else:
        out = [
            Comm("all_reduce", axis, fwd_bytes, t, phase="fwd", block=kind, what="all-reduce output"),
            Comm("all_reduce", axis, bwd_bytes, t, phase="bwd", block=kind, what="all-reduce input grad"),
        ]
    if kind == "mamba2" and math.gcd(t, ctx.model.mamba2.ngroups) < t:
        # B/C groups fewer than ranks: the gated RMSNorm's group spans ranks (sum of squares, fp32,
        # all-reduced forward, again in the recomputed forward, and in its backward), and the B/C
        # weights every rank holds get partial gradients, all-reduced once a step, after the
        # micro-batches have summed them (phase "step": the schedule counts it per step).
        m = ctx.model.mamba2
        share = t // math.gcd(t, m.ngroups)
        stats = ctx.tokens * 4 * max(1, m.ngroups * share // t)
        replicated = 2 * m.ngroups * m.d_state * (m.d_model + m.d_conv + 1) * ctx.grad_bytes
        out += [
            Comm("all_reduce", axis, stats, share, phase="fwd", block=kind, what="gated-norm sum of squares"),
            Comm("all_reduce", axis, stats, share, phase="bwd", block=kind, what="gated-norm (recompute)"),
            Comm("all_reduce", axis, stats, share, phase="bwd", block=kind, what="gated-norm grad"),
            Comm(
                "all_reduce",
                axis,
                replicated,
                share,
                phase="step",
                block=kind,
                what="replicated B/C grads",
                overlap="backward",
            ),
        ]
    if kind == "mamba1":
        x_dbl = ctx.tokens * ctx.model.mamba1.x_proj_width * e
        out += [
            Comm("all_reduce", axis, x_dbl, t, phase="fwd", block=kind, what="all-reduce x_proj (dt, B, C)"),
            Comm("all_reduce", axis, x_dbl, t, phase="bwd", block=kind, what="all-reduce x_proj grad"),
        ]
    return out

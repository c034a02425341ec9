"""The tensor axis, T ranks (tp, or tpssm for models with Mamba blocks): Megatron TP. Weights split T ways
by heads / FFN columns / Mamba heads and groups; every rank sees every token of its sequence shard.

Memory: Korthikanti et al. 2022 §4.2.1 — without Megatron-SP the full-width tensors (norm inputs,
QKV / MLP inputs, dropout masks) are replicated on every TP rank (the "10" in s·b·h·(10 + 24/T));
with Megatron-SP they are split along the sequence too (34/T). TP-SSM (Dutt et al., arXiv
2602.21144): Mamba heads, B/C groups and dt split T ways, so conv1d and the scan stay local; in_proj
column-parallel (z, x, B, C, dt), out_proj row-parallel; its forward all-reduce may run in int8.
The vocabulary: the embedding and the LM head are split by vocab rows (Megatron's vocab-parallel
embedding and cross-entropy).
"""

from __future__ import annotations

import math

from meshplan.costmodel.axes.base import Sharding
from meshplan.costmodel.blocks import BLOCKS
from meshplan.costmodel.blocks.hybrid_proj import adapter_down_params
from meshplan.costmodel.collectives import Comm
from meshplan.costmodel.device import Device
from meshplan.costmodel.options import MemoryOptions
from meshplan.kernels.launch import peer_slot_bytes
from meshplan.layout import Layout


def active(layout: Layout) -> bool:
    return layout.tensor_degree > 1


def name(layout: Layout) -> str:
    return "tpssm" if layout.tpssm > 1 else "tp"


def sharding(layout: Layout, options: MemoryOptions, kind: str | None = None) -> Sharding:
    t = layout.tensor_degree
    return Sharding(
        weight_div=t, token_div=1, head_div=t, hidden_div=t if options.tp_sequence_parallel else 1, vocab_div=t
    )


INT8_GROUP = 128  # elements per fp32 scale in our int8 all-reduce (meshplan/kernels/quant.py)


def int8_block(opts, layout, kind: str) -> bool:
    """Whether this block's forward all-reduce runs in int8: TP-SSM's Mamba blocks, when asked for."""
    return opts.int8_allreduce and layout.tpssm > 1 and kind in ("mamba2", "mamba1")


def int8_allreduce_kernels_s(elements: float, ranks: int, dev: Device) -> float:
    """HBM time on one rank of our int8 all-reduce's kernels (meshplan/kernels/quant.py) over a tensor
    of `elements`. Two ranks: quantize (bf16 in, int8 out), dequantize-sum (both int8 copies in, bf16
    out) — 3 + (2 + 2) bytes per element. More: quantize, dequantize-sum-requantize (the group's int8
    copies of this rank's 1/n in, 1/n out), dequantize (int8 in, bf16 out) — 3 + (1 + 1/n) + 3. The
    fp32 scales (4 B per 128) aside. Two ranks over peer-mapped memory (meshplan/executor/peer.py) read
    and write the same bytes. Launches and the collectives' latency are not in it: on NVLink over
    NCCL that fixed cost, not these bytes, made the int8 path slower on 4 ranks
    (benchmarks/results/quant-allreduce-h200x4.json); the 2-rank peer path issues in 33 us
    (quant-allreduce-peer-h200x2.json)."""
    per_element = 3 + (2 + 2) if ranks == 2 else 3 + (1 + 1 / ranks) + 3
    return elements * per_element / dev.rated_hbm


def int8_kernels_s(ctx, kind: str, tokens: float, dev) -> float:
    """HBM seconds of the int8 all-reduce's own kernels in a block's forward (0 unless it runs)."""
    if not int8_block(ctx.opts, ctx.layout, kind):
        return 0.0
    return int8_allreduce_kernels_s(tokens * ctx.model.d_model, ctx.layout.tpssm, dev)


def uses_int8_peer_buffer(layout: Layout, opts) -> bool:
    """The int8 all-reduce over peer-mapped memory: TP-SSM on two ranks, without Megatron-SP."""
    return opts.int8_allreduce and layout.tpssm == 2 and not opts.tp_sequence_parallel


def int8_peer_buffer_bytes(model, layout: Layout, opts: MemoryOptions, tokens: float) -> float:
    """The int8 all-reduce's double buffer over peer-mapped memory (meshplan/executor/peer.py), which
    the executor takes for TP-SSM on two ranks: two slots sized for a block output of `tokens` ×
    d_model (meshplan.kernels.launch.peer_slot_bytes). It stays allocated once made. More ranks, or
    bf16, take NCCL's path and hold none. A host without peer access (NCCL_P2P_DISABLE=1) does not
    take this path either: there this over-counts by these bytes."""
    if not (uses_int8_peer_buffer(layout, opts) and model.mamba_layers):
        return 0.0
    elements = -(-tokens * model.d_model // 256) * 256  # padded to the 2 ranks × 128-element groups
    return 2.0 * peer_slot_bytes(elements)


def block_comms(ctx, kind: str):
    """Megatron TP's collectives of one block on the tensor axis (a Mamba block's forward all-reduce
    in int8 when asked)."""
    if not active(ctx.layout):
        return []
    return _layer_comms(ctx, kind, name(ctx.layout), int8_block(ctx.opts, ctx.layout, kind))


def _layer_comms(ctx, kind: str, axis: str, int8_forward: bool):
    """Megatron TP: one all-reduce after the row-parallel projection (forward) and one of the input
    gradient after the column-parallel one (backward). Megatron-SP swaps each for an all-gather and a
    reduce-scatter of the same total size; the backward re-gathers the saved sequence shard.
    Mamba-1 adds the all-reduce of x_proj's output (dt, B, C come from all d_inner channels)."""
    t = ctx.layout.tensor_degree
    if t > 1 and kind == "hybrid_proj":
        return _adapter_down_comms(ctx, axis, t)
    if t == 1 or not BLOCKS[kind].tensor_comms:
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
    attn = ctx.model.attention
    if kind == "attention" and attn is not None and attn.qk_norm and attn.qk_norm == 2 * attn.head_dim:
        # Per-head query/key norms (Qwen3's): every rank holds the (head_dim,) scales whole and gets their
        # gradients from its own heads, summed over the axis once a step (executor: ParallelAttention's
        # partial_grads).
        out.append(
            Comm(
                "all_reduce",
                axis,
                attn.qk_norm * ctx.grad_bytes,
                t,
                phase="step",
                block=kind,
                what="query/key norm grads",
                overlap="backward",
            )
        )
    if kind == "mamba1":
        x_dbl = ctx.tokens * ctx.model.mamba1.x_proj_width * e
        out += [
            Comm("all_reduce", axis, x_dbl, t, phase="fwd", block=kind, what="all-reduce x_proj (dt, B, C)"),
            Comm("all_reduce", axis, x_dbl, t, phase="bwd", block=kind, what="all-reduce x_proj grad"),
        ]
    return out


def _adapter_down_comms(ctx, axis: str, t: int) -> list[Comm]:
    """A Zamba2 invocation's LoRA adapters on the tensor axis (executor: hybrid.HybridProjection): each up
    projection's rows split with the projection it adds to, each down projection whole on every rank
    reading the replicated input, its gradient — from the rank's own up rows — summed over the axis
    once a step. The invocation's linear reads the block's summed output whole: no collective."""
    downs = adapter_down_params(ctx.model)
    if not downs:
        return []
    return [
        Comm(
            "all_reduce",
            axis,
            downs * ctx.grad_bytes,
            t,
            phase="step",
            block="hybrid_proj",
            what="adapter down-projection grads",
            overlap="backward",
        )
    ]


def end_comms(ctx, training: bool) -> list[Comm]:
    """The vocab-parallel embedding's all-reduce, the loss's statistics over the split vocabulary (row
    max, then sum of exponentials and the target's logit, fp32), and the LM head input's gradient."""
    layout = ctx.layout
    t = layout.tensor_degree
    if t == 1:
        return []
    e, h = ctx.act_bytes, ctx.model.d_model
    axis = name(layout)
    # The loss takes every token's logits (training); inference only the last position's.
    rows = ctx.tokens if training else ctx.batch
    # A prefill's last position is on one rank of a sequence split: only its tensor group predicts.
    share = 1 / layout.token_shard_degree if ctx.opts.mode == "prefill" else 1.0
    out = [
        Comm("all_reduce", axis, ctx.tokens * h * e, t, block="embedding", what="vocab-parallel embedding"),
        Comm("all_reduce", axis, rows * 4, t, block="logits", what="logits row max (fp32)", ranks_share=share),
        Comm(
            "all_reduce",
            axis,
            rows * (2 if training else 1) * 4,
            t,
            block="logits",
            what="sum of exponentials" + (" and target logit (fp32)" if training else " (fp32)"),
            ranks_share=share,
        ),
    ]
    if training:
        out.append(
            Comm("all_reduce", axis, ctx.tokens * h * e, t, phase="bwd", block="logits", what="LM head input grad")
        )
    return out

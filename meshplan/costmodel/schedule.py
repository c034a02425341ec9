"""The whole step's communication: per-block schedules from the layout modules, plus what runs once
per micro-batch (embedding / logits, pipeline sends, ZeRO-3 gathers) and once per step (gradient sync).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from meshplan.costmodel.blocks import block_params
from meshplan.costmodel.collectives import Comm
from meshplan.costmodel.layouts import ScheduleContext, Sharding, block_comms, sharding_for
from meshplan.costmodel.memory import mean_local_params
from meshplan.costmodel.options import CostOptions
from meshplan.layout import Layout, grad_group
from meshplan.models import ModelSpec


@dataclass(frozen=True)
class StepSchedule:
    per_block: dict[str, tuple[Comm, ...]]  # one invocation of each block kind
    invocations: dict[str, float]  # block invocations per micro-batch on one pipeline stage
    per_microbatch: tuple[Comm, ...]
    per_step: tuple[Comm, ...]
    microbatches: int

    def all_comms(self):
        """(comm, how many times it runs per step on one rank)."""
        for kind, comms in self.per_block.items():
            for c in comms:
                yield c, self.invocations[kind] * self.microbatches
        for c in self.per_microbatch:
            yield c, self.microbatches
        for c in self.per_step:
            yield c, 1

    @property
    def comm_bytes_per_step(self) -> float:
        return sum(c.bytes_per_rank * n for c, n in self.all_comms())

    def bytes_by_kind_and_axis(self, message: bool = False) -> dict[str, float]:
        """Bytes per rank per step keyed "kind/axis"; `message=True` sums buffer sizes instead of volume."""
        out: dict[str, float] = defaultdict(float)
        for c, n in self.all_comms():
            out[f"{c.kind}/{c.axis}"] += (c.message_bytes_per_rank if message else c.bytes_per_rank) * n
        return dict(out)


def last_ready_params(model: ModelSpec, sh: Sharding, embeddings: bool) -> float:
    """This rank's parameters whose gradients the backward completes last: the first block's (a dense
    layer's attention, an SSM layer's mixer) and, with embeddings, the input embedding's. Their
    reduction starts as the backward ends, with nothing left to hide behind (the executor starts each
    weight's as its gradient is ready, in the order they became ready:
    meshplan.executor.parallelize.GradientSync; DDP's last bucket likewise)."""
    first = model.block_invocations()[0][0]
    return (block_params(model, first) + (model.vocab * model.d_model if embeddings else 0)) / sh.weight_div


def _embedding_comms(ctx: ScheduleContext, training: bool) -> list[Comm]:
    model, layout = ctx.model, ctx.layout
    e, h = ctx.act_bytes, model.d_model
    out: list[Comm] = []
    t = layout.tensor_degree
    if t > 1:
        axis = "tpssm" if layout.tpssm > 1 else "tp"
        # The loss takes every token's logits (training); inference only the last position's.
        rows = ctx.tokens if training else ctx.batch
        # A prefill's last position is on one rank of a sequence split: only its tensor group predicts.
        share = 1 / layout.token_shard_degree if ctx.opts.mode == "prefill" else 1.0
        out += [
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
    if training and layout.pp > 1 and model.tied_embeddings:
        # A tied matrix's two copies, on the first and last stages, sum their gradients once a step.
        out.append(
            Comm(
                "all_reduce",
                "pp_ends",
                model.vocab * h * ctx.grad_bytes / ctx.sharding.weight_div,
                2,
                phase="step",
                block="embedding",
                what="tied embedding grads (first and last stage)",
                ranks_share=2 / layout.pp,
            )
        )
    if layout.tsp > 1:
        d = layout.tsp
        shard = model.vocab * h * ctx.param_bytes / d
        phases = ("fwd", "bwd") if training else ("fwd",)
        out += [
            Comm(
                "send_recv",
                "tsp",
                shard,
                d,
                count=d - 1,
                phase=p,
                block="logits",
                what="LM head shard ring",
                overlap="gemm",
            )
            for p in phases
        ]
        out += [
            Comm(
                "all_to_all",
                "tsp",
                ctx.tokens * h * e,
                d,
                phase=p,
                block="embedding",
                what="embedding rows to token owners",
            )
            for p in phases
        ]
        if training:
            out.append(
                Comm(
                    "reduce_scatter",
                    "tsp",
                    model.vocab * h * ctx.grad_bytes,
                    d,
                    phase="bwd",
                    block="logits",
                    what="LM head grad reduce-scatter",
                    overlap="backward",
                )
            )
    # The embedding runs on the first stage and the head on the last: each on 1/pp of the ranks.
    return [c if c.axis == "pp_ends" else replace(c, ranks_share=c.ranks_share / layout.pp) for c in out]


def step_schedule(
    model: ModelSpec, layout: Layout, seq: int, batch: int, opts: CostOptions, *, embeddings: bool = True
) -> StepSchedule:
    """Every collective of one step (train), one prefill, or one decoded token, on one rank.

    `embeddings=False` leaves out the embedding and LM head (the executor's bare layer stack)."""
    sh = sharding_for(layout, opts)
    training = opts.training
    decode = opts.mode == "decode"
    if decode:
        return _decode_schedule(model, layout, seq, batch, opts, embeddings)
    ctx = ScheduleContext(model, layout, sh, batch, seq, opts)
    keep = (lambda c: True) if training else (lambda c: c.phase == "fwd")
    per_block = {kind: tuple(c for c in block_comms(ctx, kind) if keep(c)) for kind, _ in model.block_invocations()}
    invocations = {kind: n / layout.pp for kind, n in model.block_invocations()}
    # A block's once-a-step comms (gradients summed over the micro-batches first): one per block held.
    once = [
        replace(c, count=c.count * invocations[kind]) for kind, cs in per_block.items() for c in cs if c.phase == "step"
    ]
    per_block = {kind: tuple(c for c in cs if c.phase != "step") for kind, cs in per_block.items()}
    ends = [c for c in _embedding_comms(ctx, training) if keep(c)] if embeddings else []
    per_mb = [c for c in ends if c.phase != "step"]
    if layout.pp > 1:
        per_mb += _pipeline_comms(ctx, training)
    per_step: list[Comm] = once + [c for c in ends if c.phase == "step"]
    axis, group = grad_group(layout)
    if training and layout.tsp > 1:
        # TSP keeps the norm scales on every rank; each rank's gradient comes from its own tokens.
        norms = model.norm_params(embeddings) / layout.pp * ctx.grad_bytes
        per_step.append(
            Comm(
                "all_reduce",
                "tsp",
                norms,
                layout.tsp,
                phase="step",
                block="model",
                what="norm-scale grads",
                overlap="backward",
            )
        )
    if group > 1 and (training or layout.zero == 3):
        local = mean_local_params(model, sh, layout.pp, embeddings)
        p_bytes, g_bytes = local * ctx.param_bytes, local * ctx.grad_bytes
        zero = layout.zero if layout.dp > 1 else 0
        # Under pipeline stages the micro-batches' gradients stay sharded only if each micro-batch
        # reduce-scatters its own (ZeRO 2 as ZeRO 3 always does): once per micro-batch there.
        per_mb_grads = zero == 3 or (zero == 2 and layout.pp > 1)
        if per_mb_grads and training:
            per_mb.append(
                Comm(
                    "reduce_scatter",
                    axis,
                    g_bytes,
                    group,
                    phase="bwd",
                    block="model",
                    what=f"ZeRO-{zero} grad reduce-scatter",
                    overlap="backward",
                )
            )
        if zero == 3:
            per_mb.append(
                Comm("all_gather", axis, p_bytes, group, phase="fwd", block="model", what="ZeRO-3 gather params")
            )
            if training:
                per_mb.append(
                    Comm("all_gather", axis, p_bytes, group, phase="bwd", block="model", what="ZeRO-3 re-gather params")
                )
        elif per_mb_grads:  # ZeRO 2 under pp: its gradients went per micro-batch
            per_step.append(
                Comm("all_gather", axis, p_bytes, group, phase="step", block="model", what="updated params all-gather")
            )
        else:
            tail = min(g_bytes, last_ready_params(model, sh, embeddings) * ctx.grad_bytes)
            kind = "reduce_scatter" if zero >= 1 else "all_reduce"
            what = "grad reduce-scatter" if zero >= 1 else "grad all-reduce"
            per_step += [
                Comm(kind, axis, g_bytes - tail, group, phase="step", block="model", what=what, overlap="backward"),
                Comm(kind, axis, tail, group, phase="step", block="model", what=what + " of the last-ready weights"),
            ]
            if zero >= 1:
                per_step.append(
                    Comm(
                        "all_gather",
                        axis,
                        p_bytes,
                        group,
                        phase="step",
                        block="model",
                        what="updated params all-gather",
                    )
                )
    microbatches = opts.steps_for(layout.dp, layout.pp, batch) if training else 1
    return StepSchedule(per_block, invocations, tuple(per_mb), tuple(per_step), microbatches)


def _pipeline_comms(ctx: ScheduleContext, training: bool) -> list[Comm]:
    """A stage's sends of one micro-batch: its output forward, its input's gradient backward — once a
    model chunk under the interleaved schedule. Along a line of stages the last sends nothing forward,
    the first nothing backward. With scatter/gather (Narayanan et al. 2021 §4.1) each of the t tensor
    ranks sends 1/t of the (replicated) activation across the network and the receiving stage
    all-gathers it over NVLink; with Megatron-SP the activation is already split t ways."""
    model, layout, opts = ctx.model, ctx.layout, ctx.opts
    t = layout.tensor_degree
    act = ctx.tokens * model.d_model * ctx.act_bytes
    split = opts.tp_sequence_parallel and t > 1
    scatter = opts.scatter_gather and t > 1 and not split
    if split or scatter:
        act /= t
    chunks = opts.chunks
    phases = ("fwd", "bwd") if training else ("fwd",)
    out = []
    for phase in phases:
        what = "activations to next stage" if phase == "fwd" else "activation grads to previous stage"
        out.append(
            Comm("send_recv", "pp", act, layout.pp, count=chunks, phase=phase, block="model", what=what, line=True)
        )
        if scatter:
            axis = "tpssm" if layout.tpssm > 1 else "tp"
            out.append(
                Comm(
                    "all_gather",
                    axis,
                    act * t,
                    t,
                    count=chunks,
                    phase=phase,
                    block="model",
                    what="scatter/gather: re-assemble the received activations",
                )
            )
    return out


def _decode_schedule(
    model: ModelSpec, layout: Layout, context: int, batch: int, opts: CostOptions, embeddings: bool = True
) -> StepSchedule:
    """One new token per sequence: queries are not split along the sequence, the KV cache is. No
    message depends on the `context` length (weights, one token's activations, partial outputs).

    TP all-reduces b·h per block; SP/TSP combine partial attention over their KV shards with an
    all-reduce of the partial outputs and log-sum-exps; TSP still streams every weight shard."""
    sh = replace(sharding_for(layout, opts), token_div=1)
    ctx = ScheduleContext(model, layout, sh, batch, 1, opts)
    sigma = layout.sp * layout.tsp
    per_block = {}
    for kind, _ in model.block_invocations():
        # Decode needs neither the K/V gather nor SP Mamba's tails and summaries (its state is whole);
        # TSP's Mamba block still gathers its weight shards along the ring.
        comms = [
            c
            for c in block_comms(ctx, kind)
            if c.phase == "fwd"
            and c.kind != "all_gather"
            and not (c.kind == "send_recv" and c.line and kind in ("mamba2", "mamba1"))
        ]
        if kind == "attention" and sigma > 1:
            # Every shard's partial output and log-sum-exp (fp32), gathered and combined on each rank.
            attn = model.attention
            partial = batch * (attn.q_width * ctx.act_bytes + attn.heads * 4) / sh.head_div
            comms.append(
                Comm(
                    "all_gather",
                    "tsp" if layout.tsp > 1 else "sp",
                    sigma * partial,
                    sigma,
                    block=kind,
                    what="partial attention over KV shards",
                )
            )
        per_block[kind] = tuple(comms)
    invocations = {kind: n / layout.pp for kind, n in model.block_invocations()}
    per_mb = list(_embedding_comms(ctx, False)) if embeddings else []
    if layout.pp > 1:
        per_mb.append(
            Comm(
                "send_recv",
                "pp",
                batch * model.d_model * ctx.act_bytes,
                layout.pp,
                block="model",
                what="activations to next stage",
                line=True,
            )
        )
    axis, group = grad_group(layout)
    if layout.zero == 3 and layout.dp > 1 and group > 1:  # every weight gathered for every token
        p_bytes = mean_local_params(model, sh, layout.pp, embeddings) * ctx.param_bytes
        per_mb.append(Comm("all_gather", axis, p_bytes, group, block="model", what="ZeRO-3 gather params"))
    return StepSchedule(per_block, invocations, tuple(per_mb), (), 1)

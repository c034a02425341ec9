"""The whole step's communication: per-block schedules from the layout modules, plus what runs once
per micro-batch (embedding / logits, pipeline sends, ZeRO-3 gathers) and once per step (gradient sync).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from meshplan.costmodel import axes
from meshplan.costmodel.axes import PlanContext, Sharding, plan_context
from meshplan.costmodel.blocks import BLOCKS, block_params
from meshplan.costmodel.collectives import Comm
from meshplan.costmodel.memory import mean_local_params, split_apart_params
from meshplan.costmodel.options import CostOptions
from meshplan.layout import Layout
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


def step_schedule(
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    opts: CostOptions,
    *,
    embeddings: bool = True,
    ctx: PlanContext | None = None,
) -> StepSchedule:
    """Every collective of one step (train), one prefill, or one decoded token, on one rank.

    `embeddings=False` leaves out the embedding and LM head (the executor's bare layer stack)."""
    ctx = ctx or plan_context(model, layout, seq, batch, opts)
    sh = ctx.sharding
    training = opts.training
    if opts.mode == "decode":
        return _decode_schedule(ctx, embeddings)
    keep = (lambda c: True) if training else (lambda c: c.phase == "fwd")
    per_block = {
        kind: tuple(c for c in axes.block_comms(ctx, kind) if keep(c)) for kind, _ in model.block_invocations()
    }
    invocations = {kind: n / layout.pp for kind, n in model.block_invocations()}
    # A block's once-a-step comms (gradients summed over the micro-batches first): one per block held.
    once = [
        replace(c, count=c.count * invocations[kind]) for kind, cs in per_block.items() for c in cs if c.phase == "step"
    ]
    per_block = {kind: tuple(c for c in cs if c.phase != "step") for kind, cs in per_block.items()}
    ends = [c for c in axes.end_comms(ctx, training) if keep(c)] if embeddings else []
    per_mb = [c for c in ends if c.phase != "step"] + axes.pp.microbatch_comms(ctx, training)
    per_step: list[Comm] = once + [c for c in ends if c.phase == "step"] + axes.tsp.step_comms(ctx, embeddings)
    per_step += axes.pp.step_comms(ctx, training)  # a Zamba2's shared copies on several stages
    data_mb, data_step = axes.dp.comms(
        ctx,
        mean_local_params(model, sh, layout.pp, embeddings, ctx.by_kind),
        last_ready_params(model, sh, embeddings),
        experts=split_apart_params(model, ctx.by_kind, "experts", 1 / layout.pp),
    )
    per_mb += data_mb
    per_step += data_step
    microbatches = opts.steps_for(layout.dp, layout.pp, batch) if training else 1
    return StepSchedule(per_block, invocations, tuple(per_mb), tuple(per_step), microbatches)


def _decode_schedule(plan: PlanContext, embeddings: bool = True) -> StepSchedule:
    """One new token per sequence: queries are not split along the sequence, the KV cache is. No
    message depends on the `context` length (weights, one token's activations, partial outputs).

    TP all-reduces b·h per block; SP/TSP combine partial attention over their KV shards with an
    all-reduce of the partial outputs and log-sum-exps; TSP still streams every weight shard."""
    model, layout = plan.model, plan.layout
    sh = replace(plan.sharding, token_div=1)
    ctx = replace(plan, sharding=sh, seq=1)
    per_block = {}
    for kind, _ in model.block_invocations():
        # Decode needs neither the K/V gather nor SP Mamba's tails and summaries (its state is whole);
        # TSP's Mamba block still gathers its weight shards along the ring.
        recurrent = BLOCKS[kind].recurrent
        comms = [
            c
            for c in axes.block_comms(ctx, kind)
            if c.phase == "fwd"
            and (c.kind != "all_gather" or c.axis in ("etp", "etp+ep"))  # the experts' token gathers stay
            and not (c.kind == "send_recv" and c.line and recurrent)
        ]
        per_block[kind] = tuple(comms + axes.decode_comms(ctx, kind))
    invocations = {kind: n / layout.pp for kind, n in model.block_invocations()}
    per_mb = list(axes.end_comms(ctx, False)) if embeddings else []
    per_mb += axes.pp.decode_comms(ctx)
    per_mb += axes.dp.decode_comms(ctx, mean_local_params(model, sh, layout.pp, embeddings, ctx.by_kind))
    return StepSchedule(per_block, invocations, tuple(per_mb), (), 1)

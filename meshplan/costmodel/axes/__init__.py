"""Axes that compose (docs/design.md §1, §8): one module per parallel axis — tp (and tpssm, the same
split for models with Mamba blocks), sp, tsp, pp, dp with ZeRO — each saying what it splits of every
block kind (`sharding`) and which collectives it adds to a block, to the embedding and head, to a
micro-batch and to a step. A layout's sharding of a block kind is the product of its axes' splits;
its collectives are theirs in the axes' order. The twins in the executor are split by block kind:

    costmodel/axes        executor/layouts
    tp, sp          ->    dense (attention and MLP sublayers), mamba.ParallelMamba2
    tsp             ->    tsp (TSP attention and MLP sublayers), tsp_mamba.TSPMamba2
    (the ends)      ->    vocab.ParallelEmbedding, vocab.ParallelHead

What each rank holds there is what is counted here (tests/test_layout_tables.py checks the weight
splits against `Sharding.weight_div`).
"""

from __future__ import annotations

import functools
from dataclasses import fields

from meshplan.costmodel.axes import dp, ep, pp, sp, tp, tsp
from meshplan.costmodel.axes.base import PlanContext, Sharding
from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout, sp_zigzag

__all__ = [
    "PlanContext",
    "Sharding",
    "block_comms",
    "dp",
    "end_comms",
    "ep",
    "own_shardings",
    "plan_context",
    "pp",
    "sharding_for",
    "sp",
    "tp",
    "tsp",
]

# The model-parallel axes, in the order their collectives are listed (the tensor axis's before the
# sequence axis's, as the executor runs them).
MODEL_AXES = (tp, sp, tsp, ep)


def sharding_for(layout: Layout, options: MemoryOptions, kind: str | None = None) -> Sharding:
    """How `layout` divides a `kind` block's weights, tokens and activations: the product of its
    active axes' splits (the same for every kind until an axis splits one kind alone). Of the options
    only Megatron-SP (the tensor axis's) changes it."""
    return _sharding(layout, options.tp_sequence_parallel, kind)


@functools.lru_cache(maxsize=65536)
def _sharding(layout: Layout, tp_sequence_parallel: bool, kind: str | None) -> Sharding:
    options = MemoryOptions(tp_sequence_parallel=tp_sequence_parallel)
    out = Sharding(1, 1, 1, 1, 1)
    for axis in MODEL_AXES:
        if axis.active(layout):
            out = _compose(out, axis.sharding(layout, options, kind))
    if kind == "experts" and ep.active(layout):  # the experts' own decomposition of the same ranks
        return ep.expert_sharding(out, layout)
    return out


def _compose(a: Sharding, b: Sharding) -> Sharding:
    return Sharding(
        **{
            f.name: (getattr(a, f.name) or getattr(b, f.name))
            if f.type in ("bool", bool)
            else getattr(a, f.name) * getattr(b, f.name)
            for f in fields(Sharding)
        }
    )


def block_comms(ctx: PlanContext, kind: str):
    """The collectives of one invocation of a `kind` block, forward and backward, on every axis."""
    return [c for axis in MODEL_AXES if axis.active(ctx.layout) for c in axis.block_comms(ctx, kind)]


def end_comms(ctx: PlanContext, training: bool):
    """The embedding's and the LM head's collectives (on the pipeline's end stages)."""
    comms = tp.end_comms(ctx, training) + pp.end_comms(ctx, training) + tsp.end_comms(ctx, training)
    return pp.on_end_stages(comms, ctx.layout)


def decode_comms(ctx: PlanContext, kind: str):
    """What a decode step adds to a block on the sequence axes: combining partial attention."""
    return sp.decode_comms(ctx, kind, axis="tsp" if tsp.active(ctx.layout) else "sp")


def attention_split(layout: Layout, seq: int, attention_only: bool, zigzag_option: bool) -> tuple[float, int]:
    """(the causal fraction of the keys the slowest rank's queries see, the ranks a zigzag split deals
    the keys over — 0 for none). Contiguous sequence shards are not balanced under a causal mask: the
    last shard's queries see nearly every key, and every rank waits for it (measured:
    benchmarks/results/validation-h200-run2-x2.json). A zigzag split — TSP's, and SP's for
    attention-only stacks (meshplan.layout.sp_zigzag) — gives every rank the same causal work."""
    balanced = zigzag_option and sp_zigzag(layout, seq, attention_only)
    causal = 1 - 1 / (2 * layout.sp) if sp.active(layout) and not balanced else 0.5
    parts = layout.tsp if tsp.active(layout) else layout.sp if balanced else 0
    return causal, parts


def plan_context(model, layout: Layout, seq: int, batch: int, opts) -> PlanContext:
    """The plan's context, its sharding computed here once (the layout and sequence are checked by the
    caller: meshplan.predict.predict, the planner's enumerate_layouts)."""
    base = sharding_for(layout, opts)
    return PlanContext(model, layout, base, batch, seq, opts, own_shardings(model, layout, opts, base))


def own_shardings(model, layout: Layout, opts, base: Sharding) -> dict:
    """The block kinds an axis splits apart from the rest (`base`), each with its own sharding (made
    once a model, layout and Megatron-SP setting: read it, do not change it)."""
    return _own_shardings(model, layout, opts.tp_sequence_parallel, base)


@functools.lru_cache(maxsize=16384)
def _own_shardings(model, layout: Layout, tp_sequence_parallel: bool, base: Sharding) -> dict:
    kinds = {kind for blocks in model.layer_blocks() for kind in blocks}
    return {k: s for k in sorted(kinds) if (s := _sharding(layout, tp_sequence_parallel, k)) != base}

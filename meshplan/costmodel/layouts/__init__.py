"""How each layout splits weights, tokens and activations: one module per layout.

`sharding_for(layout, options)` returns the divisors the memory model applies; `block_comms` the
collectives of one block. The modules' twins in the executor are split by block kind, not by layout:

    costmodel/layouts     executor/layouts
    tp, sp, tpsp    ->    dense.ParallelDense          (dense blocks; the tensor and/or sequence axis)
    tpssm, sp, tpsp ->    mamba.ParallelMamba2         (Mamba-2 blocks; TP-SSM and/or the sequence axis)
    tsp             ->    tsp.TSPDense, tsp_mamba.TSPMamba2
    (the ends)      ->    vocab.ParallelEmbedding, vocab.ParallelHead

What each rank holds there is what is counted here (tests/test_layout_tables.py checks the weight
splits against `Sharding.weight_div`).
"""

from __future__ import annotations

from meshplan.costmodel.layouts import sp, tp, tpsp, tpssm, tsp
from meshplan.costmodel.layouts.base import ScheduleContext, Sharding
from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout

__all__ = ["ScheduleContext", "Sharding", "block_comms", "sharding_for"]

_MODULES = {"tp": tp, "sp": sp, "tp+sp": tpsp, "tpssm+sp": tpsp, "tsp": tsp, "tpssm": tpssm}


def sharding_for(layout: Layout, options: MemoryOptions) -> Sharding:
    if layout.kind == "none":
        return Sharding(1, 1, 1, 1, 1)
    return _MODULES[layout.kind].sharding(layout, options)


def block_comms(ctx: ScheduleContext, kind: str):
    """The collectives of one invocation of a block, forward and backward, for the layout."""
    module = _MODULES.get(ctx.layout.kind)
    return module.block_comms(ctx, kind) if module else []

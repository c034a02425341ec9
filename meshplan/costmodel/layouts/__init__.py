"""How each layout splits weights, tokens and activations: one module per layout.

`sharding_for(layout, options)` returns the divisors the memory model applies. The modules are the
twins of `meshplan/executor/layouts/` (what each rank holds there is what is counted here).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


@dataclass(frozen=True)
class Sharding:
    weight_div: int  # each layer's weights (and grads, optimizer state) split this many ways
    token_div: int  # tokens per GPU = b·s / token_div
    head_div: int  # activations between a column- and a row-parallel projection (heads, F·h, d_inner)
    hidden_div: int  # extra split of full-width activations (Megatron-SP's T); tokens already / token_div
    vocab_div: int  # vocab-parallel logits (TP)
    gathers_kv: bool = False  # the whole sequence's K/V is gathered per attention layer
    streams_weights: bool = False  # TSP: other ranks' weight shards pass through each rank


def sharding_for(layout: Layout, options: MemoryOptions) -> Sharding:
    from meshplan.costmodel.layouts import sp, tp, tpsp, tpssm, tsp

    kind = layout.kind
    if kind == "none":
        return Sharding(1, 1, 1, 1, 1)
    module = {"tp": tp, "sp": sp, "tp+sp": tpsp, "tpssm+sp": tpsp, "tsp": tsp, "tpssm": tpssm}[kind]
    return module.sharding(layout, options)

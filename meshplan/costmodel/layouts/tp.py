"""TP (Megatron): weights split T ways by heads / FFN columns; every rank sees every token.

Memory: Korthikanti et al. 2022 §4.2.1 — without Megatron-SP the full-width tensors (norm inputs,
QKV / MLP inputs, dropout masks) are replicated on every TP rank (the "10" in s·b·h·(10 + 24/T));
with Megatron-SP they are split along the sequence too (34/T).
"""

from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def sharding(layout: Layout, options: MemoryOptions):
    from meshplan.costmodel.layouts import Sharding

    t = layout.tensor_degree
    return Sharding(weight_div=t, token_div=1, head_div=t, hidden_div=t if options.tp_sequence_parallel else 1,
                    vocab_div=t)

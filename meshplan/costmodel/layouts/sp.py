"""SP (sequence / context split): tokens split Σ ways, weights replicated.

Each rank keeps the activations of its b·s/Σ tokens; attention gathers the whole sequence's K/V per
layer (a transient; re-gathered in backward rather than saved), and weight gradients are
all-reduced over Σ once per step.
"""

from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def sharding(layout: Layout, options: MemoryOptions):
    from meshplan.costmodel.layouts import Sharding

    return Sharding(weight_div=1, token_div=layout.sp, head_div=1, hidden_div=1, vocab_div=1, gathers_kv=True)

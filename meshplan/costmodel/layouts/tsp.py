"""TSP (Shyam, Golubeva, Anthony — arXiv 2604.26294): tensor and sequence folded onto one axis D.

Each rank owns 1/D of every weight matrix and 1/D of the tokens. Attention: the packed
W_Q,W_K,W_V,W_O shards are broadcast in turn and K/V are all-gathered in zigzag order; gated MLP:
the W_gate,W_up,W_down shards circulate in a ring, overlapped with the GEMMs, with the partial
outputs accumulated locally (no all-reduce). So weight memory is TP's at degree D and activation
memory is SP's at degree D; the extra is in flight: double-buffered weight shards and the gathered K/V.
"""

from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def sharding(layout: Layout, options: MemoryOptions):
    from meshplan.costmodel.layouts import Sharding

    d = layout.tsp
    return Sharding(weight_div=d, token_div=d, head_div=1, hidden_div=1, vocab_div=1, gathers_kv=True,
                    streams_weights=True)

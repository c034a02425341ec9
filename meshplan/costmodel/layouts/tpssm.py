"""TP-SSM (Dutt et al., arXiv 2602.21144): Mamba heads, B/C groups and dt split T ways, so conv1d and
the scan stay local; in_proj column-parallel (segment by segment: z, x, B, C, dt), out_proj
row-parallel. Attention / MLP blocks of a hybrid model use Megatron TP on the same axis.

Memory is TP's: the in_proj input and norm input are full width on every rank, everything between
in_proj and out_proj is split by T.
"""

from meshplan.costmodel.layouts import tp
from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def sharding(layout: Layout, options: MemoryOptions):
    return tp.sharding(layout, options)


def block_comms(ctx, kind: str):
    """TP's collectives on the tpssm axis; a Mamba block's forward all-reduce may be int8."""
    return tp.block_comms(ctx, kind, axis="tpssm", int8_forward=tp.int8_block(ctx.opts, ctx.layout, kind))

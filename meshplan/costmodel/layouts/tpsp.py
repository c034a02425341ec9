"""TP+SP: two orthogonal mesh axes T × Σ. Weights split by T, tokens by Σ; the TP rules apply on the
T axis to tokens already split by Σ, and the K/V gather on the Σ axis moves heads already split by T.
"""

from meshplan.costmodel.layouts import sp, tp
from meshplan.costmodel.layouts.base import Sharding
from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def sharding(layout: Layout, options: MemoryOptions):
    t = layout.tensor_degree
    return Sharding(
        weight_div=t,
        token_div=layout.sp,
        head_div=t,
        hidden_div=t if options.tp_sequence_parallel else 1,
        vocab_div=t,
        gathers_kv=True,
    )


def block_comms(ctx, kind: str):
    """TP's collectives on the T axis (tokens already split by Σ) and SP's on the Σ axis."""
    axis = "tpssm" if ctx.layout.tpssm > 1 else "tp"
    return tp.block_comms(
        ctx, kind, axis=axis, int8_forward=tp.int8_block(ctx.opts, ctx.layout, kind)
    ) + sp.block_comms(ctx, kind)

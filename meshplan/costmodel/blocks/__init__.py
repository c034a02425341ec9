"""Block kinds that plug in (docs/design.md §8): one module per kind — attention, dense MLP, Mamba-2,
Mamba-1, Zamba2's per-invocation projection, a mixture of experts' router, routed experts and shared
experts — each saying, for the cost model, its parameters, projections, memory-bound bytes, saved
tensors and its own kernels, transients, decode traffic and recompute (blocks.base.BlockKind). The
cost model asks BLOCKS[kind] rather than naming kinds."""

from __future__ import annotations

import functools

from meshplan.costmodel.blocks.attention import ATTENTION
from meshplan.costmodel.blocks.base import BlockCompute, BlockKind
from meshplan.costmodel.blocks.hybrid_proj import HYBRID_PROJ
from meshplan.costmodel.blocks.mamba1 import MAMBA1
from meshplan.costmodel.blocks.mamba2 import MAMBA2
from meshplan.costmodel.blocks.mlp import MLP
from meshplan.costmodel.blocks.moe import EXPERTS, ROUTER, SHARED_EXPERT

__all__ = [
    "BLOCKS",
    "BlockCompute",
    "BlockKind",
    "block_params",
    "block_saved",
    "fp8_param_share",
    "streamed_block_params",
]

BLOCKS: dict[str, BlockKind] = {
    b.name: b for b in (ATTENTION, MLP, MAMBA2, MAMBA1, HYBRID_PROJ, ROUTER, EXPERTS, SHARED_EXPERT)
}


def block_params(model, kind: str) -> int:
    return BLOCKS[kind].params(model)


def streamed_block_params(model, kind: str) -> int:
    """What TSP streams of a block: its weights less the input norm's scale (h elements, applied to the
    rank's own tokens before any GEMM, so every rank keeps a copy)."""
    return BLOCKS[kind].streamed_params(model)


@functools.lru_cache(maxsize=1024)
def block_saved(kind: str, model, opts) -> tuple:
    """The tensors one `kind` block saves (a tuple: cached, the planner asks for the same ones a thousand
    times a ranking)."""
    return tuple(BLOCKS[kind].saved(model, opts))


@functools.lru_cache(maxsize=256)
def fp8_param_share(model) -> float:
    """The share of the model's parameters, less the routed experts', that FP8 GEMMs read
    (BlockKind.fp8_weight_params; a shared block's weights once for each copy the model holds): what
    --fp8-param-gather gathers at 1 byte. The routed experts' weights are all FP8 GEMMs' (share 1)."""
    shared = set(model.shared_block_kinds())
    fp8 = rest = 0.0
    for kind, n in model.block_invocations():
        copies = min(model.shared_blocks, n) if kind in shared else n
        if kind == "experts":
            rest -= copies * BLOCKS[kind].params(model)
        else:
            fp8 += copies * BLOCKS[kind].fp8_weight_params(model)
    return fp8 / (model.param_count() + rest)

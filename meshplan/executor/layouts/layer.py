"""A layer built from its sublayers: each reference layer (meshplan.executor.blocks) becomes an ordered
list of sharded sublayers, chosen by the layout — the executor's twin of the cost model's
meshplan/costmodel/axes/__init__.py:

    block kind    slot         tp, sp, tp+sp (and tpssm, tpssm+sp)    tsp
    dense         attention    dense.ParallelAttention                tsp.TSPAttention
                  mlp          dense.ParallelMLP                      tsp.TSPMLP
    Mamba-2       mixer        mamba.ParallelMamba2                   tsp_mamba.TSPMamba2
    MoE           attention    dense.ParallelAttention                tsp.TSPAttention
                  mlp          ep.ExpertParallelMoE (ep, etp)         ep.ExpertParallelMoE (ep)
    mixed (Nemotron-H), one block a layer (not tpssm):
    attention     attention    dense.ParallelAttention                tsp.TSPAttention (contiguous)
    MLP           mlp          dense.ParallelMLP                      tsp.TSPMLP
    MoE           mlp          ep.ExpertParallelMoE (ep, etp)         ep.ExpertParallelMoE (ep)
    Mamba-2       mixer        mamba.ParallelMamba2                   tsp_mamba.TSPMamba2
    Zamba2 hybrid (hybrid.hybrid_layers, not build_layer; tp, tpssm, sp, pp=2 — not tsp):
    shared block  (SharedBlocks, once a copy a stage) dense.ParallelAttention, dense.ParallelMLP
    hybrid layer  proj         hybrid.HybridProjection (the linear and the invocation's adapters)
                  mixer        mamba.ParallelMamba2 (its input: x + the shared block's output)

Every sublayer is a pre-norm residual branch (common.Sublayer: its own norm, then its mixing), and the
layer adds each branch's output to the stream in turn, so that a later kind of sublayer — an MoE in the
`mlp` slot — replaces one branch and nothing around it (Megatron-Core's TransformerLayerSubmodules, whose
`mlp` slot holds a dense MLP or an MoE).
"""

from __future__ import annotations

import torch
from torch import nn

from meshplan.executor.blocks import AttentionLayer, DenseLayer, Mamba2Block, MlpLayer, MoELayer, MoEOnlyLayer
from meshplan.executor.comm import Mesh
from meshplan.executor.layouts.common import Sharded, Sublayer, contiguous_tokens, zigzag_tokens
from meshplan.executor.layouts.dense import ParallelAttention, ParallelMLP
from meshplan.executor.layouts.ep import ExpertParallelMoE
from meshplan.executor.layouts.mamba import ParallelMamba2
from meshplan.executor.layouts.tsp import TSPMLP, TSPAttention
from meshplan.executor.layouts.tsp_mamba import TSPMamba2
from meshplan.layout import Layout, sp_zigzag


class Layer(nn.Module):
    """Sublayers in order, by slot name (attention, mlp; or mixer): x + s(x) for each s in turn.
    `index` maps each local parameter ("attention.w_qkv") to the reference layer's slice, as a sharded
    module's does (checkpoint.load_into, the distributed checks)."""

    def __init__(self, **sublayers: Sublayer):
        super().__init__()
        self.slots = tuple(sublayers)
        for name, sublayer in sublayers.items():
            self.add_module(name, sublayer)

    @property
    def sublayers(self) -> list[Sublayer]:
        return [getattr(self, name) for name in self.slots]

    @property
    def index(self) -> dict:
        return {f"{name}.{local}": ref for name in self.slots for local, ref in getattr(self, name).index.items()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for sublayer in self.sublayers:
            x = x + sublayer(x)
        return x

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """One new token per sequence (b, 1, h), after a prefill that kept the sublayers' caches."""
        for sublayer in self.sublayers:
            x = x + sublayer.decode(x)
        return x


def build_layer(
    ref: nn.Module, mesh: Mesh, seq: int, positions: torch.Tensor, attention_only: bool, int8_allreduce: bool = False
) -> Layer:
    """This rank's sharded form of the reference layer `ref` under the mesh's layout. `positions`: the
    tokens this rank holds; `attention_only`: the stack has no Mamba layers (SP may then deal zigzag)."""
    layout = mesh.layout
    tensor_axis = layout.weight_axis if layout.tensor_degree > 1 else None
    seq_axis = "sp" if layout.sp > 1 else None
    if isinstance(ref, (AttentionLayer, MlpLayer, MoEOnlyLayer)):
        # A mixed model's one-block layers: the executor runs them on dp, ep, etp, pp, tp, sp and tsp
        # (limits.mixed_limits)
        if layout.tpssm > 1:
            raise ValueError(f"the executor runs a mixed model's layers on dp, ep, etp, pp, tp, sp, tsp, not {layout}")
        if layout.tsp > 1:
            if isinstance(ref, MoEOnlyLayer):
                return Layer(mlp=ExpertParallelMoE(ref, mesh))
            if isinstance(ref, MlpLayer):
                return Layer(mlp=TSPMLP(ref, mesh))
            return Layer(attention=TSPAttention(ref, mesh, seq, zigzag=attention_only))
        if isinstance(ref, MoEOnlyLayer):
            return Layer(mlp=ExpertParallelMoE(ref, mesh, tensor_axis=tensor_axis))
        if isinstance(ref, MlpLayer):
            return Layer(mlp=ParallelMLP(ref, mesh, tensor_axis))
        zigzag = sp_zigzag(layout, seq, attention_only)
        return Layer(attention=ParallelAttention(ref, mesh, tensor_axis, seq_axis, positions, seq, zigzag))
    if isinstance(ref, MoELayer):
        if layout.tpssm > 1:
            raise ValueError(f"the executor runs a mixture of experts on dp, ep, etp, pp, tp, sp and tsp, not {layout}")
        if layout.tsp > 1:
            attention = TSPAttention(ref, mesh, seq, zigzag=attention_only)
            return Layer(attention=attention, mlp=ExpertParallelMoE(ref, mesh))
        zigzag = sp_zigzag(layout, seq, attention_only)
        return Layer(
            attention=ParallelAttention(ref, mesh, tensor_axis, seq_axis, positions, seq, zigzag),
            mlp=ExpertParallelMoE(ref, mesh, tensor_axis=tensor_axis),
        )
    if isinstance(ref, DenseLayer):
        if layout.tsp > 1:
            return Layer(attention=TSPAttention(ref, mesh, seq, zigzag=attention_only), mlp=TSPMLP(ref, mesh))
        zigzag = sp_zigzag(layout, seq, attention_only)
        return Layer(
            attention=ParallelAttention(ref, mesh, tensor_axis, seq_axis, positions, seq, zigzag),
            mlp=ParallelMLP(ref, mesh, tensor_axis),
        )
    if isinstance(ref, Mamba2Block):
        if layout.tsp > 1:
            return Layer(mixer=TSPMamba2(ref, mesh))
        return Layer(mixer=ParallelMamba2(ref, mesh, tensor_axis, seq_axis, int8_allreduce))
    raise TypeError(f"cannot parallelize {type(ref).__name__}")


def tokens_held(layout: Layout, seq: int, index: int, attention_only: bool | None) -> torch.Tensor:
    """The positions rank `index` of the token axis holds: zigzag under TSP for attention-only stacks
    (None: any stack), and under SP where the stack is attention-only and 2Σ divides seq
    (meshplan.layout.sp_zigzag); contiguous otherwise (a Mamba layer's recurrence runs along the ranks
    in order, as TSPMamba2 and SP's shards take it); every position without a token axis."""
    if layout.tsp > 1:
        if attention_only is None or attention_only:
            return zigzag_tokens(seq, layout.tsp, index)
        return contiguous_tokens(seq, layout.tsp, index)
    if layout.sp > 1:
        if attention_only is not None and sp_zigzag(layout, seq, attention_only):
            return zigzag_tokens(seq, layout.sp, index)
        return contiguous_tokens(seq, layout.sp, index)
    return torch.arange(seq)


def sharded_modules(layers) -> list[Sharded]:
    """Every sharded module of `layers` (each layer's sublayers, the embedding, the head), in order."""
    return [m for layer in layers for m in layer.modules() if isinstance(m, Sharded)]

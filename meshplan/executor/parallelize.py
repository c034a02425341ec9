"""Turn a plain Stack into its sharded form for a layout (parallelize from the outside), and say
which tokens each rank holds."""

from __future__ import annotations

import torch
from torch import nn

from meshplan.costmodel.schedule import grad_group
from meshplan.executor.blocks import DenseLayer, Mamba2Block, Stack
from meshplan.executor.comm import Mesh, all_reduce
from meshplan.executor.layouts.common import contiguous_tokens, zigzag_tokens
from meshplan.executor.layouts.dense import ParallelDense
from meshplan.executor.layouts.mamba import ParallelMamba2
from meshplan.executor.layouts.tsp import TSPDense
from meshplan.layout import sp_zigzag


def token_positions(mesh: Mesh, seq: int, stack: Stack | None = None) -> torch.Tensor:
    """The positions this rank holds: zigzag under TSP, and under SP where the stack (None: any) is
    attention-only and 2Σ divides seq (meshplan.layout.sp_zigzag); contiguous otherwise."""
    layout = mesh.layout
    if layout.tsp > 1:
        return zigzag_tokens(seq, layout.tsp, mesh.axis("tsp").rank)
    if layout.sp > 1:
        if stack is not None and sp_zigzag(layout, seq, attention_only(stack)):
            return zigzag_tokens(seq, layout.sp, mesh.axis("sp").rank)
        return contiguous_tokens(seq, layout.sp, mesh.axis("sp").rank)
    return torch.arange(seq)


def attention_only(stack: Stack) -> bool:
    return all(isinstance(layer, DenseLayer) for layer in stack.layers)


def parallelize(stack: Stack, mesh: Mesh, seq: int, int8_allreduce: bool = False) -> nn.ModuleList:
    layout = mesh.layout
    tensor_axis = "tpssm" if layout.tpssm > 1 else "tp" if layout.tp > 1 else None
    seq_axis = "sp" if layout.sp > 1 else None
    positions = token_positions(mesh, seq, stack)
    zigzag = sp_zigzag(layout, seq, attention_only(stack))
    out = []
    for layer in stack.layers:
        if isinstance(layer, DenseLayer):
            if layout.tsp > 1:
                out.append(TSPDense(layer, mesh, seq))
            else:
                out.append(ParallelDense(layer, mesh, tensor_axis, seq_axis, positions, seq, zigzag))
        elif isinstance(layer, Mamba2Block):
            if layout.tsp > 1:
                raise NotImplementedError("the executor runs TSP for dense layers; use tpssm or sp for Mamba-2")
            out.append(ParallelMamba2(layer, mesh, tensor_axis, seq_axis, int8_allreduce))
        else:
            raise TypeError(f"cannot parallelize {type(layer).__name__}")
    return nn.ModuleList(out)


def sync_gradients(layers: nn.ModuleList, mesh: Mesh) -> None:
    """After backward: B/C gradients of TP-SSM's replicated groups, then the weight gradients of
    weights replicated along the sequence axis (SP) or the data axis (ZeRO stage 0), all-reduced once
    in one flat buffer over the cost model's gradient group (dp, sp or the two merged:
    costmodel.schedule.grad_group) and divided by the dp replicas (their mean, as DDP takes); then
    TSP's norm scales."""
    for layer in layers:
        if isinstance(layer, ParallelMamba2):
            layer.sync_replicated_grads()
    layout = mesh.layout
    axis, size = grad_group(layout)
    if size > 1:  # the sum over sp, the mean over dp
        _all_reduce_grads(list(layers.parameters()), mesh, axis, 1.0 / layout.dp)
    if layout.tsp > 1:  # TSP keeps the norm scales on every rank
        _all_reduce_grads([p for layer in layers for n, p in layer.named_parameters() if n.endswith("norm.weight")],
                          mesh, "tsp")


def _all_reduce_grads(params: list, mesh: Mesh, axis: str, scale: float = 1.0) -> None:
    """One all-reduce of the listed gradients, flattened into one buffer (the sum times `scale`)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = all_reduce(mesh, torch.cat([g.flatten() for g in grads]), axis)
    if scale != 1.0:
        flat.mul_(scale)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def run_layers(layers: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    return x

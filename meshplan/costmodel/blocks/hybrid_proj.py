"""Zamba2's per-invocation projection: the shared block's output back to d_model, and its LoRA
adapters (down to the rank and up again) beside the shared MLP's gate/up and, if any, Q, K and V."""

from __future__ import annotations

from meshplan.costmodel.activations import Saved
from meshplan.costmodel.blocks.base import BlockKind
from meshplan.costmodel.options import MemoryOptions
from meshplan.models import ModelSpec


def hybrid_proj_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    """The linear's input, and each LoRA adapter's rank-wide middle (their inputs are the shared
    block's, saved there)."""
    e = opts.nbytes("act_dtype")
    items = [Saved("hybrid_proj_input", e * model.mlp.out_hidden, "hidden")]
    if model.adapter_rank:
        adapters = 1 + (3 if model.attention_adapters else 0)
        items.append(Saved("adapter_rank_out", e * adapters * model.adapter_rank, "hidden"))
    return items


def adapter_down_params(model: ModelSpec) -> int:
    """One invocation's LoRA down projections (rank × the input they read): the gate/up adapter's and,
    with attention adapters, Q's, K's and V's."""
    rank = model.adapter_rank
    if model.family != "hybrid" or not rank:
        return 0
    return rank * model.mlp.hidden + (3 * rank * model.attention.hidden if model.attention_adapters else 0)


def tensor_replicated_hybrid_params(model: ModelSpec, head_div: int) -> float:
    """Extra parameters per rank when a tensor axis splits a Zamba2's layers `head_div` ways: each
    invocation's linear (it reads the shared block's summed output) and its adapters' down projections
    (they read the replicated input) stay whole on every tensor rank; the adapters' up projections are
    split with the projections they add to (the executor's splits.hybrid_proj_splits)."""
    if model.family != "hybrid" or head_div == 1:
        return 0.0
    whole = model.mlp.out_hidden * model.d_model + adapter_down_params(model)
    return model.hybrid_invocations * whole * (1 - 1 / head_div)


class HybridProj(BlockKind):
    name = "hybrid_proj"
    tensor_comms = False

    def params(self, model):
        return model.hybrid_proj_params()

    def norm_width(self, model):
        return 0

    def gemms(self, model, head_div):
        # The invocation's linear back to d_model, and its LoRA adapters (models.adapter_params).
        gemms = [(model.d_model, model.mlp.out_hidden)]
        rank = model.adapter_rank
        if rank:
            f, a = model.mlp, model.attention
            gemms += [(rank, f.hidden), (f.n_input_matrices * f.ffn_hidden, rank)]
            if model.attention_adapters:
                gemms += 3 * [(rank, a.hidden), (a.hidden, rank)]
        return gemms

    def memory_bound_bytes_per_token(self, model, head_div, e):
        return e * 2 * model.d_model

    def saved(self, model, opts):
        return hybrid_proj_saved(model, opts)


HYBRID_PROJ = HybridProj()

"""Parameter counts and channel shares of single blocks: pure functions of a ModelSpec that the memory
model, the schedule, the compute model and the layout modules all use (a leaf of costmodel's imports)."""

from __future__ import annotations

import math

from meshplan.models import ModelSpec


def local_bc_channels(m, head_div: int) -> float:
    """Mamba-2's B and C channels on a rank whose heads are split `head_div` ways: split with the
    groups where T divides ngroups, else the whole groups its heads use (gcd(T, ngroups) ways)."""
    return 2 * m.ngroups * m.d_state / math.gcd(head_div, m.ngroups)


def streamed_block_params(model: ModelSpec, kind: str) -> int:
    """What TSP streams of a block: its weights less the input norm's scale (h elements, applied to the
    rank's own tokens before any GEMM, so every rank keeps a copy)."""
    norm = {
        "attention": model.attention.hidden if model.attention else 0,
        "mlp": model.mlp.hidden if model.mlp else 0,
        "hybrid_proj": 0,
    }.get(kind, model.d_model)
    return block_params(model, kind) - norm


def block_params(model: ModelSpec, kind: str) -> int:
    if kind == "mamba2":
        return model.mamba2.param_count()
    if kind == "mamba1":
        return model.mamba1.param_count()
    if kind == "attention":
        return model.attention.param_count()
    if kind == "mlp":
        return model.mlp.param_count()
    return model.hybrid_proj_params()

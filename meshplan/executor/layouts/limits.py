"""What the executor's layout modules run, checked before anything launches: torch-free, as
meshplan.executor.support asks it for the CLI and the planner. Each check names the module whose limit
it is; a refusal is one line naming the field and what runs instead.
"""

from __future__ import annotations

from meshplan.layout import Layout
from meshplan.models import ModelSpec


def layer_limits(layout: Layout, model: ModelSpec) -> str | None:
    """Why this rank's layers (layer.build_layer's sublayers, and the gradient sums GradientSync runs
    for them) cannot be built for `layout` on `model`; None when they can."""
    if layout.pp > 1 and layout.dp > 1 and layout.zero >= 2 and (layout.tsp > 1 or layout.tpssm > 1):
        # TSP's norm scales and TP-SSM's replicated B/C weights (their sublayers' partial_grads and
        # replicated_grad_params) are summed over the tensor axis once a step by
        # parallelize.GradientSync, while ZeRO 2-3 under pp reduce-scatter every micro-batch's gradients.
        return (
            f"layout: the executor pipelines ZeRO {layout.zero} without tsp or tpssm; execute zero=1 or "
            f"drop the tensor axis"
        )
    if layout.dp > 1 and layout.zero >= 3 and layout.tsp > 1:  # tsp.py, tsp_mamba.py
        return (
            f"layout: the executor's TSP streams its own weight shards and does not also shard them "
            f"for ZeRO 3; with tsp={layout.tsp} execute zero=2 or below"
        )
    if layout.tsp > 1 and model.family == "mamba2":  # tsp_mamba.TSPMamba2's contiguous splits
        m = model.mamba2
        sizes = {"in_proj rows": m.in_proj_width, "conv channels": m.conv_dim, "heads": m.nheads, "d_inner": m.d_inner}
        bad = [f"{k} {v}" for k, v in sizes.items() if v % layout.tsp]
        if bad:
            return (
                f"layout: tsp={layout.tsp} must divide {model.name}'s Mamba-2 weights ({', '.join(bad)}); "
                f"pick a tsp that divides them"
            )
    if layout.tsp > 1 and model.mlp is not None and not model.mlp.gated:  # tsp.TSPMLP
        return f"layout: the executor's TSP ring is written for gated MLPs; {model.name}'s is not gated"
    t = layout.tensor_degree
    if model.family == "mamba2" and t > 1 and model.mamba2.ngroups % t and model.mamba2.ngroups != 1:
        return (
            f"layout: the executor splits Mamba-2's {model.mamba2.ngroups} B/C groups over the tensor axis "
            f"or replicates one group; {t} does not divide {model.mamba2.ngroups}"
        )
    return None


def vocab_limits(layout: Layout, model: ModelSpec) -> str | None:
    """Why the embedding and the head (vocab.py: vocabulary rows on a tensor axis, hidden columns under
    TSP) cannot be split for `layout` on `model`; None when they can."""
    t = layout.tensor_degree
    if t > 1 and model.vocab % t:
        return (
            f"model: vocab {model.vocab} is not divisible by the tensor axis ({t}), which the vocab-parallel "
            f"embedding splits evenly; pad vocab_size to a multiple of {t}, or run --layers-only"
        )
    if layout.tsp > 1 and model.d_model % layout.tsp:
        return (
            f"layout: tsp={layout.tsp} must divide hidden {model.d_model} (TSP splits the embedding by "
            f"columns); pick a tsp that divides it, or run --layers-only"
        )
    return None

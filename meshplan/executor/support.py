"""What the executor runs, checked before anything launches (torch-free: the CLI and the planner ask).

The cost model scores more than the executor runs: ZeRO 2 and 3 under pipeline stages with a tsp or
tpssm axis, ZeRO 3 under TSP, and models other than dense and Mamba-2 stacks are priced but not
executed. `meshplan execute` refuses them with one line; `meshplan recommend` marks
them.
"""

from __future__ import annotations

from meshplan.layout import Layout
from meshplan.models import ModelSpec


def unsupported(layout: Layout, model: ModelSpec) -> str | None:
    """Why the executor cannot run `layout` on `model`, in one line naming the field and what it can
    run instead; None when it can."""
    if model.family not in ("dense", "mamba2"):
        return f"model: the executor builds dense and Mamba-2 stacks, not {model.family} ({model.name})"
    if layout.pp > 1 and model.layers % layout.pp:
        return (f"layout: pp={layout.pp} does not divide {model.name}'s {model.layers} layers; pick pp from its "
                f"divisors")
    if layout.pp > 1 and layout.dp > 1 and layout.zero >= 2 and (layout.tsp > 1 or layout.tpssm > 1):
        # Their norm scales or replicated B/C weights are summed over the tensor axis once a step,
        # while ZeRO 2-3 under pp reduce-scatter every micro-batch's gradients.
        return (f"layout: the executor pipelines ZeRO {layout.zero} without tsp or tpssm; execute zero=1 or "
                f"drop the tensor axis")
    if layout.dp > 1 and layout.zero >= 3 and layout.tsp > 1:
        return (f"layout: the executor's TSP streams its own weight shards and does not also shard them "
                f"for ZeRO 3; with tsp={layout.tsp} execute zero=2 or below")
    if layout.tsp > 1 and model.family == "mamba2":
        m = model.mamba2
        sizes = {"in_proj rows": m.in_proj_width, "conv channels": m.conv_dim, "heads": m.nheads, "d_inner": m.d_inner}
        bad = [f"{k} {v}" for k, v in sizes.items() if v % layout.tsp]
        if bad:
            return (f"layout: tsp={layout.tsp} must divide {model.name}'s Mamba-2 weights ({', '.join(bad)}); "
                    f"pick a tsp that divides them")
    if layout.tsp > 1 and model.mlp is not None and not model.mlp.gated:
        return f"layout: the executor's TSP ring is written for gated MLPs; {model.name}'s is not gated"
    t = layout.tpssm if layout.tpssm > 1 else layout.tp
    if model.family == "mamba2" and t > 1 and model.mamba2.ngroups % t and model.mamba2.ngroups != 1:
        return (f"layout: the executor splits Mamba-2's {model.mamba2.ngroups} B/C groups over the tensor axis "
                f"or replicates one group; {t} does not divide {model.mamba2.ngroups}")
    return None

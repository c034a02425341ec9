"""Where each rank sits on each mesh axis: one order for the cost model's link placement
(meshplan.costmodel.step) and the executor's process groups (meshplan.executor.comm.build_mesh).

Ranks are numbered with the weight-splitting axis innermost (tp, tpssm or tsp: the most traffic, kept
inside a node), then the sequence axis, then data parallelism, then the pipeline:

    rank = t + T·(σ + Σ·(d + DP·p))

An axis group is `size` ranks `stride` apart. Merged groups (the data-parallel gradient group over
dp and sp, `dp+sp`) span consecutive axes. Megatron-Core's MoE parallel folding lays a second
decomposition over the same world for the experts, the pipeline groups equal:

    rank = e_t + ETP·(e + EP·(d_e + EDP·p))
"""

from __future__ import annotations

from meshplan.layout import Layout

# Innermost first. The experts' decomposition of the same world (Megatron-Core's MoE parallel folding,
# Liu et al. 2025, arXiv 2504.14960, §3.2): the expert-tensor axis, the expert-parallel axis, the
# expert-data-parallel rest, the same pipeline — each stage's tp × sp × dp ranks again.
ATTENTION_ORDER = ("tensor", "sp", "dp", "pp")
EXPERT_ORDER = ("etp", "ep", "edp", "pp")
DECOMPOSITIONS = {"attention": ATTENTION_ORDER, "experts": EXPERT_ORDER}


def axis_sizes(layout: Layout) -> dict[str, int]:
    """Ranks along each axis of both decompositions (`tensor`: tp, tpssm or tsp)."""
    return {
        "tensor": layout.weight_shard_degree,
        "sp": layout.sp,
        "dp": layout.dp,
        "pp": layout.pp,
        "etp": layout.expert_tensor_degree,
        "ep": layout.ep,
        "edp": layout.expert_data_degree,
    }


def strides(layout: Layout, order: tuple[str, ...] = ATTENTION_ORDER) -> dict[str, int]:
    """Rank distance between neighbours on each axis."""
    sizes = axis_sizes(layout)
    out, acc = {}, 1
    for name in order:
        out[name] = acc
        acc *= sizes[name]
    return out


def group(layout: Layout, axes: tuple[str, ...], order: tuple[str, ...] = ATTENTION_ORDER) -> tuple[int, int]:
    """(size, stride) of a group varying along `axes`, consecutive in `order` (innermost first): the
    ranks that differ only there."""
    sizes, st = axis_sizes(layout), strides(layout, order)
    size = 1
    for name in axes:
        size *= sizes[name]
    return size, st[axes[0]]


def pipeline_ends(layout: Layout) -> tuple[int, int]:
    """(size, stride) of the group of a pipeline's first and last stages (a tied embedding's two ends)."""
    size, stride = group(layout, ("pp",))
    return (2, stride * (layout.pp - 1)) if layout.pp > 1 else (1, stride)

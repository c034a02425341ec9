"""The expert-parallel axis, E ranks folded onto the data and sequence ranks (Megatron-Core's MoE
parallel folding): each rank holds 1/E of every MoE layer's routed experts; the router, the shared
experts and every other block are not split by it. With the tensor axis, an expert is split T ways
too (ETP = TP, Megatron's default). Memory takes it (meshplan.costmodel.memory: a rank's parameters,
gradients and optimizer states); the token all-to-alls it adds are not priced yet, so the step model
refuses it in one line rather than leave them out."""

from meshplan.costmodel.axes.base import Sharding
from meshplan.errors import MeshplanError
from meshplan.layout import Layout


def active(layout: Layout) -> bool:
    return layout.ep > 1


def sharding(layout: Layout, options, kind: str | None = None) -> Sharding:
    return Sharding(layout.ep if kind == "experts" else 1, 1, 1, 1, 1)


def block_comms(ctx, kind: str):
    raise MeshplanError(
        f"layout: ep={ctx.layout.ep}'s token all-to-alls are not priced yet; `meshplan memory` takes ep "
        f"layouts, step time does not — leave ep out to time the plan"
    )

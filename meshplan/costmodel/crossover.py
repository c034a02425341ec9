"""Where TSP starts to move fewer bytes (or take less time) than TP, from the schedules themselves.

Per layer and rank, forward: TP moves c_TP·b·s bytes; TSP moves P_layer·(D−1)/D (weights, fixed)
plus c_KV·b·s (the K/V gather). Both are linear in the token count b·s, so two evaluations of the
general schedule give each line and the crossing follows. With MHA and a gated F = 4 MLP it comes
out at b·s = 8h (docs/design.md §2) — a test checks that it falls out, nothing here assumes it.
"""

from __future__ import annotations

import functools
import math

from meshplan.costmodel.axes import PlanContext, block_comms, sharding_for
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.step import estimate_step
from meshplan.layout import Layout
from meshplan.models import ModelSpec


def tp_layout_for(model: ModelSpec, degree: int) -> Layout:
    return Layout(tpssm=degree) if model.has_mamba and not model.has_attention else Layout(tp=degree)


def layer_volume_bytes(
    model: ModelSpec, layout: Layout, tokens: float, opts: CostOptions, phases: tuple[str, ...] = ("fwd",)
) -> float:
    """Bytes per rank per layer (averaged over the model's layers) for `tokens` = b·s."""
    ctx = PlanContext(model, layout, sharding_for(layout, opts), 1, tokens, opts)
    total = 0.0
    for kind, count in model.block_invocations():
        total += count * sum(c.bytes_per_rank for c in block_comms(ctx, kind) if c.phase in phases)
    return total / model.layers


@functools.lru_cache(maxsize=1024)  # pure, and asked once per candidate mesh by the planner
def volume_crossover_tokens(
    model: ModelSpec, degree: int, opts: CostOptions = CostOptions(), phases: tuple[str, ...] = ("fwd",)
) -> float:
    """b·s above which TSP moves fewer bytes per layer than TP at the same degree (inf: never)."""
    tp, tsp = tp_layout_for(model, degree), Layout(tsp=degree)
    x0, x1 = 1024.0, 2048.0
    tp0, tp1 = layer_volume_bytes(model, tp, x0, opts, phases), layer_volume_bytes(model, tp, x1, opts, phases)
    ts0, ts1 = layer_volume_bytes(model, tsp, x0, opts, phases), layer_volume_bytes(model, tsp, x1, opts, phases)
    slope_tp, slope_tsp = (tp1 - tp0) / (x1 - x0), (ts1 - ts0) / (x1 - x0)
    icpt_tp, icpt_tsp = tp0 - slope_tp * x0, ts0 - slope_tsp * x0
    if slope_tp <= slope_tsp:
        return math.inf
    return max(0.0, (icpt_tsp - icpt_tp) / (slope_tp - slope_tsp))


def regime(model: ModelSpec, layout: Layout, tokens: int, opts: CostOptions = CostOptions()) -> str:
    """'b·s = 131,072 > 8h = 32,768': which side of the TP/TSP volume crossover a shape is on."""
    degree = layout.weight_shard_degree
    if degree <= 1:
        return "no weight split"
    if model.moe is not None:
        return "mixture of experts: no TP/TSP crossover computed (its formula covers dense blocks)"
    cross = volume_crossover_tokens(model, degree, opts)
    if math.isinf(cross):
        return f"b·s = {tokens:,}: TSP never moves less than TP here"
    ratio = cross / model.d_model
    label = f"{ratio:g}h" if abs(ratio - round(ratio)) < 1e-9 else "crossover"
    sign = ">" if tokens > cross else "<" if tokens < cross else "="
    return f"b·s = {tokens:,} {sign} {label} = {cross:,.0f}"


def time_crossover_limit(degree: int) -> int:
    """The longest sequence time_crossover_tokens tries: 2·D·2¹⁶ tokens."""
    return 2 * degree * 2**16


def time_crossover_tokens(model: ModelSpec, degree: int, cluster, opts: CostOptions = CostOptions()) -> float:
    """Smallest b·s (per replica, one sequence) where a TSP training step is no slower than TP's, or inf."""

    tp, tsp = tp_layout_for(model, degree), Layout(tsp=degree)

    def tsp_wins(tokens: int) -> bool:
        return (
            estimate_step(model, tsp, tokens, 1, opts, cluster).step_time_s
            <= estimate_step(model, tp, tokens, 1, opts, cluster).step_time_s
        )

    lo, hi = 2 * degree, time_crossover_limit(degree)  # token counts multiple of 2·D (zigzag chunks)
    if not tsp_wins(hi):
        return math.inf
    if tsp_wins(lo):
        return float(lo)
    while hi - lo > 2 * degree:
        mid = (lo + hi) // 2 // (2 * degree) * (2 * degree)
        if mid <= lo:
            break
        lo, hi = (lo, mid) if tsp_wins(mid) else (mid, hi)
    return float(hi)

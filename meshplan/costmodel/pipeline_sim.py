"""A discrete-event simulator of the pipeline schedules: the independent reference the closed forms in
meshplan.costmodel.pipeline are held to (tests/test_pipeline_sim.py), and what prices a schedule where
no closed form holds.

Each pipeline rank runs its forward and backward units in the fixed order its schedule gives; a unit
starts when the rank is free and its input is there:
- the forward of micro-batch i on virtual stage k needs i's forward on stage k − 1 (sent from the
  rank before it, `p2p_s` later);
- the backward on stage k needs i's backward on stage k + 1 (likewise sent), and on the last virtual
  stage i's own forward (the loss).
Virtual stage k = c·p + r is model chunk c of rank r (Megatron-Core's interleaving: a rank holds
chunks r, p + r, 2p + r, …). Sends are asynchronous and buffered: a rank never waits on its
receiver, which is the schedule's ideal; a blocking exchange can only add to it.

Orders (Megatron-Core, megatron/core/pipeline_parallel/schedules.py):
- 1F1B (forward_backward_pipelining_without_interleaving): rank r runs min(p − r − 1, m) warm-up
  forwards, then alternates one forward and one backward, then drains the remaining backwards.
- Interleaved 1F1B (forward_backward_pipelining_with_interleaving): the (micro-batch, chunk) units in
  the order of the schedule table (get_schedule_table: groups of N micro-batches, N =
  microbatch_group_size_per_vp_stage, default p; within a group every chunk in turn, each over the
  group's micro-batches; the last group takes the rest), backwards over the same table with the chunks
  reversed; (p − r − 1)·2 + (v − 1)·N warm-up forwards (all of them when that reaches m·v), then one
  forward and one backward in turn, then the remaining backwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import MeshplanError


@dataclass(frozen=True)
class SimResult:
    total_s: float  # from the first forward's start to the last backward's end
    busy_s: tuple[float, ...]  # each rank's compute
    idle_s: tuple[float, ...]  # each rank's waiting inside total_s


def schedule_table(microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each forward in a rank's order under the interleaved schedule."""
    table: list[tuple[int, int]] = []
    for start in range(0, microbatches, group):
        end = microbatches if start + group >= microbatches else start + group
        table += [(i, c) for c in range(chunks) for i in range(start, end)]
    return table


def rank_order(rank: int, pp: int, microbatches: int, chunks: int, group: int = 0) -> list[tuple[str, int, int]]:
    """The units ("F" or "B", micro-batch, chunk) rank `rank` runs, in order."""
    m, v = microbatches, chunks
    if v == 1:
        fwd = [(i, 0) for i in range(m)]
        bwd = fwd
        warmup = min(pp - rank - 1, m)
    else:
        group = group or pp
        fwd = schedule_table(m, v, group)
        bwd = [(i, v - 1 - c) for i, c in fwd]
        warmup = min((pp - rank - 1) * 2 + (v - 1) * group, m * v)
    order = [("F", *fwd[k]) for k in range(warmup)]
    for k in range(len(fwd) - warmup):
        order += [("F", *fwd[warmup + k]), ("B", *bwd[k])]
    order += [("B", *bwd[k]) for k in range(len(fwd) - warmup, len(fwd))]
    return order


def simulate(
    fwd_s: list[list[float]] | list[float],
    bwd_s: list[list[float]] | list[float],
    microbatches: int,
    *,
    chunks: int = 1,
    group: int = 0,
    p2p_s: float = 0.0,
) -> SimResult:
    """Run one training step's pipeline: `fwd_s[r][c]` and `bwd_s[r][c]` are rank r's chunk c's
    seconds for one micro-batch (a flat list: one chunk a rank); `group`: Megatron's
    microbatch_group_size_per_vp_stage (0: pp); `p2p_s`: a send's latency between consecutive ranks."""
    fwd = [list(x) if isinstance(x, (list, tuple)) else [x] for x in fwd_s]
    bwd = [list(x) if isinstance(x, (list, tuple)) else [x] for x in bwd_s]
    pp, v, m = len(fwd), chunks, microbatches
    if any(len(row) != v for row in fwd + bwd) or len(bwd) != pp:
        raise MeshplanError(f"pipeline simulator: give {v} chunk times for each of {pp} ranks, forward and backward")
    if m < 1:
        raise MeshplanError(f"pipeline simulator: microbatches must be >= 1, got {m}")
    last = pp * v - 1
    orders = [rank_order(r, pp, m, v, group) for r in range(pp)]
    done: dict[tuple[str, int, int], float] = {}  # (F|B, micro-batch, virtual stage) -> end time
    free = [0.0] * pp
    busy = [0.0] * pp
    pos = [0] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, i, c = orders[r][pos[r]]
                k = c * pp + r
                if kind == "F":
                    dep = ("F", i, k - 1) if k > 0 else None
                    cost = fwd[r][c]
                else:
                    dep = ("B", i, k + 1) if k < last else ("F", i, k)
                    cost = bwd[r][c]
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (p2p_s if dep[2] != k else 0.0)
                start = max(free[r], ready)
                free[r] = start + cost
                busy[r] += cost
                done[(kind, i, k)] = free[r]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # the orders above never deadlock; a wrong order would
            raise MeshplanError("pipeline simulator: the schedule deadlocks")
    total = max(free)
    return SimResult(total, tuple(busy), tuple(total - b for b in busy))


def one_f_one_b(fwd_s: list[float], bwd_s: list[float], microbatches: int, *, p2p_s: float = 0.0) -> SimResult:
    """The 1F1B schedule of `simulate` (one chunk a rank), solved cycle by cycle over all ranks at once.

    Rank r runs w_r = min(p − r − 1, m) warm-up forwards, then in cycle j = 0 … m − 1 the forward of
    micro-batch w_r + j (while there is one) and the backward of j. A cycle's forwards wait for the
    rank before (its previous cycle's forward), its backwards for the rank after in the same cycle —
    a running maximum down the ranks. Once every rank runs both units, a cycle is the one before
    shifted by a constant (the schedule's steady state, a max-plus recurrence): from the first cycle
    whose state — every rank's backward and forward end — is its predecessor's shifted by one
    constant, every later full cycle is shifted by it again, so they are added at once, exactly."""
    import numpy as np

    f, b = np.asarray(fwd_s, float), np.asarray(bwd_s, float)
    pp, m, lat = len(f), microbatches, p2p_s
    ranks = np.arange(pp)
    warm = np.minimum(pp - 1 - ranks, m)
    fend = np.full((pp, m), -np.inf)
    # Warm-up forward i on every rank that has one: a chain down the ranks (Q: the chain's offsets).
    q = np.concatenate([[0.0], np.cumsum(f[:-1] + lat)])  # Σ_{t<r} (f_t + lat)
    prev = np.zeros(pp)  # each rank's last end time
    for i in range(int(warm.max(initial=0))):
        has = warm > i
        start = np.where(has, prev, -np.inf)
        end = np.maximum.accumulate(start - q) + q + f  # max(rank before + lat, own previous) + f
        fend[has, i] = end[has]
        prev = np.where(has, end, prev)
    # Cycles: forward of w_r + j (while < m), then backward of j.
    suffix = np.concatenate([np.cumsum((b + lat)[::-1])[::-1], [0.0]])  # Σ_{t>=r} (b_t + lat)
    full = m - int(warm[0]) if pp > 1 else m  # cycles where every rank runs a forward
    state_prev = None
    j = 0
    while j < m:
        mb = warm + j
        has = mb < m
        before = np.concatenate([[-np.inf], fend[ranks[:-1], np.minimum(mb[1:], m - 1)]]) + lat
        before = np.where(has & (ranks > 0), before, -np.inf)
        fwd_end = np.where(has, np.maximum(prev, before) + f, prev)
        fend[ranks[has], mb[has]] = fwd_end[has]
        # Backward of j: B_r = max(F_r, B_{r+1} + lat) + b_r, a running maximum up the ranks.
        start = fwd_end - suffix[1:] + lat  # the rank's own ready time, in the chain's offsets
        bend = np.maximum.accumulate(start[::-1])[::-1] + suffix[1:] - lat + b
        state = np.concatenate([bend, fwd_end])  # all the next cycle reads
        if state_prev is not None and j < full:
            shift = state - state_prev
            steady = np.ptp(shift) <= 1e-12 * abs(float(state.max()))
            skip = full - 1 - j  # full cycles left after this one: each this one shifted by λ more
            if steady and skip > 0:
                lam = float(shift[0])
                later = np.arange(1, skip + 1)
                fend[ranks[:, None], warm[:, None] + j + later] = fwd_end[:, None] + later * lam
                bend, fwd_end = bend + skip * lam, fwd_end + skip * lam
                j += skip
                state = np.concatenate([bend, fwd_end])
        state_prev = state
        prev = bend
        j += 1
    total = float(prev.max())
    busy = m * (f + b)
    return SimResult(total, tuple(busy.tolist()), tuple((total - busy).tolist()))

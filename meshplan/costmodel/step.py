"""Step time: a per-block timeline with a compute stream and a communication stream (docs/design.md §5).

What hides and what does not:
- TP all-reduces sit on the critical path (exposed in full).
- SP's and TSP's K/V all-gather and dK/dV reduce-scatter are exposed where the stack gathers before
  it attends (meshplan's executor); a ring of K/V blocks (Megatron's --cp-comm-type p2p) is marked
  overlap="attention" and hides behind the attention (axes/sp.py).
- TSP's weight shards stream behind the GEMM of the shard in hand: a ring of D − 1 hops costs
  (D − 1)·max(0, transfer − GEMM) exposed (the first shard is the rank's own); the broadcast stream
  also waits for its first transfer. What hides slows the compute as hidden gradient reductions do.
- DP gradient all-reduces overlap the backward, but for the last-ready weights' (the first block's,
  and the input embedding's), which start as it ends; what is left sticks out, and the hidden part
  slows the backward by GRAD_OVERLAP_CONTENTION of its time (measured). TSP's weight-gradient
  reduce-scatters are exposed (the executor waits on each at the end of a block's backward, and on the
  LM head's before the layers' backward goes on).
- Everything else (SP Mamba conv tails and shard summaries, pipeline sends, the loss statistics) is exposed.
Pipeline: (m + pp − 1) micro-batch slots per step (1F1B). Decode is one token per sequence.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field, replace

from meshplan import rank_order
from meshplan.costmodel import axes
from meshplan.costmodel.axes import PlanContext, Sharding, plan_context
from meshplan.costmodel.blocks import BLOCKS, BlockCompute
from meshplan.costmodel.blocks.base import selective_modules
from meshplan.costmodel.blocks.launches import DECODE_KERNEL_GPU_S, step_kernels_per_block
from meshplan.costmodel.collectives import Comm, GroupPlacement, collective_time_s, place_axis
from meshplan.costmodel.compute import block_compute, logits_compute, optimizer_time_s
from meshplan.costmodel.device import Device
from meshplan.costmodel.invariants import check_block, check_passes, check_step
from meshplan.costmodel.memory import local_params, rebuilt_whole, zero_sharded
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.pipeline import (
    PipelinePasses,
    chunk_block_counts,
    pipeline_passes,
    rank_block_counts,
    schedule_violation,
    stage_layout,
)
from meshplan.costmodel.schedule import StepSchedule, step_schedule
from meshplan.costmodel.stacks import Stack
from meshplan.errors import MeshplanError
from meshplan.layout import Layout
from meshplan.models import ModelSpec
from meshplan.topologies.cluster import ClusterSpec


@dataclass(frozen=True)
class StepEstimate:
    # step_time_s = compute_s + bubble_s + exposed_comm_s + optimizer_s + launch_wait_s, each >= 0
    # (meshplan.costmodel.invariants checks it on every estimate). Training: the busiest pipeline
    # stage's rank; inference: the request's path through every stage.
    step_time_s: float  # train: one optimizer step; prefill: time to first token; decode: time per token
    tokens_per_s: float  # whole cluster
    compute_s: float  # busy computing: blocks, head and loss (no bubble, no optimizer)
    comm_s: float  # all communication time, hidden or not (the same rank's, or the request's path)
    exposed_comm_s: float  # communication the compute does not hide
    comm_bytes_per_step: float  # per rank
    mfu: float
    tokens_per_step: float
    bound: str  # what limits it
    breakdown: dict = field(default_factory=dict)
    hfu: float = 0.0  # hardware FLOPs (recompute included) over the peak
    bubble_fraction: float = 0.0  # the pipeline's fill and drain, as a share of its passes
    microbatches: int = 1
    stage_layers: tuple[int, ...] = ()
    chunk_layers: tuple[tuple[int, ...], ...] = ()  # each rank's chunks' layers where they differ (StageLayout)
    bubble_s: float = 0.0  # the busiest stage waiting inside the pipeline's passes
    optimizer_s: float = 0.0
    launch_wait_s: float = 0.0  # the host launching kernels beyond the GPU's work (the launch floor)
    pipeline_simulated: bool = False  # the passes priced by the schedule simulator, not the closed form


def group_placements(layout: Layout, gpus_per_node: int) -> dict[str, GroupPlacement]:
    """Where each mesh axis's group sits (meshplan.rank_order: the executor's rank order), by the names
    the collectives use (Comm.axis)."""
    g = gpus_per_node
    tensor = place_axis(*rank_order.group(layout, ("tensor",)), g)
    groups = {name: tensor if name == layout.weight_axis else place_axis(1, 1, g) for name in ("tp", "tpssm", "tsp")}
    for name, spans in (("sp", ("sp",)), ("dp", ("dp",)), ("dp+sp", ("sp", "dp")), ("pp", ("pp",))):
        groups[name] = place_axis(*rank_order.group(layout, spans), g)
    groups["pp_ends"] = place_axis(*rank_order.pipeline_ends(layout), g)
    # the experts' decomposition of the same ranks
    for name, spans in (("etp", ("etp",)), ("ep", ("ep",)), ("edp", ("edp",)), ("etp+ep", ("etp", "ep"))):
        groups[name] = place_axis(*rank_order.group(layout, spans, rank_order.EXPERT_ORDER), g)
    return groups


class _Links:
    """Group placement of each mesh axis (meshplan.rank_order: the executor's rank order), and the
    α-β parameters of the cluster."""

    def __init__(self, layout: Layout, cluster: ClusterSpec):
        self.groups = group_placements(layout, cluster.gpus_per_node)
        self.cluster = cluster

    def time_s(self, c: Comm) -> float:
        group = self.groups[c.axis]
        cl = self.cluster
        measured = (
            cl.calibration.collective_s(c.kind, group.size, c.message_bytes)
            if cl.calibration and group.nodes == 1
            else None
        )
        if measured is not None:  # timed on this cluster by `meshplan calibrate`
            return measured * c.count
        intra = cl.intra_link.bandwidth_bytes_per_s
        if cl.fabric == "xgmi" and c.kind != "send_recv":
            intra *= max(1, group.per_node - 1)  # a full mesh: collectives drive every peer link at once
        one = collective_time_s(
            c.kind,
            c.message_bytes,
            group,
            intra,
            cl.intra_link.latency_s,
            cl.inter_node_bandwidth(group.nodes),
            cl.nic_link.latency_s,
            c.fanout,
            c.node_limit,
        )
        return one * c.count


@functools.lru_cache(maxsize=4096)
def _links(layout: Layout, cluster: ClusterSpec) -> _Links:
    """The placement of a layout's groups on a cluster, made once (the planner prices a layout's knobs
    on the same one)."""
    return _Links(layout, cluster)


def uncalibrated_group_sizes(layout: Layout, cluster: ClusterSpec, schedule: StepSchedule) -> list[int]:
    """The sizes of the groups inside one node that the plan's collectives (`schedule`) run over and a
    calibrated cluster's profile timed no collective over (`meshplan calibrate` times every kind at each size
    it reaches), sorted: _Links prices those at the preset's datasheet link rate beside the measured ones
    (NCCL reaches 0.26-0.81 of it over 2-4 H200s by kind and size, 16-512 MiB: benchmarks/results/
    s26-h200x*-nccl/). Empty where the cluster has no measured collectives."""
    cal = cluster.calibration
    if cal is None or not cal.collectives:
        return []
    timed = {int(key.rpartition("/")[2]) for key, _, _ in cal.collectives}
    groups = _links(layout, cluster).groups
    used = (groups[c.axis] for c, _ in schedule.all_comms())
    return sorted({g.size for g in used if g.size > 1 and g.nodes == 1 and g.size not in timed})


def _stream_wait(c: Comm, t: float, phase_gemm: float) -> float:
    """Exposed time of a weight stream hidden behind the GEMM of the shard in hand."""
    t_x = t / c.count
    per_shard = phase_gemm / (c.count if c.kind == "broadcast" else c.count + 1)
    hidden_wait = max(0.0, t_x - per_shard)
    if c.kind == "broadcast":
        return t_x + (c.count - 1) * hidden_wait  # the first shard must arrive before any GEMM
    return c.count * hidden_wait  # a ring starts on the rank's own shard


# The overlaps of the expert all-to-alls Megatron-Core's 1F1B schedule pairs with another micro-batch's
# compute (axes/ep.py _dispatch_and_combine; step._paired_exposed prices them)
PAIRED = ("block", "layer")

# Gradient reductions hidden behind the backward are not free: their NCCL kernels share the GPU with
# the backward's, which run slower beside them. Measured on two 2 × H200 machines (dense-7b/2L, dp=2,
# the all-reduces started from the hooks against the same step with the transfers skipped, less the
# exposed last layer's, three interleaved rounds each): the hidden reductions cost 0.56 and 0.39 (4K
# tokens), 0.93 and 0.87 (16K) of their own time alone; this is the mean of the four
# (benchmarks/results/dp-overlap-probe-h200x2.json, "contention"). Applied to every transfer that hides
# behind a phase's compute (_phase_exposed): the same NCCL kernels beside it.
GRAD_OVERLAP_CONTENTION = 0.69


@functools.lru_cache(maxsize=8192)
def as_stack_runs(c: Comm, stack: Stack) -> Comm:
    """A schedule entry with the overlap the stack gives it: tensor-parallel collectives behind the
    neighbouring GEMMs (overlap "tp"), pipeline sends behind the compute ("compute"), ZeRO-3 gathers
    prefetched behind the layers, and gradient reductions exposed where the stack does not overlap them."""
    if stack.tp_overlap and c.axis in ("tp", "tpssm") and c.overlap == "none" and c.block in BLOCKS:
        return replace(c, overlap="tp")
    if stack.pp_overlap and c.axis == "pp":
        return replace(c, overlap="compute")
    if stack.zero3_prefetch and c.what.startswith("updated params all-gather"):
        return replace(c, overlap="compute")  # Megatron's --overlap-param-gather: behind the next forward
    if c.what.startswith("ZeRO-3 ") and stack.zero3_prefetch and c.kind == "all_gather":
        return replace(c, overlap="backward")
    if not stack.grad_overlap and c.overlap == "backward" and c.axis in ("dp", "dp+sp", "sp", "edp"):
        return replace(c, overlap="none")
    return c


def _phase_exposed(comms: list[tuple[Comm, float]], compute_s: float, gemm_s: float, attn_s: float) -> float:
    """Exposed communication of one phase of one block. One communication stream: whatever overlaps
    shares it, so the phase takes at least as long as that stream is busy. Transfers hidden behind the
    compute — gradient reductions behind the backward, and the hidden part of TSP's weight streams and
    of K/V gathers behind the GEMMs and attention — slow it by GRAD_OVERLAP_CONTENTION of the time they
    run (their NCCL kernels share the GPU with it: measured on the gradient reductions, the same
    mechanism for any NCCL kernel beside compute; with it the dense tsp=2 16K rows of the 2- and 4-GPU
    grids moved from +17..+22% to +14..+20%, the 4K rows not at all, nothing else). Transfers hidden
    behind another micro-batch's or layer's compute (overlap "compute": pipeline sends, ZeRO-3's
    prefetched gathers) are not priced here and carry no contention.

        phase = serial + max(compute + stream waits + K/V waits + contention, busy time of the stream)
    """
    serial = waits = busy = hidden = tp = 0.0
    for c, t in comms:
        if c.overlap == "none":
            serial += t
            continue
        busy += t
        if c.overlap == "tp":
            tp += t
        elif c.overlap == "gemm" and c.count > 0:
            wait = _stream_wait(c, t, gemm_s)
            waits += wait
            hidden += max(0.0, t - wait)
        elif c.overlap == "attention":
            wait = max(0.0, t - attn_s)
            waits += wait
            hidden += t - wait
        elif c.overlap == "backward":
            hidden += t
    waits += max(0.0, tp - gemm_s)  # tensor-parallel collectives hide behind the phase's GEMMs
    contention = GRAD_OVERLAP_CONTENTION * min(hidden, compute_s)
    return serial + max(compute_s + waits + contention, busy) - compute_s


def estimate_step(
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    opts: CostOptions,
    cluster: ClusterSpec,
    *,
    schedule: StepSchedule | None = None,
    embeddings: bool = True,
    ctx: PlanContext | None = None,
) -> StepEstimate:
    """`embeddings=False`: the bare layer stack the executor runs (no embedding, LM head, logits). In
    phases (docs/design.md §5): one micro-batch through an average stage's blocks (_block_times), the
    head and the micro-batch's own collectives, the step's gradient sync and optimizer, then the
    pipeline's passes and the launch floor. `ctx`: the plan's context when the caller has it
    (meshplan.costmodel.axes.plan_context), so that its sharding is computed once."""
    ctx = ctx or plan_context(model, layout, seq, batch, opts)
    sh = ctx.sharding
    schedule = schedule or step_schedule(model, layout, seq, batch, opts, embeddings=embeddings, ctx=ctx)
    stack = opts.stack_spec
    dev = Device.of(cluster, stack)
    links = _links(layout, cluster)
    training, decode = opts.training, opts.mode == "decode"
    breakdown: dict[str, float] = {}
    blocks = _block_times(ctx, schedule=schedule, dev=dev, links=links, breakdown=breakdown)
    tokens = batch if decode else batch * seq / sh.token_div
    logits = logits_compute(model, batch if decode or not training else tokens, sh, opts.nbytes("act_dtype"), dev)
    if not embeddings:
        logits = BlockCompute(0.0, 0.0, 0.0, 0.0, 0.0)
    head_fwd, head_bwd = logits.fwd_s, (logits.bwd_s if training else 0.0)
    own_comm, extra_fwd, extra_bwd = _microbatch_collectives(
        schedule, links, stack, blocks.fwd_s + head_fwd, blocks.bwd_s + head_bwd, logits.gemm_fwd_s
    )

    m, pp = schedule.microbatches, layout.pp
    if training and (violation := schedule_violation(stack, pp, layout.zero, m, opts.chunks if pp > 1 else 1)):
        raise MeshplanError(violation)  # priced only as a stack runs it
    if violation := axes.ep.violation(model, layout, opts) or axes.sp.violation(model, layout, opts):
        raise MeshplanError(violation)
    timed = [(c, links.time_s(c)) for c in (as_stack_runs(c, stack) for c in schedule.per_step)]
    step_comm = sum(t for _, t in timed)
    step_exposed = _phase_exposed(timed, blocks.bwd_s * m, 0.0, 0.0)  # gradient sync behind the backward
    held = local_params(model, sh, pp=pp, embeddings=embeddings, by_kind=ctx.by_kind)
    # The optimizer steps the states this rank keeps (ZeRO-1 on: its share; routed experts over edp).
    kept = zero_sharded(model, layout, held, ctx.by_kind, 1 / pp, from_stage=1, stack=stack)
    opt_s = (
        optimizer_time_s(kept, stack.optimizer_step_bytes_per_param, dev, stack.optimizer_hbm_fraction)
        if training
        else 0.0
    )

    # Each stage: its own layers' blocks and the micro-batch's own collectives, forward and backward; on
    # the last the output head and the loss (pipeline.pipeline_passes). Layers alike: a stage is its
    # share of an average stage's blocks.
    placed = stage_layout(model.layers, pp, opts, model.mtp_layers)
    stages = placed.stage_layers
    if model.uniform_layers:
        share = [n / (model.layers / pp) for n in stages]
        body_fwd = [k * (blocks.fwd_s + blocks.exposed_fwd_s) for k in share]
        body_bwd = [k * (blocks.bwd_s + blocks.exposed_bwd_s) for k in share]
        stage_compute = [k * (blocks.fwd_s + blocks.bwd_s) for k in share]
        stage_exposed = [k * blocks.exposed_s for k in share]
        stage_comm = [k * blocks.comm_s for k in share]
        path_fwd, path_comm = blocks.fwd_s * sum(share), sum(share) * blocks.comm_s
    else:
        counts = rank_block_counts(model, placed)
        body_fwd = [blocks.stage(c, "fwd_s") + blocks.stage(c, "exposed_fwd_s") for c in counts]
        body_bwd = [blocks.stage(c, "bwd_s") + blocks.stage(c, "exposed_bwd_s") for c in counts]
        stage_compute = [blocks.stage(c, "fwd_s") + blocks.stage(c, "bwd_s") for c in counts]
        stage_exposed = [blocks.stage(c, "exposed_fwd_s") + blocks.stage(c, "exposed_bwd_s") for c in counts]
        stage_comm = [blocks.stage(c, "comm_s") for c in counts]
        path_fwd = sum(blocks.stage(c, "fwd_s") for c in counts)
        path_comm = sum(stage_comm)
    fwd = [x + extra_fwd for x in body_fwd]
    bwd = [x + extra_bwd for x in body_bwd]
    if training:
        chunk_fwd, chunk_bwd = _chunk_bodies(model, placed, blocks, extra_fwd, extra_bwd)
        passes = pipeline_passes(
            fwd, bwd, m, opts.chunks if pp > 1 else 1, head_fwd, head_bwd, chunk_fwd_s=chunk_fwd, chunk_bwd_s=chunk_bwd
        )
        # The busiest stage's rank: its compute, its exposed collectives, and its wait for the others.
        stage_s = [f + b for f, b in zip(fwd, bwd)]
        stage_s[-1] += head_fwd + head_bwd
        check_passes(stage_s, m, passes.total_s, passes.busy_s)
        r = passes.critical_stage
        compute = m * (stage_compute[r] + (head_fwd + head_bwd if r == pp - 1 else 0.0))
        exposed = m * (stage_exposed[r] + extra_fwd + extra_bwd)
        comm = m * (stage_comm[r] + own_comm) + step_comm
        # Whose collectives the exposed time is, on that rank: each block kind's, the micro-batch's own.
        on_stage = {k: share[r] * n for k, n in schedule.invocations.items()} if model.uniform_layers else counts[r]
        for kind, n in on_stage.items():
            k = blocks.per_kind[kind]
            breakdown[f"exposed_{kind}_s"] = m * n * (k["exposed_fwd_s"] + k["exposed_bwd_s"])
        breakdown["exposed_microbatch_s"] = m * (extra_fwd + extra_bwd)
    else:
        # Inference: one request crosses every stage in turn; no stage waits on another's work.
        total = sum(fwd) + head_fwd
        passes = PipelinePasses(total, total, pp - 1, False)
        compute = path_fwd + head_fwd
        exposed = total - compute
        comm = path_comm + pp * own_comm
    slots = (m + pp - 1) if training else pp  # micro-batch slots a rank launches kernels for
    # The eager executor's kernel launches: a host-side floor under a small step.
    host = slots * _host_s(schedule, layout, opts.mode, dev) if opts.floors_launches else 0.0
    if decode:
        breakdown["decode_host_s"] = host
        tokens_per_step = layout.dp * batch
    else:
        breakdown["host_s"] = host
        tokens_per_step = layout.dp * m * batch * seq
    gpu_step = passes.total_s + step_exposed + opt_s
    step = max(gpu_step, host)
    flops_one = _model_flops(model, batch, seq, decode, training, embeddings, opts)
    model_flops = flops_one * layout.dp * m
    hardware_flops = (flops_one + _recompute_flops(model, batch, seq, opts) if training else flops_one) * layout.dp * m
    peak = step * layout.world_size * dev.peak_flops
    breakdown.update(
        {
            "optimizer_s": opt_s,
            "logits_compute_s": head_fwd + head_bwd,
            "pipeline_slots": slots,
            "microbatches": m,
            "pipeline_passes_s": passes.total_s,
            "bubble_fraction": passes.bubble_fraction,
            "gradient_sync_exposed_s": step_exposed,
        }
    )
    est = StepEstimate(
        step_time_s=step,
        tokens_per_s=tokens_per_step / step if step > 0 else 0.0,
        compute_s=compute,
        comm_s=comm,
        exposed_comm_s=exposed + step_exposed,
        comm_bytes_per_step=schedule.comm_bytes_per_step,
        mfu=model_flops / peak if step > 0 else 0.0,
        tokens_per_step=tokens_per_step,
        bound="",
        breakdown=breakdown,
        hfu=hardware_flops / peak if step > 0 else 0.0,
        bubble_fraction=passes.bubble_fraction,
        microbatches=m,
        stage_layers=stages,
        chunk_layers=placed.chunk_layers,
        bubble_s=passes.bubble_s,
        optimizer_s=opt_s,
        launch_wait_s=step - gpu_step,
        pipeline_simulated=passes.simulated,
    )
    est = replace(est, bound=_bound(est, decode, schedule, links))
    check_step(est, dev, world_size=layout.world_size, hardware_flops=hardware_flops, model_flops=model_flops)
    return est


def _chunk_bodies(model: ModelSpec, placed, blocks: "_Blocks", extra_fwd: float, extra_bwd: float):
    """Each rank's chunks, forward and backward, where they differ (else ((), ())): their layers' blocks
    with their exposed collectives, and 1/v of the micro-batch's own collectives each — together a
    rank's stage as estimate_step prices it."""
    if not placed.uneven_chunks:
        return (), ()
    chunks = len(placed.chunk_layers[0])
    if model.uniform_layers:
        per_layer = len(placed.stage_layers) / model.layers  # a layer's share of an average stage's blocks
        fwd_layer, bwd_layer = (
            (blocks.fwd_s + blocks.exposed_fwd_s) * per_layer,
            (blocks.bwd_s + blocks.exposed_bwd_s) * per_layer,
        )
        fwd = tuple(tuple(n * fwd_layer + extra_fwd / chunks for n in row) for row in placed.chunk_layers)
        bwd = tuple(tuple(n * bwd_layer + extra_bwd / chunks for n in row) for row in placed.chunk_layers)
        return fwd, bwd
    rows = chunk_block_counts(model, placed.chunk_layers)
    fwd = tuple(
        tuple(blocks.stage(c, "fwd_s") + blocks.stage(c, "exposed_fwd_s") + extra_fwd / chunks for c in row)
        for row in rows
    )
    bwd = tuple(
        tuple(blocks.stage(c, "bwd_s") + blocks.stage(c, "exposed_bwd_s") + extra_bwd / chunks for c in row)
        for row in rows
    )
    return fwd, bwd


@dataclass
class _Blocks:
    """One micro-batch through an average pipeline stage's blocks: compute and exposed communication
    seconds of the forward and the backward, and all communication seconds."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    exposed_fwd_s: float = 0.0
    exposed_bwd_s: float = 0.0
    comm_s: float = 0.0
    per_kind: dict = field(default_factory=dict)  # kind -> one invocation's values of the fields above

    def stage(self, counts: dict[str, int], what: str) -> float:
        """`what` (a field above) of a stage running each block kind `counts[kind]` times."""
        return sum(n * self.per_kind[kind][what] for kind, n in counts.items())

    @property
    def compute_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def exposed_s(self) -> float:
        return self.exposed_fwd_s + self.exposed_bwd_s


def kind_recompute(opts: CostOptions, kind: str) -> str:
    """How much of a `kind` block backward redoes, as block_compute takes it: "full" when recompute is, or
    when selective recompute lists the block's module (BlockKind.recompute_modules: Megatron's moe, mlp,
    shared_experts checkpoint the whole block); "selective:<modules>" for the parts selective recompute
    lists (blocks.base.selective_modules reads them: the attention core, an unfused norm, the experts'
    activation); else "none"."""
    if opts.recompute != "selective":
        return opts.recompute
    if rebuilt_whole(kind, opts):
        return "full"
    return "selective:" + ",".join(sorted(opts.recompute_modules))


def _kind_compute(ctx: PlanContext, kind: str, dev: Device, recompute: str) -> BlockCompute:
    """One invocation of a `kind` block on one rank of this plan (compute.block_compute): its own
    sharding (the experts' decomposition where an axis splits them apart), the causal split of the
    sequence axis, the busiest rank's load."""
    model, layout, seq, batch, opts, sh = ctx.model, ctx.layout, ctx.seq, ctx.batch, ctx.opts, ctx.sharding
    decode = opts.mode == "decode"
    tokens = batch if decode else batch * seq / sh.token_div
    causal, zigzag_parts = axes.attention_split(layout, seq, model.mamba_layers == 0, opts.sp_zigzag)
    own = ctx.sharding_of(kind)
    return block_compute(
        model,
        kind,
        tokens * sh.token_div / own.token_div,
        seq,
        own,
        opts.nbytes("act_dtype"),
        dev,
        recompute=recompute,
        training=opts.training,
        causal_fraction=causal,
        zigzag=0 if decode else zigzag_parts,
        row_tokens=1 if decode else seq / own.token_div,
        load=BLOCKS[kind].load(opts),
    )


def step_floor_s(ctx: PlanContext, cluster: ClusterSpec) -> float:
    """A floor under a training step's time for this plan: the busiest point of its pipeline, each
    stage s_r a micro-batch — its blocks' compute as estimate_step prices it (recompute included, the
    head on the last stage) and their own collectives that no compute can hide: a phase (a block's
    forward, its backward) takes at least its serial collectives plus the longer of its compute and
    the collectives overlapped with it (_phase_exposed). A stage r runs its m micro-batches after the
    first micro-batch's forward reached it and before the last backward left it back through the
    stages before it, which take at least 1/v of theirs each way: step ≥ max_r (m·s_r + Σ_{r'<r} s_r'
    / v) — the closed form where the last stage is the busiest (pipeline.pipeline_passes). Left out,
    as each only adds: the 1F1B all-to-all overlap's paired collectives, the micro-batch's own, the
    step's, ZeRO's — meshes that differ only in ZeRO share one floor. The planner skips a mesh whose
    floor is behind the meshes it keeps."""
    layout = ctx.layout if ctx.layout.zero == 0 else replace(ctx.layout, zero=0)
    return _floor(ctx.model, layout, ctx.seq, ctx.batch, ctx.opts, cluster)


@functools.lru_cache(maxsize=16384)
def _floor(model: ModelSpec, layout: Layout, seq: int, batch: int, opts: CostOptions, cluster: ClusterSpec) -> float:
    ctx = plan_context(model, layout, seq, batch, opts)
    dev = Device.of(cluster, opts.stack_spec)
    links = _links(layout, cluster)
    per_kind = {}
    for kind, _ in ctx.model.block_invocations():
        per_kind[kind] = _phases_floor(ctx, kind, _kind_compute(ctx, kind, dev, kind_recompute(opts, kind)), links)

    def floor_of(counts: dict) -> float:  # blocks run counts[kind] times each
        return sum(n * per_kind[k] for k, n in counts.items())

    pp = ctx.layout.pp
    placed = stage_layout(ctx.model.layers, pp, opts, ctx.model.mtp_layers)
    stage_s = [floor_of(counts) for counts in rank_block_counts(ctx.model, placed)]
    tokens = ctx.batch * ctx.seq / ctx.sharding.token_div
    head = logits_compute(ctx.model, tokens, ctx.sharding, opts.nbytes("act_dtype"), dev)
    stage_s[-1] += head.fwd_s + head.bwd_s
    m = opts.steps_for(ctx.layout.dp, pp, ctx.batch)
    chunks = opts.chunks if pp > 1 else 1
    # The first micro-batch reaches rank r through, and the last leaves back through, each earlier
    # rank's first chunk: 1/v of its stage, or its own chunk 0 where chunks differ.
    if placed.uneven_chunks:
        rows = chunk_block_counts(ctx.model, placed.chunk_layers)
        first = [floor_of(row[0]) for row in rows]
        before = [0.0] + list(itertools.accumulate(first))[:-1]
    else:
        before = [b / chunks for b in [0.0] + list(itertools.accumulate(stage_s))[:-1]]
    return max(m * s + b for s, b in zip(stage_s, before))


def _phases_floor(ctx: PlanContext, kind: str, comp: BlockCompute, links: "_Links") -> float:
    """A floor under one training invocation of a `kind` block, forward and backward, with its own
    collectives: each phase at least its serial collectives plus the longer of its compute and the
    collectives overlapped with it (_phase_exposed's terms less its waits and contention)."""
    stack = ctx.opts.stack_spec
    timed = [
        (c, links.time_s(c))
        for c in (as_stack_runs(c, stack) for c in axes.block_comms(ctx, kind))
        if c.overlap not in PAIRED  # the 1F1B all-to-all overlap's pairs: left out
    ]
    total = 0.0
    for phase, compute in (("fwd", comp.fwd_s), ("bwd", comp.bwd_s)):
        mine = [(c, t) for c, t in timed if c.phase == phase]
        serial = sum(t for c, t in mine if c.overlap == "none")
        total += serial + max(compute, sum(t for c, t in mine if c.overlap != "none"))
    return total


def _block_times(ctx: PlanContext, *, schedule: StepSchedule, dev: Device, links: "_Links", breakdown: dict) -> _Blocks:
    """Each block kind's compute (_kind_compute) beside its collectives on the other stream
    (_phase_exposed), times its invocations; per-kind seconds go into `breakdown`."""
    model, layout, batch, opts, sh = ctx.model, ctx.layout, ctx.batch, ctx.opts, ctx.sharding
    stack = opts.stack_spec
    training, decode = opts.training, opts.mode == "decode"
    tokens = batch if decode else batch * ctx.seq / sh.token_div
    out = _Blocks()
    comps = {kind: _kind_compute(ctx, kind, dev, kind_recompute(opts, kind)) for kind in schedule.per_block}
    for kind, comms in schedule.per_block.items():
        comp = comps[kind]
        check_block(kind, comp, dev)
        if decode:  # what the block reads a token: the KV cache, the SSM state
            comp = BLOCKS[kind].decode(comp, model, batch, ctx.seq, sh, opts, dev)
        fwd, bwd = comp.fwd_s, (comp.bwd_s if training else 0.0)
        if not decode:
            fwd += axes.tp.int8_kernels_s(ctx, kind, tokens, dev)
        timed = [(c, links.time_s(c)) for c in (as_stack_runs(c, stack) for c in comms)]
        comm_one = sum(t for _, t in timed)  # one invocation's
        out.comm_s += comm_one * schedule.invocations[kind]
        paired = [x for x in timed if x[0].overlap in PAIRED]
        timed = [x for x in timed if x[0].overlap not in PAIRED]
        exposed_pairs = (
            _paired_exposed(
                paired,
                fwd + bwd,
                _rest_of_layer(comps, schedule.invocations, kind),
                paired_share(schedule.microbatches, layout.pp, opts.chunks if layout.pp > 1 else 1),
            )
            if paired
            else 0.0
        )
        exposed_fwd = _phase_exposed([x for x in timed if x[0].phase == "fwd"], fwd, comp.gemm_fwd_s, comp.attn_fwd_s)
        exposed_bwd = (
            _phase_exposed(
                [x for x in timed if x[0].phase == "bwd"],
                bwd,
                2 * comp.gemm_fwd_s,
                comp.attn_bwd_factor * comp.attn_fwd_s,
            )
            if training
            else 0.0
        )
        exposed_fwd, exposed_bwd = exposed_fwd + exposed_pairs / 2, exposed_bwd + exposed_pairs / 2
        exposed = exposed_fwd + exposed_bwd
        breakdown[f"{kind}_fwd_s"] = fwd + exposed_fwd  # one invocation, its exposed collectives included
        breakdown[f"{kind}_bwd_s"] = bwd + exposed_bwd
        n = schedule.invocations[kind]
        for part, value in (
            ("gemm", comp.gemm_fwd_s * (3 if training else 1)),
            ("attention", comp.attn_fwd_s * (1 + (2.5 if training else 0))),
            ("memory_bound", comp.mem_fwd_s * (3 if training else 1)),
            ("recompute", comp.recompute_fwd_s if training else 0.0),
            ("scan_conv", comp.kernel_fwd_s + comp.kernel_bwd_s),
            ("shard_motion", comp.motion_fwd_s + comp.motion_bwd_s),
        ):
            breakdown[f"{part}_s"] = breakdown.get(f"{part}_s", 0.0) + n * value
        out.fwd_s += n * fwd
        out.bwd_s += n * bwd
        out.exposed_fwd_s += n * exposed_fwd
        out.exposed_bwd_s += n * exposed_bwd
        kernel_gpu = step_kernels_per_block(kind, opts.mode, layout) * DECODE_KERNEL_GPU_S if decode else 0.0
        out.per_kind[kind] = {
            "fwd_s": fwd + kernel_gpu,
            "bwd_s": bwd,
            "exposed_fwd_s": exposed_fwd,
            "exposed_bwd_s": exposed_bwd,
            "comm_s": comm_one,
        }
        breakdown[f"{kind}_compute_s"] = n * (fwd + bwd)
        breakdown[f"{kind}_exposed_comm_s"] = n * exposed

    if decode:  # the GPU's own cost of each tiny decode kernel (blocks.launches.DECODE_KERNEL_GPU_S)
        kernel_gpu = _kernels(schedule, layout, opts.mode) * DECODE_KERNEL_GPU_S
        out.fwd_s += kernel_gpu
        breakdown["decode_kernel_gpu_s"] = kernel_gpu
    return out


def _rest_of_layer(comps: dict, invocations: dict, kind: str) -> float:
    """Forward and backward seconds of the other blocks of a layer that runs `kind` once (each other
    kind's invocations counted up to one a `kind` invocation)."""
    n = invocations[kind]
    return sum((c.fwd_s + c.bwd_s) * min(1.0, invocations[k] / n) for k, c in comps.items() if k != kind and n > 0)


def _paired_exposed(paired: list[tuple[Comm, float]], block_s: float, rest_s: float, share: float) -> float:
    """Exposed seconds of collectives run beside another micro-batch's compute (Megatron-Core's 1F1B
    all-to-all overlap, meshplan.costmodel.axes.ep): those paired with the block hide behind its forward
    and backward, those paired with the layer behind the rest of the layer's — on the `share` of the
    units that have a partner (paired_share); the others run alone. The SMs the communication kernels
    take from the compute beside them are not priced."""
    block = sum(t for c, t in paired if c.overlap == "block")
    layer = sum(t for c, t in paired if c.overlap == "layer")
    hidden = max(0.0, block - block_s) + max(0.0, layer - rest_s)
    return (1 - share) * (block + layer) + share * hidden


def paired_share(microbatches: int, pp: int, chunks: int) -> float:
    """The share of a rank's forward and backward units that run beside another micro-batch's under
    Megatron-Core's 1F1B overlap: all but the first rank's warm-up forwards and the cool-down backwards
    that mirror them — min(p − 1, m) of m under 1F1B, (p − 1)·2 + (v − 1)·p of m·v interleaved (its
    schedule table, pipeline_sim) — and without a pipeline all but one of the m micro-batches."""
    units = microbatches * chunks
    if pp == 1:
        alone = 1
    elif chunks == 1:
        alone = pp - 1
    else:
        alone = (pp - 1) * 2 + (chunks - 1) * pp
    return max(0.0, units - alone) / units if units else 0.0


def _microbatch_collectives(
    schedule: StepSchedule, links: "_Links", stack: Stack, fwd_s: float, bwd_s: float, head_gemm_s: float
) -> tuple[float, float, float]:
    """(all seconds, exposed forward, exposed backward) of a micro-batch's own collectives —
    embedding, loss, pipeline sends, ZeRO 3's gathers — on every stage: weight streams hide behind the
    LM head's GEMM, the rest behind the phase's compute."""
    comm, exposed = 0.0, {}
    for phase, compute_s, gemm_s in (("fwd", fwd_s, head_gemm_s), ("bwd", bwd_s, 2 * head_gemm_s)):
        timed = [
            (c, links.time_s(c)) for c in (as_stack_runs(c, stack) for c in schedule.per_microbatch) if c.phase == phase
        ]
        comm += sum(t for _, t in timed)
        stream = [(c, t) for c, t in timed if c.overlap == "gemm"]
        rest = [(c, t) for c, t in timed if c.overlap != "gemm"]
        exposed[phase] = _phase_exposed(stream, gemm_s, gemm_s, 0.0) + _phase_exposed(rest, compute_s, 0, 0)
    return comm, exposed["fwd"], exposed["bwd"]


def _recompute_flops(model: ModelSpec, batch: int, seq: int, opts: CostOptions) -> float:
    """FLOPs a training step's recompute adds on one replica's micro-batch: one more forward of every
    block under full recompute, of the attention core under selective (Korthikanti et al. 2022 Eq. 8),
    of the blocks whose module selective recompute lists (kind_recompute)."""
    if opts.recompute == "none":
        return 0.0
    one = Sharding(1, 1, 1, 1, 1)
    dev = Device(1.0, 1.0)
    tokens = batch * seq
    total = 0.0
    for kind, n in model.block_invocations():
        load = BLOCKS[kind].load(opts)
        comp = block_compute(model, kind, tokens, seq, one, 2, dev, recompute="none", training=False, load=load)
        redone = kind_recompute(opts, kind)
        if redone == "full":
            total += n * comp.flops_fwd
        elif "core_attn" in selective_modules(redone):
            total += n * BLOCKS[kind].selective_recompute_flops(model, tokens, seq)
    return total


def _kernels(schedule, layout: Layout, mode: str) -> float:
    """Kernels the eager executor launches for one micro-batch (blocks.launches.step_kernels_per_block)."""
    return sum(n * step_kernels_per_block(kind, mode, layout) for kind, n in schedule.invocations.items())


def _host_s(schedule, layout: Layout, mode: str, dev: Device) -> float:
    """Host time to launch one micro-batch: the measured kernels of each block invocation under this
    layout (blocks.launches.step_kernels_per_block), each at the device's host cost per kernel for that block
    and mode (Device.host_kernel_cost: device.STEP_KERNEL_HOST_S and DECODE_KERNEL_HOST_S unless
    `meshplan calibrate` measured them). The executor's stacks have no embedding or LM head: their
    few launches are not counted."""

    decode = mode == "decode"
    return sum(
        n * step_kernels_per_block(kind, mode, layout) * dev.host_kernel_cost(BLOCKS[kind].triton_launches, decode)
        for kind, n in schedule.invocations.items()
    )


def _model_flops(
    model: ModelSpec,
    batch: int,
    seq: int,
    decode: bool,
    training: bool,
    embeddings: bool = True,
    opts: CostOptions | None = None,
) -> float:
    """Model FLOPs of one micro-batch on one replica (no recompute, no sharding): 3× forward in training.
    Every token's top_k routed experts counted (Megatron's convention) but those a capacity below the
    even share drops (`opts`): they run nothing. (block_compute remembers each block: the planner asks
    for the same ones across its meshes.)"""
    one = Sharding(1, 1, 1, 1, 1)
    dev = Device(1.0, 1.0)
    tokens = batch if decode else batch * seq
    fwd = 0.0
    for kind, n in model.block_invocations():
        load = BLOCKS[kind].load(opts) if opts else 1.0
        comp = block_compute(model, kind, tokens, seq, one, 2, dev, recompute="none", training=False, load=load)
        fwd += n * comp.flops_fwd
    if embeddings:  # inference takes the logits of each sequence's last position only
        fwd += logits_compute(model, tokens if training else batch, one, 2, dev).flops_fwd
    return fwd * (3 if training else 1)


def _bound(est: StepEstimate, decode: bool, schedule: StepSchedule, links: _Links) -> str:
    """What limits the step: the host when its kernel launches set it, else the largest of its shares
    (compute, exposed communication, the pipeline's bubble, the optimizer), and for decode what the
    compute waits on."""
    step = est.step_time_s
    if step <= 0:
        return "idle"
    shares = {
        "compute": est.compute_s,
        "communication": est.exposed_comm_s,
        "pipeline": est.bubble_s,
        "optimizer": est.optimizer_s,
    }
    if est.launch_wait_s > 0:  # the host's launches set the step: the GPU's work hides under them
        return "launch-bound: the host issues kernels slower than the GPU runs them"
    largest = max(shares, key=shares.get)
    if decode and largest in ("compute", "communication"):
        streamed = sum(links.time_s(c) * n for c, n in schedule.all_comms() if c.overlap == "gemm")
        if streamed > 0.5 * step:
            return "bandwidth-bound: weights streamed every token"
        if largest == "communication":
            return "latency-bound: small collectives every token"
        return "HBM-bound: weights and cache read every token"
    return {
        "compute": "compute-bound",
        "communication": "communication-bound",
        "pipeline": "pipeline-bound: stages wait in the fill and drain",
        "optimizer": "optimizer-bound",
    }[largest]

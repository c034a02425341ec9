"""Enumerate every mesh that fits a cluster, drop what does not fit in memory, rank the rest, and
say why the winner wins."""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
from dataclasses import dataclass, field, replace

from meshplan.costmodel.axes import ep, plan_context
from meshplan.costmodel.axes import sp as axes_sp
from meshplan.costmodel.crossover import regime
from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.pipeline import pipeline_stages, schedule_violation
from meshplan.costmodel.runtime import fits_device, outside_allocator
from meshplan.costmodel.stacks import Stack
from meshplan.costmodel.step import StepEstimate, estimate_step, step_floor_s
from meshplan.errors import MeshplanError
from meshplan.executor.support import unsupported
from meshplan.layout import Layout, validate_layout, validate_seq
from meshplan.models import ModelSpec
from meshplan.topologies.cluster import ClusterSpec

OBJECTIVES = ("throughput", "memory", "latency")
# The experts' tensor splits recommend searches: "tp", Megatron's default ETP = TP and ETP = 1 (MoE Parallel
# Folding's recommendation); "all", every etp that divides a stage's ranks (about twice the meshes of
# deepseek-v3 on 1,024 GPUs: 16,308 against 8,749).
ETP_SEARCH = ("tp", "all")


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    total_bytes: int
    fits: bool
    estimate: StepEstimate | None
    regime: str
    not_executed: str | None = None  # why `meshplan execute` cannot run it (meshplan.executor.support)
    knobs: dict = field(default_factory=dict)  # the values chosen (or pinned) for this mesh
    outside_bytes: int = 0  # beside the allocator: the CUDA context, NCCL's buffers (costmodel.runtime)

    @property
    def device_bytes(self) -> int:
        """The allocator's peak and what lies beside it: what the GPU must hold."""
        return self.total_bytes + self.outside_bytes

    def as_dict(self) -> dict:
        e = self.estimate
        return {
            "knobs": self.knobs,
            "hfu": e.hfu if e else None,
            "bubble_fraction": e.bubble_fraction if e else None,
            "microbatches": e.microbatches if e else None,
            "layout": str(self.layout),
            "kind": self.layout.kind,
            "total_bytes": self.total_bytes,
            "outside_allocator_bytes": self.outside_bytes,
            "device_bytes": self.device_bytes,
            "fits": self.fits,
            "step_time_s": e.step_time_s if e else None,
            "tokens_per_s": e.tokens_per_s if e else None,
            "comm_bytes_per_step": e.comm_bytes_per_step if e else None,
            "exposed_comm_s": e.exposed_comm_s if e else None,
            "compute_s": e.compute_s if e else None,
            "mfu": e.mfu if e else None,
            "bound": e.bound if e else None,
            "regime": self.regime,
            "executable": self.not_executed is None,
            "not_executed": self.not_executed,
        }


@dataclass(frozen=True)
class Plan:
    ranked: list[Candidate]  # fitting candidates, best first
    dropped: list[Candidate]  # valid meshes that do not fit in memory
    considered: int
    objective: str
    reason: str
    # Meshes not priced in full: their floor (step.step_floor_s) was slower a token than the
    # keep-th best mesh priced (some of them were found to fit first)
    pruned: int = 0


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_layouts(
    model: ModelSpec,
    num_gpus: int,
    seq: int,
    batch: int,
    mode: str,
    *,
    global_batch: int = 0,
    stack: Stack | None = None,
    etp: str = "tp",
) -> list[Layout]:
    """Every dp × pp × (TP | SP | TP+SP | TSP | TP-SSM) mesh of exactly `num_gpus`, valid for the model
    and the shape; for a mixture of experts each decomposition of the experts a stage's ranks allow
    (_expert_layouts); each ZeRO stage `stack` runs at that pp (all of them when None) when training
    with more than one rank to shard over (dp, the sequence ranks where the stack shards there, the
    experts' data-parallel ranks). Any pp up to the layer count (uneven stages); with a global batch
    fixed, only the DP degrees that divide it."""
    tensor_axis = "tpssm" if model.has_mamba else "tp"
    out: list[Layout] = []
    for dp in divisors(num_gpus):
        if global_batch and global_batch % dp:
            continue
        for pp in divisors(num_gpus // dp):
            if pp > model.layers:
                continue
            mp = num_gpus // dp // pp
            shapes = [{}] if mp == 1 else [{tensor_axis: mp}, {"sp": mp}, {"tsp": mp}]
            shapes += [{tensor_axis: t, "sp": mp // t} for t in divisors(mp) if 1 < t < mp]
            for shape in shapes:
                # ZeRO over dp, and the sequence ranks where the stack shards there (dp × cp under Megatron);
                # a mixture of experts' over its experts' data-parallel ranks too
                over = dp * (shape.get("sp", 1) if stack is not None and stack.zero_over_sequence else 1)
                for experts in _expert_layouts(model, dp * mp, shape, etp):
                    edp = Layout(dp=dp, **experts, **shape).expert_data_degree if experts else 1
                    zeros = (0, 1, 2, 3) if mode == "train" and max(over, edp) > 1 else (0,)
                    if stack is not None:  # the ZeRO stages the stack runs at this pp (no schedule asked of it)
                        zeros = tuple(z for z in zeros if schedule_violation(stack, pp, z, 1, 1) is None)
                    for zero in zeros:
                        layout = Layout(dp=dp, pp=pp, zero=zero, **experts, **shape)
                        try:
                            validate_layout(layout, model, num_gpus)
                            validate_seq(layout, seq, batch)
                        except MeshplanError:
                            continue
                        out.append(layout)
    return out


def _expert_layouts(model: ModelSpec, ranks: int, shape: dict, search: str = "tp") -> list[dict]:
    """A mixture of experts' decompositions of a stage's `ranks` (MoE parallel folding): each ep its
    experts allow, the experts split as tp (Megatron's default ETP) or whole (ETP = 1) — or, with
    `search` "all", by any etp that divides the ranks (inside a tensor group, or past it over sequence
    and data ranks, which gather the group's copies: costmodel/axes/ep.py) — etp × ep dividing the
    ranks; [{}] for a model without experts. Under tsp only ep > 1 validates: TSP streams whole
    layers, and its experts are split by ep."""
    if model.moe is None:
        return [{}]
    tensor = shape.get("tp", 1) * shape.get("tpssm", 1)
    splits = divisors(ranks) if search == "all" else sorted({tensor, 1})
    out = []
    for etp in splits:  # (under tsp the tensor degree is 1: the experts split by ep alone)
        for degree in divisors(ranks // etp):
            if model.moe.experts % degree == 0:
                out.append({"ep": degree} | ({} if etp == tensor else {"etp": etp}))
    return out


def _sort_key(objective: str, mode: str):
    if objective == "memory":
        return lambda c: (c.device_bytes, c.estimate.step_time_s)
    if objective == "latency":
        return lambda c: (c.estimate.step_time_s, c.device_bytes)
    return lambda c: (-c.estimate.tokens_per_s, c.device_bytes)


KNOBS = ("recompute", "tp_sequence_parallel", "micro_batch", "virtual_stages")
RECOMPUTE_ORDER = ("none", "selective", "full")  # each no faster than the one before


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    seq: int,
    batch: int,
    opts: CostOptions = CostOptions(),
    *,
    objective: str = "throughput",
    estimate_dropped: bool = False,
    search: frozenset = frozenset(),
    keep: int = 10,
    workers: int | None = None,
    etp: str = "tp",
    headroom_bytes: float = 0.0,
) -> Plan:
    """Rank every mesh. `batch` is the micro-batch (sequences); with opts.global_batch the step's
    batch is fixed and DP changes the accumulation steps. `search`: the knobs (KNOBS) chosen per mesh
    rather than pinned to `opts` / `batch` (search_knobs says how). Under the throughput objective in
    training only the best `keep` meshes are sure to be priced in full: meshes are priced in the order
    of their floors (step.step_floor_s: compute and the collectives it cannot hide), and one whose
    floor is slower a token than the keep-th best so far is not priced, nor any after it (Plan.pruned);
    0 prices every mesh. `workers`: processes that share the meshes out (None: the machine's cores, for
    a thousand meshes or more; 1: this one). `etp`: the experts' tensor splits searched (ETP_SEARCH).
    `headroom_bytes`: what a plan must leave free of each GPU's memory, beyond what lies beside the allocator
    (a user's margin for what no term prices: the caching allocator's slack, buffers of stacks and NICs)."""
    if not 0 <= headroom_bytes < cluster.gpu.memory_bytes:  # NaN too
        raise MeshplanError(
            f"--headroom: {headroom_bytes / 2**30:.3g} GiB is not between 0 and the GPU's "
            f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB; give the GiB a plan must leave free"
        )
    if etp not in ETP_SEARCH:
        raise MeshplanError(f"--etp: unknown {etp!r}; use {' or '.join(ETP_SEARCH)}")
    if objective not in OBJECTIVES:
        raise MeshplanError(f"--objective: unknown {objective!r}; use one of {', '.join(OBJECTIVES)}")
    if unknown := set(search) - set(KNOBS):
        raise MeshplanError(f"search: unknown knob {sorted(unknown)[0]!r}; use {', '.join(KNOBS)}")
    gbs = opts.global_batch if opts.training else 0
    if gbs and "micro_batch" not in search and not any(gbs % (dp * batch) == 0 for dp in divisors(cluster.num_gpus)):
        # Every mesh would be skipped for its batch, not its memory: say so rather than "nothing fits".
        fits = [m for m in divisors(gbs) if m <= 16]
        raise MeshplanError(
            f"--global-batch {gbs} is not --micro-batch {batch} × any data-parallel size of the "
            f"{cluster.num_gpus} GPUs ({', '.join(map(str, divisors(cluster.num_gpus)))}); give a micro-batch "
            f"that divides it ({', '.join(map(str, fits))}), or leave --micro-batch out to search it"
        )
    layouts = enumerate_layouts(
        model, cluster.num_gpus, seq, batch, opts.mode, global_batch=gbs, stack=opts.stack_spec, etp=etp
    )
    if not layouts:
        raise MeshplanError(
            f"no valid mesh of {cluster.num_gpus} GPUs for {model.name} at --seq {seq} --batch {batch}"
            + (f" --global-batch {gbs}" if gbs else "")
        )
    # Throughput in training: the best `keep` seconds a token so far bound the rest (search_knobs skips
    # a mesh whose floor is slower than the keep-th best), so the ranking's top `keep` is exact.
    prune = objective == "throughput" and opts.training and not estimate_dropped and keep > 0
    job = _Job(
        model, cluster, seq, batch, opts, objective, estimate_dropped, search, keep if prune else 0, headroom_bytes
    )
    parts = _in_parallel(job, layouts, workers)
    fitting = [c for f, _, _ in parts for c in f]
    dropped = [c for _, d, _ in parts for c in d]
    pruned = sum(p for _, _, p in parts)
    fitting.sort(key=_sort_key(objective, opts.mode))
    dropped.sort(key=lambda c: c.device_bytes)
    reason = explain(fitting, dropped, objective, opts, cluster, pruned, keep, headroom_bytes)
    return Plan(fitting, dropped, len(layouts), objective, reason, pruned)


@dataclass(frozen=True)
class _Job:
    """What ranking a share of the meshes needs (plan's arguments)."""

    model: ModelSpec
    cluster: ClusterSpec
    seq: int
    batch: int
    opts: CostOptions
    objective: str
    estimate_dropped: bool
    search: frozenset
    keep: int  # 0: price every mesh
    headroom_bytes: float = 0.0  # what a plan must leave free of each GPU (plan's argument)


# Below this many meshes one process ranks them all: starting workers costs more than it saves.
PARALLEL_FROM = 1000


def _in_parallel(job: _Job, layouts: list[Layout], workers: int | None) -> list[tuple]:
    """_rank(job, share) over the meshes, dealt round-robin to `workers` forked processes (None: the
    machine's cores, at most 8), each bounding its share by the least of the workers' keep-th bests."""
    workers = min(8, os.cpu_count() or 1) if workers is None else workers
    if workers <= 1 or len(layouts) < PARALLEL_FROM or "fork" not in multiprocessing.get_all_start_methods():
        return [_rank(job, layouts)]
    global _SHARED_BOUND
    shares = [layouts[i::workers] for i in range(workers)]
    context = multiprocessing.get_context("fork")
    _SHARED_BOUND = context.Value("d", math.inf, lock=False)  # inherited by the forked workers
    try:
        with context.Pool(workers) as pool:
            return pool.starmap(_rank, [(job, share) for share in shares])
    finally:
        _SHARED_BOUND = None


# The least of the workers' keep-th best seconds a token (each one's is a bound on every worker's
# meshes: the whole ranking's keep-th best is no slower): set in _in_parallel, None in one process.
_SHARED_BOUND = None


def _rank(job: _Job, layouts: list[Layout]) -> tuple[list, list, int]:
    """(fitting, dropped, pruned) of these meshes, each with its knobs searched (search_knobs)."""
    model, cluster, seq, batch, opts = job.model, job.cluster, job.seq, job.batch, job.opts
    fitting: list[Candidate] = []
    dropped: list[Candidate] = []
    new_tokens = batch if opts.mode == "decode" else batch * seq  # tokens through the layer per step
    kept: list[float] = []  # the best seconds a token priced so far, at most `keep` of them
    pruned = 0
    if job.keep:  # the meshes whose compute could be fastest first: the bound tightens soonest
        least: dict[Layout, float | None] = {}  # meshes that differ only in ZeRO share it
        floors = {}
        for layout in layouts:
            base = layout if layout.zero == 0 else replace(layout, zero=0)
            if base not in least:
                least[base] = _least_floor(job, base)
            floors[layout] = least[base]
        layouts = sorted((x for x in layouts if floors[x] is not None), key=floors.__getitem__)
    for i, layout in enumerate(layouts):
        bound = kept[-1] if job.keep and len(kept) == job.keep else math.inf
        if job.keep and _SHARED_BOUND is not None:
            bound = min(bound, _SHARED_BOUND.value)
        if bound < math.inf and floors[layout] > bound * (1 + 1e-9):
            pruned += len(layouts) - i  # this and every later mesh: no setting's floor can reach the bound
            break
        choice = search_knobs(
            model,
            cluster,
            layout,
            seq,
            batch,
            opts,
            search=job.search,
            objective=job.objective,
            bound=bound,
            headroom_bytes=job.headroom_bytes,
        )
        if choice is None:
            continue
        if choice is SKIPPED or (choice[2] and choice[1] is None):  # cannot reach the top `keep`
            pruned += 1
            continue
        mem, est, fits, knobs, used = choice
        if est is None and job.estimate_dropped:
            est = estimate_step(model, layout, seq, knobs["micro_batch"], used, cluster)
        cand = Candidate(
            layout,
            mem.total_bytes,
            fits,
            est,
            regime(model, layout, new_tokens, used),
            unsupported(layout, model),
            knobs,
            # with the options search_knobs fitted it by (its knobs open no other communicator)
            outside_allocator(model, layout, seq, opts, cluster.gpus_per_node).total_bytes,
        )
        (fitting if fits else dropped).append(cand)
        if job.keep and fits:
            kept = sorted(kept + [est.step_time_s / est.tokens_per_step])[: job.keep]
            if _SHARED_BOUND is not None and len(kept) == job.keep and kept[-1] < _SHARED_BOUND.value:
                _SHARED_BOUND.value = kept[-1]
    return fitting, dropped, pruned


def _least_floor(job: _Job, layout: Layout) -> float | None:
    """The least seconds a token any setting of this mesh's knobs could take (step.step_floor_s at
    no recompute and the most virtual stages searched: each is a floor under the others), None where
    no setting is valid."""
    space = _knob_options(job.model, layout, job.batch, job.opts, job.search)
    if space is None:
        return None
    batches, chunks, sps, _ = space
    least = math.inf
    for sp in sps:
        for mb in batches:
            ctx = plan_context(job.model, layout, job.seq, mb, _trial(job.opts, sp, max(chunks), "none"))
            least = min(least, _floor_per_token(ctx, job.cluster))
    return least


def _floor_per_token(ctx, cluster: ClusterSpec) -> float:
    """step.step_floor_s a token of the step (every replica's micro-batches)."""
    dp, pp = ctx.layout.dp, ctx.layout.pp
    tokens = dp * ctx.opts.steps_for(dp, pp, ctx.batch) * ctx.batch * ctx.seq
    return step_floor_s(ctx, cluster) / tokens


def _knob_options(model: ModelSpec, layout: Layout, batch: int, opts: CostOptions, search: frozenset):
    """The values each knob may take on this mesh: pinned ones as `opts` / `batch` give them."""
    gbs = opts.global_batch if opts.training else 0
    if "micro_batch" in search and gbs:
        per_replica = gbs // layout.dp
        fits = [m for m in (1, 2, 4, 8, 16) if per_replica % m == 0]
        # The smallest fills a pipeline best; the largest does the most a launch. Without a pipeline or a
        # launch floor a step's time does not depend on it (the same tokens, the same collectives' bytes),
        # and the smallest holds the least.
        batches = sorted({fits[0], fits[-1]}) if layout.pp > 1 or opts.floors_launches else [fits[0]]
    else:
        batches = [batch]
    if gbs and any(gbs % (layout.dp * m) for m in batches):
        return None
    if "virtual_stages" in search and layout.pp > 1 and opts.training:
        common = math.gcd(*pipeline_stages(model.layers, layout.pp, opts.stage_layers))
        chunks = [1] + [max(d for d in range(1, 9) if common % d == 0)]
    else:
        chunks = [opts.chunks]
    t = layout.tensor_degree > 1
    sp = [True] if "tp_sequence_parallel" in search and t and opts.training else [opts.tp_sequence_parallel]
    if ep.tensor_violation(model, layout, replace(opts, tp_sequence_parallel=sp[0])):
        return None  # a mixture of experts under TP without Megatron-SP: no stack runs it
    if axes_sp.violation(model, layout, opts):
        return None  # heads the context-parallel all-to-all cannot deal out
    recompute = list(RECOMPUTE_ORDER) if "recompute" in search and opts.training else [opts.recompute]
    return batches, sorted(set(chunks)), sp, recompute


def search_knobs(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    seq: int,
    batch: int,
    opts: CostOptions,
    *,
    search: frozenset,
    objective: str = "throughput",
    bound: float = math.inf,
    headroom_bytes: float = 0.0,
):
    """(memory, estimate or None, fits, knobs, options) for one mesh (valid for the model and the
    cluster: enumerate_layouts checks), its knobs chosen.

    Recompute: the first of none, selective, full whose memory fits — each is no faster than the one
    before, so the first that fits is the fastest (selective saves nothing under flash attention and
    is skipped there). Megatron-SP on the TP axis: on — it splits the replicated activations for the
    same bytes moved (Korthikanti et al. 2022 §4.2.2). Micro-batch: the smallest (the fullest pipeline,
    the least memory) and the largest the global batch allows, each estimated. Virtual stages: 1 and the
    most that divide every stage, each estimated. The fastest that fits wins (the smallest under the
    memory objective); none fitting, the smallest is reported. `bound` (seconds a token): a setting
    whose floor (step.step_floor_s) is slower is not estimated — (memory, None, True, …) when one such was found
    to fit, SKIPPED when no setting was priced at all. A setting fits when it leaves `headroom_bytes` of the
    GPU free besides."""
    space = _knob_options(model, layout, batch, opts, search)
    if space is None:
        return None
    batches, chunks, sps, recomputes = space
    best = smallest = fitted = None
    # Beside the allocator (the CUDA context, one set of NCCL buffers a communicator): the same for every
    # setting of this mesh's knobs, priced once.
    outside = functools.cache(lambda: outside_allocator(model, layout, seq, opts, cluster.gpus_per_node))

    def behind(ctx) -> bool:
        """The setting's floor is slower a token than the bound (a floor tying it is kept)."""
        return _floor_per_token(ctx, cluster) > bound * (1 + 1e-9)

    skipped = 0
    for sp in sps:
        for mb in batches:
            for v in chunks:
                if opts.training and schedule_violation(
                    opts.stack_spec, layout.pp, layout.zero, opts.steps_for(layout.dp, layout.pp, mb), v
                ):
                    continue  # a schedule the stack cannot run
                # No recompute at all behind the bound: no need to know whether it fits.
                if bound < math.inf and behind(plan_context(model, layout, seq, mb, _trial(opts, sp, v, "none"))):
                    skipped += 1
                    continue
                for rc in recomputes:
                    if rc == "selective" and opts.flash_attention and len(recomputes) > 1:
                        continue
                    trial = _trial(opts, sp, v, rc)
                    ctx = plan_context(model, layout, seq, mb, trial)  # enumerate_layouts checked the mesh
                    mem = memory_per_gpu(model, layout, seq, mb, trial, ctx=ctx)
                    knobs = {"recompute": rc, "tp_sequence_parallel": sp, "micro_batch": mb, "virtual_stages": v}
                    if smallest is None or mem.total_bytes < smallest[0].total_bytes:
                        smallest = (mem, None, False, knobs, trial)
                    if opts.training and ep.violation(model, layout, trial):
                        continue  # a setting the stack's MoE rules refuse (the all-to-all overlap's)
                    if not fits_device(mem.total_bytes, outside(), cluster.gpu.memory_bytes - headroom_bytes):
                        continue
                    if bound < math.inf and behind(ctx):
                        fitted = fitted or (mem, None, True, knobs, trial)
                        break  # its floor is behind the bound, and a later recompute no faster
                    est = estimate_step(model, layout, seq, mb, trial, cluster, ctx=ctx)
                    key = (
                        (mem.total_bytes, est.step_time_s)
                        if objective == "memory"
                        else (est.step_time_s / est.tokens_per_step, mem.total_bytes)
                    )
                    if best is None or key < best[0]:
                        best = (key, (mem, est, True, knobs, trial))
                    break  # a later recompute is no faster
    if best is None and fitted is None and skipped and smallest is None:
        return SKIPPED  # every setting's floor is behind the bound
    return best[1] if best else fitted or smallest


# search_knobs' answer for a mesh none of whose settings can reach the bound, priced or not
SKIPPED = "skipped"

# A winner leaving less than this share of the GPU free is said to be tight: the caching allocator's reserved
# peak stood up to 2.33 GiB (1.005-1.284x) above its allocated peak in 77 of the executor's training runs
# (benchmarks/results/s22-*/, peak_reserved_bytes; expandable segments on) — 2.9% of an H100, 1.6% of an
# H200 — a slack the fit check does not count.
TIGHT_SHARE = 0.05


@functools.lru_cache(maxsize=1024)
def _trial(opts: CostOptions, sp: bool, v: int, recompute: str) -> CostOptions:
    """`opts` with one setting of the searched knobs (virtual stages > 1: the interleaved schedule)."""
    schedule = "interleaved" if v > 1 else "1f1b"
    modules = opts.recompute_modules if recompute == "selective" else ("core_attn",)
    return replace(
        opts,
        tp_sequence_parallel=sp,
        virtual_stages=v,
        schedule=schedule,
        recompute=recompute,
        recompute_modules=modules,
    )


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"


def explain(
    ranked: list[Candidate],
    dropped: list[Candidate],
    objective: str,
    opts: CostOptions,
    cluster: ClusterSpec,
    pruned: int = 0,
    keep: int = 0,
    headroom_bytes: float = 0.0,
) -> str:
    """One paragraph: why the winner wins, and what the runner-up lost on."""
    room = f" with {_gib(headroom_bytes)} left free (--headroom)" if headroom_bytes else ""
    if not ranked:
        least = dropped[0] if dropped else None
        need = (
            f"; the smallest, {least.layout}, needs {_gib(least.device_bytes)} ({_gib(least.outside_bytes)} of it "
            f"the CUDA context and NCCL's buffers beside the allocator)"
            if least
            else ""
        )
        return (
            f"Nothing fits in {_gib(cluster.gpu.memory_bytes)} per GPU{room}{need}. Use more GPUs (--nodes), "
            f"a shorter --seq, a smaller --batch, or --recompute full."
        )
    w = ranked[0].estimate
    win = ranked[0]
    what = {"train": "step", "prefill": "time to first token", "decode": "time per output token"}[opts.mode]
    per = {"train": "step", "prefill": "prefill", "decode": "token"}[opts.mode]
    text = [
        f"{win.layout} wins on {objective}: {w.tokens_per_s:,.0f} tokens/s, {what} {_ms(w.step_time_s)}, "
        f"{_gib(win.device_bytes)} per GPU ({w.bound}; {win.regime})."
    ]
    free = cluster.gpu.memory_bytes - win.device_bytes
    if free < TIGHT_SHARE * cluster.gpu.memory_bytes:
        fix = "more GPUs (--nodes) or --recompute full" if objective == "memory" else "--objective memory"
        text.append(
            f"It leaves {_gib(free)} of {_gib(cluster.gpu.memory_bytes)} free: PyTorch's caching allocator reserves "
            f"more than it hands out, which no term prices (up to 2.3 GiB over its peak in meshplan's own training "
            f"runs), so a plan this tight may not run; {fix} leaves more room"
            + (", and --headroom GIB ranks only plans that leave that much." if not headroom_bytes else ".")
        )
    if headroom_bytes:
        text.append(f"Every plan ranked leaves at least {_gib(headroom_bytes)} of each GPU free (--headroom).")
    if w.bound.startswith("launch-bound"):
        text.append(
            "The step is the host launching an eager PyTorch stack's kernels (measured per kernel): a "
            "larger --batch carries more tokens per launch, and --no-launch-floor prices the GPU work "
            "alone, as a stack that captures its steps in CUDA graphs would run."
        )
    if len(ranked) > 1:
        text.append(_runner_up(win, ranked[1], objective, per))
    close = [
        c for c in ranked[1:] if c.estimate.step_time_s and abs(c.estimate.tokens_per_s / w.tokens_per_s - 1) <= 0.02
    ]
    if close:
        roomiest = min([win] + close, key=lambda c: c.device_bytes)
        text.append(
            f"{len(close) + 1} meshes are within 2% of the winner's throughput, inside the cost model's "
            f"error: among them {roomiest.layout} leaves the most memory free ({_gib(roomiest.device_bytes)} "
            f"per GPU)."
        )
    if opts.mode == "decode":
        streamed = [c for c in ranked + dropped if c.layout.weight_axis == "tsp" and c.estimate is not None]
        if streamed and win.layout.weight_axis != "tsp":
            best = max(streamed, key=lambda c: c.estimate.tokens_per_s)
            text.append(
                f"TSP layouts stream every weight shard for every token: the fastest, {best.layout}, "
                f"reaches {best.estimate.tokens_per_s:,.0f} tokens/s ({best.estimate.bound})."
            )
    if win.not_executed:
        runnable = next((c for c in ranked if c.not_executed is None), None)
        then = (
            f" The fastest it runs is {runnable.layout} ({runnable.estimate.tokens_per_s:,.0f} tokens/s, "
            f"{1 - runnable.estimate.tokens_per_s / w.tokens_per_s:.1%} behind)."
            if runnable
            else " It runs none of the meshes that fit."
        )
        text.append(f"meshplan execute cannot check {win.layout} on GPUs ({win.not_executed}).{then}")
    if pruned:
        text.append(
            f"{len(ranked)} of the {len(ranked) + len(dropped)} valid meshes priced fit; {pruned} more were not "
            f"priced in full: their compute and the collectives it cannot hide are slower a token than the "
            f"{keep} best meshes' whole steps."
        )
    else:
        text.append(f"{len(ranked)} of {len(ranked) + len(dropped)} valid meshes fit.")
    return " ".join(text)


# The parts a step is the sum of (StepEstimate), as the reason text names them.
STEP_PARTS = (
    ("compute", "compute_s"),
    ("pipeline bubble", "bubble_s"),
    ("exposed communication", "exposed_comm_s"),
    ("optimizer step", "optimizer_s"),
    ("kernel launches beyond the GPU's work", "launch_wait_s"),
)


def _runner_up(win: Candidate, run: Candidate, objective: str, per: str) -> str:
    """Why the runner-up lost, comparing like with like: time per token under the throughput objective
    (the two steps may carry different tokens), per step under latency — the part of the step whose
    difference is largest, each side's value beside it; a tie inside the model's error goes to memory."""
    w, r = win.estimate, run.estimate
    head = f"The runner-up, {run.layout} ({r.tokens_per_s:,.0f} tokens/s)"
    if objective == "memory":
        return f"{head}, lost because it needs {_gib(run.device_bytes)} per GPU against {_gib(win.device_bytes)}."
    # Seconds of each part for the winner's tokens (throughput) or for one step (latency).
    scale = w.tokens_per_step / r.tokens_per_step if objective == "throughput" and r.tokens_per_step else 1.0
    w_total, r_total = w.step_time_s, r.step_time_s * scale
    slower = r_total / w_total - 1 if w_total > 0 else 0.0
    unit = per if scale == 1.0 else f"{w.tokens_per_step:,.0f} tokens"
    if slower <= 1e-3:
        if run.device_bytes >= win.device_bytes:
            need = f"{_gib(run.device_bytes)} per GPU against {_gib(win.device_bytes)}"
            return f"{head}, lost because it ties on time and needs {need}."
        return (
            f"{head}, is {slower:.2%} slower per {unit}, a tie inside the cost model's error, though it needs less "
            f"memory ({_gib(run.device_bytes)} per GPU against {_gib(win.device_bytes)})."
        )
    diffs = {name: getattr(r, attr) * scale - getattr(w, attr) for name, attr in STEP_PARTS}
    main = max(diffs, key=diffs.get)
    attr = dict(STEP_PARTS)[main]
    carries = (
        f" (its step carries {r.tokens_per_step:,.0f} tokens against {w.tokens_per_step:,.0f}; times are for the "
        f"winner's {w.tokens_per_step:,.0f})"
        if scale != 1.0
        else ""
    )
    owner = _exposed_owner(w, r, scale) if attr == "exposed_comm_s" else ""
    return (
        f"{head}, is {slower:.1%} slower per {unit}{carries}: the largest difference is its {main}, "
        f"{_ms(getattr(r, attr) * scale)} against {_ms(getattr(w, attr))}{owner}."
    )


# Whose collectives a block kind's exposed communication is, as the reason text names them.
COMM_OWNERS = {"experts": "the experts' token all-to-all (dispatch and combine)"}


def _exposed_owner(w: StepEstimate, r: StepEstimate, scale: float) -> str:
    """', most of it <whose>' when one block kind's collectives make most of the runner-up's extra
    exposed communication (the experts' all-to-all, the attention's K/V gathers …); '' otherwise."""

    def exposed(est: StepEstimate, k: str) -> float:
        return est.breakdown.get(f"{k}_exposed_comm_s", 0.0) * est.microbatches

    kinds = {k.removesuffix("_exposed_comm_s") for k in r.breakdown if k.endswith("_exposed_comm_s")}
    diffs = {k: exposed(r, k) * scale - exposed(w, k) for k in kinds}
    total = r.exposed_comm_s * scale - w.exposed_comm_s
    if not diffs or total <= 0:
        return ""
    kind = max(diffs, key=diffs.get)
    if diffs[kind] < 0.5 * total:
        return ""
    whose = COMM_OWNERS.get(kind, f"the collectives of its {kind} blocks")
    return f", most of it {whose}"

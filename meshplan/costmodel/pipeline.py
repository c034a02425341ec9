"""Pipeline parallelism as production stacks run it: uneven stages, the 1F1B and interleaved 1F1B
schedules, the micro-batches a fixed global batch gives, the bubble, and what each stage keeps in flight.

Sources: Narayanan et al. 2021 §2.2 (1F1B: bubble (p − 1)/m of the ideal time; interleaved with v model
chunks a rank: (p − 1)/(v·m)); Korthikanti et al. 2022 §4.2.3 (the first stage holds p micro-batches of
its layers, L layers' worth; interleaved, (1 + (p − 1)/(p·v)) times that); Megatron-LM's interleaved
schedule (megatron/core/pipeline_parallel/schedules.py: rank r warms up (p − r − 1)·2 + (v − 1)·p chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel.pipeline_sim import one_f_one_b, simulate
from meshplan.costmodel.stacks import Stack
from meshplan.errors import MeshplanError


def pipeline_stages(layers: int, pp: int, stage_layers: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Layers of each of `pp` stages: `stage_layers` when given (checked), else as even as they go, the
    extra layers of an uneven split in the middle stages — the first stage also holds the embedding,
    the last the output head and the loss — then the first (the embedding costs little time), the last
    only when every other stage has one."""
    if stage_layers:
        if len(stage_layers) != pp:
            raise MeshplanError(f"--stage-layers gives {len(stage_layers)} stages but pp={pp}; give one count a stage")
        if any(n < 1 for n in stage_layers):
            raise MeshplanError(f"--stage-layers: every stage needs at least one layer, got {list(stage_layers)}")
        if sum(stage_layers) != layers:
            raise MeshplanError(f"--stage-layers adds up to {sum(stage_layers)} layers but the model has {layers}")
        return tuple(stage_layers)
    if pp > layers:
        raise MeshplanError(f"layout: pp={pp} exceeds the model's {layers} layers; use pp <= {layers}")
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    middle = list(range(1, pp - 1)) if pp > 2 else list(range(pp))
    order = middle + [i for i in range(pp) if i not in middle]
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def in_flight_chunks(stage: int, pp: int, microbatches: int, chunks: int) -> int:
    """Model chunks (of 1/`chunks` of the stage's layers) whose activations stage `stage` holds at its
    peak: 1F1B keeps min(m, p − r) micro-batches; interleaved, Megatron's warm-up (p − r − 1)·2 +
    (v − 1)·p chunks plus the one in hand, at most all m·v."""
    if chunks == 1:
        return min(microbatches, pp - stage)
    return min(microbatches * chunks, (pp - stage - 1) * 2 + (chunks - 1) * pp + 1)


def interleaved_memory_factor(pp: int, chunks: int) -> float:
    """The first stage's activations against 1F1B's (Korthikanti et al. 2022 §4.2.3): 1 + (p − 1)/(p·v)."""
    return 1 + (pp - 1) / (pp * chunks) if chunks > 1 else 1.0


@dataclass(frozen=True)
class PipelinePasses:
    """A training step's forward and backward passes through the pipeline, seen from its busiest
    stage: the passes take `total_s`, of which that stage computes `busy_s` and waits `bubble_s`."""

    total_s: float
    busy_s: float
    critical_stage: int
    simulated: bool  # priced by the simulator (meshplan.costmodel.pipeline_sim), not the closed form

    @property
    def bubble_s(self) -> float:
        return self.total_s - self.busy_s

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.total_s if self.total_s > 0 else 0.0


def closed_form_holds(fwd_s: list[float], bwd_s: list[float], microbatches: int, chunks: int) -> bool:
    """Where the closed form is the schedule's exact time (tests/test_invariants.py holds it to the
    simulator there): every stage's layers take the same time, the last adding its head; under the
    interleaved schedule, micro-batches in whole groups of p (Megatron-Core's default
    microbatch_group_size_per_vp_stage). Stages of unequal bodies — an uneven split of the layers —
    are not: 1F1B's warm-up hides part of the fill behind a slow first stage, and the closed form
    comes out up to 20% long (and, interleaved, up to 7% short)."""
    pp = len(fwd_s)
    even = all(_close(f, fwd_s[0]) and _close(b, bwd_s[0]) for f, b in zip(fwd_s, bwd_s))
    return even and (chunks == 1 or microbatches % pp == 0)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-30)


def pipeline_passes(
    fwd_s: list[float],
    bwd_s: list[float],
    microbatches: int,
    chunks: int,
    head_fwd_s: float = 0.0,
    head_bwd_s: float = 0.0,
) -> PipelinePasses:
    """The passes of `microbatches` micro-batches through stages whose layers take `fwd_s[r]` and
    `bwd_s[r]` a micro-batch (in `chunks` equal model chunks a rank under the interleaved schedule),
    the last stage's last chunk adding the output head and loss (`head_fwd_s`, `head_bwd_s`).

    Closed form where it is exact (closed_form_holds): the last stage, slowest, sets the steady
    state, m of its micro-batches; the others fill and drain around it in chunks of 1/v of a stage —
    for stages of t and a head of h, m·(t + h) + (p − 1)·t/v, the bubble (p − 1)/(v·m + p − 1) of the
    passes without a head (Narayanan et al. 2021 §2.2). Elsewhere the schedule is simulated
    (meshplan.costmodel.pipeline_sim, Megatron-Core's order)."""
    pp, m = len(fwd_s), microbatches
    stage_s = [f + b for f, b in zip(fwd_s, bwd_s)]
    stage_s[-1] += head_fwd_s + head_bwd_s
    critical = max(range(pp), key=lambda r: (stage_s[r], r))
    busy = m * stage_s[critical]
    if closed_form_holds(fwd_s, bwd_s, m, chunks):
        return PipelinePasses(busy + (sum(stage_s) - stage_s[critical]) / chunks, busy, critical, False)
    if chunks == 1:  # the same schedule solved cycle by cycle (pipeline_sim.one_f_one_b): fast at scale
        f, b = list(fwd_s), list(bwd_s)
        f[-1] += head_fwd_s
        b[-1] += head_bwd_s
        return PipelinePasses(one_f_one_b(f, b, m).total_s, busy, critical, True)
    fwd = [[f / chunks] * chunks for f in fwd_s]
    bwd = [[b / chunks] * chunks for b in bwd_s]
    fwd[-1][-1] += head_fwd_s
    bwd[-1][-1] += head_bwd_s
    result = simulate(fwd, bwd, m, chunks=chunks)
    return PipelinePasses(result.total_s, busy, critical, True)


def validate_batch(
    layers: int, pp: int, dp: int, micro_batch: int, global_batch: int, chunks: int, stage_layers: tuple[int, ...] = ()
) -> tuple[int, ...]:
    """The stages' layer counts, after checking what production schedules need: a global batch that
    DP × MBS divides, virtual stages that divide every stage's layers. One clear error otherwise."""
    if micro_batch < 1:
        raise MeshplanError(f"--micro-batch must be >= 1, got {micro_batch}")
    if global_batch and global_batch % (dp * micro_batch):
        raise MeshplanError(
            f"--global-batch {global_batch} is not divisible by dp × micro-batch = {dp} × {micro_batch}"
            f" = {dp * micro_batch}; use a multiple of {dp * micro_batch}"
        )
    stages = pipeline_stages(layers, pp, stage_layers)
    if chunks > 1:
        if pp == 1:
            raise MeshplanError("--schedule interleaved needs pp > 1")
        bad = [n for n in stages if n % chunks]
        if bad:
            raise MeshplanError(
                f"--virtual-stages {chunks} does not divide a stage's {bad[0]} layers "
                f"(stages {list(stages)}); pick a divisor of every stage's layer count"
            )
    return stages


def schedule_violation(stack: Stack, pp: int, zero: int, microbatches: int, chunks: int) -> str | None:
    """Why `stack` cannot run this pipeline and data-parallel sharding, in one line (None: it can).

    Interleaving with v chunks a rank (Megatron-Core's forward_backward_pipelining_with_interleaving):
    micro-batches in groups of N = microbatch_group_size_per_vp_stage, p <= N <= m, and a last group of
    none or at least p (a shorter one stalls on its dependencies). The stacks here run the default
    N = p: m a multiple of p, as the Megatron-LM of 2021 asked outright."""
    if chunks > 1:
        if not stack.interleaved_min_pp:
            return f"--stack {stack.name} has no interleaved pipeline schedule; use --virtual-stages 1"
        if pp < stack.interleaved_min_pp:
            return (
                f"--stack {stack.name} interleaves pipelines of at least {stack.interleaved_min_pp} stages, "
                f"not pp={pp}; use --virtual-stages 1"
            )
        n = pp  # microbatch_group_size_per_vp_stage's default
        if not pp <= n <= microbatches or 0 < microbatches % n < pp:
            return (
                f"the interleaved schedule takes micro-batches in groups of {n} (at least pp={pp}): "
                f"{microbatches} a step leave a group of {microbatches % n or microbatches}; use a number of "
                f"micro-batches (global batch / (dp × micro-batch)) that is a multiple of {pp}, or --virtual-stages 1"
            )
    if zero > stack.max_zero:
        return f"--stack {stack.name} runs ZeRO up to stage {stack.max_zero}, not zero={zero}"
    if pp > 1 and zero > stack.max_zero_with_pp:
        return (
            f"--stack {stack.name} runs ZeRO up to stage {stack.max_zero_with_pp} with pipeline parallelism, "
            f"not zero={zero} with pp={pp}; use zero<={stack.max_zero_with_pp} or pp=1"
        )
    return None

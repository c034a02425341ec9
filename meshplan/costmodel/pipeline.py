"""Pipeline parallelism as production stacks run it: uneven stages, the 1F1B and interleaved 1F1B
schedules, the micro-batches a fixed global batch gives, the bubble, and what each stage keeps in flight.

Sources: Narayanan et al. 2021 §2.2 (1F1B: bubble (p − 1)/m of the ideal time; interleaved with v model
chunks a rank: (p − 1)/(v·m)); Korthikanti et al. 2022 §4.2.3 (the first stage holds p micro-batches of
its layers, L layers' worth; interleaved, (1 + (p − 1)/(p·v)) times that); Megatron-LM's interleaved
schedule (megatron/core/pipeline_parallel/schedules.py: rank r warms up (p − r − 1)·2 + (v − 1)·p chunks).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from meshplan.costmodel.pipeline_sim import one_f_one_b, rank_order, simulate
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


# Megatron-Core's layout characters (pipeline_parallel_layer_layout.py: parse_str_to_list, Megatron-LM d98e8a6).
LAYOUT_CHARS = {"E": "the embedding", "t": "a decoder layer", "m": "an MTP layer", "L": "the loss"}


def parse_pipeline_layout(text: str) -> tuple[str, ...]:
    """Megatron-Core's --pipeline-model-parallel-layout as its virtual stages in order, each a string of
    E, t, m, L: commas dropped, "(…)*n" then "x*n" unrolled, "|" between stages, as parse_str_to_list
    does. Stage k is model chunk k // pp of rank k % pp (PipelineParallelLayerLayout.__init__).
    E.g. "Et*3|(tt|)*29,m|L" is [Ettt] + [tt] × 29 + [m] + [L]."""
    flat = text.replace(",", "")
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), flat)
    unknown = sorted(set(flat) - set(LAYOUT_CHARS) - {"|"})
    if not text or unknown:
        what = f"unknown character {unknown[0]!r}" if unknown else "empty"
        raise MeshplanError(
            f"--pipeline-layout {text!r}: {what}; write Megatron-Core's layout: E (embedding), t (decoder layer), "
            "m (MTP layer), L (loss), | between stages, (…)*n and x*n to repeat, e.g. Et*3|(tt|)*29,m|L"
        )
    return tuple(flat.split("|"))


@dataclass(frozen=True)
class StageLayout:
    """Where a pipeline's layers sit: `stage_layers[r]` on rank r, and — where a rank's model chunks differ
    — `chunk_layers[r][c]` in its chunk c (virtual stage c·p + r); () where every rank's chunks are equal
    (1/v of its layers each). The embedding is on rank 0's first chunk, the head and loss on the last
    rank's last chunk."""

    stage_layers: tuple[int, ...]
    chunk_layers: tuple[tuple[int, ...], ...] = ()

    @property
    def uneven_chunks(self) -> bool:
        return bool(self.chunk_layers)


def production_layout(opts) -> bool:
    """The options lay the pipeline out as Megatron-Core's layout flags do (not --stage-layers or even)."""
    return bool(
        opts.pipeline_layout
        or opts.first_stage_layers
        or opts.last_stage_layers
        or opts.account_for_embedding
        or opts.account_for_loss
    )


@functools.lru_cache(maxsize=4096)
def stage_layout(layers: int, pp: int, opts, mtp_layers: int = 0) -> StageLayout:
    """The layers of each pipeline rank and, where they differ, of each of its model chunks, under the
    options (CostOptions): --pipeline-layout, --first-stage-layers / --last-stage-layers, the
    --account-for-embedding / --account-for-loss split, else pipeline_stages (--stage-layers or even).
    `mtp_layers`: the model's last layers that are MTP modules (ModelSpec.mtp_layers). Checked: one clear
    error for a layout Megatron-Core would refuse or that does not cover the model."""
    chunks = opts.chunks if pp > 1 else 1
    if not production_layout(opts):
        return StageLayout(pipeline_stages(layers, pp, opts.stage_layers))
    if opts.pipeline_layout:
        rows = _layout_string_chunks(opts.pipeline_layout, layers, mtp_layers, pp, chunks)
    else:
        rows = _megatron_split_chunks(opts, layers, mtp_layers, pp, chunks)
    stages = tuple(sum(row) for row in rows)
    even = all(len(set(row)) == 1 for row in rows)
    return StageLayout(stages, () if even else rows)


def _layout_string_chunks(text: str, layers: int, mtp_layers: int, pp: int, chunks: int):
    """Each rank's chunks' layers under a --pipeline-layout string, checked as Megatron-Core's
    validate_layer_layout does (pipeline_parallel_layer_layout.py): the embedding opens the first stage,
    the loss closes the last, every decoder and MTP layer once, the MTP layers after the decoder's."""
    stages = parse_pipeline_layout(text)
    field = f"--pipeline-layout {text!r}"
    if len(stages) != pp * chunks:
        fix = (
            f"use --virtual-stages {len(stages) // pp}"
            if len(stages) % pp == 0 and len(stages) > pp
            else f"give pp × virtual stages = {pp} × {chunks} = {pp * chunks} stages, | between them"
        )
        raise MeshplanError(
            f"{field} has {len(stages)} stages but pp × virtual stages = {pp} × {chunks} = {pp * chunks}; {fix}"
        )
    flat = "".join(stages)
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        raise MeshplanError(f"{field}: the embedding E must open the first stage, once; e.g. Et*3|…")
    if flat.count("L") != 1 or not stages[-1].endswith("L"):
        raise MeshplanError(f"{field}: the loss L must close the last stage, once; e.g. …|t*3L")
    decoder = layers - mtp_layers
    if flat.count("t") != decoder or flat.count("m") != mtp_layers:
        raise MeshplanError(
            f"{field} places {flat.count('t')} decoder layers (t) and {flat.count('m')} MTP layers (m) but the "
            f"model has {decoder} and {mtp_layers}; give every layer exactly once"
        )
    if "m" in flat and "t" in flat[flat.index("m") :]:
        raise MeshplanError(f"{field}: the MTP layers (m) come after every decoder layer (t), as Megatron-Core asks")
    counts = [s.count("t") + s.count("m") for s in stages]
    return tuple(tuple(counts[c * pp + r] for c in range(chunks)) for r in range(pp))


def _megatron_split_chunks(opts, layers: int, mtp_layers: int, pp: int, chunks: int):
    """Each rank's chunks' layers as Megatron-Core's get_num_layers_to_build (transformer_block.py) splits
    them. --first-stage-layers / --last-stage-layers: those ranks hold that many, the rest split evenly
    over the others; --account-for-embedding / --account-for-loss: the embedding (loss) counts as a
    layer, the layers plus those split evenly over the ranks, then the first (last) chunk builds one
    fewer. A rank's layers split evenly over its chunks; the MTP layers on the last chunk of the last rank
    (multi_token_prediction.py: mtp_on_this_rank, without a layout)."""
    first, last = opts.first_stage_layers, opts.last_stage_layers
    decoder = layers - mtp_layers
    if first or last:
        if pp < 2:
            raise MeshplanError("--first-stage-layers / --last-stage-layers need pp > 1")
        rest, left = decoder - first - last, pp - (first > 0) - (last > 0)
        if rest < 0 or (left and rest % left) or (not left and rest):
            raise MeshplanError(
                f"--first-stage-layers {first} / --last-stage-layers {last} leave {rest} of the {decoder} decoder "
                f"layers for {left} other stage(s); the rest must split evenly (Megatron-Core asserts it)"
            )
        per_rank = [rest // left if left else 0] * pp
        per_rank[0] = first or per_rank[0]
        per_rank[-1] = last or per_rank[-1]
    else:
        total = decoder + opts.account_for_embedding + opts.account_for_loss
        if total % pp:
            raise MeshplanError(
                f"--account-for-embedding/--account-for-loss: {decoder} layers + {total - decoder} = {total} do "
                f"not split evenly over pp={pp}; pick a pp that divides {total}, or --first-stage-layers"
            )
        per_rank = [total // pp] * pp
    bad = [n for n in per_rank if n % chunks]
    if bad:
        raise MeshplanError(
            f"--virtual-stages {chunks} does not divide a stage's {bad[0]} layers (stages {per_rank}); pick a "
            "divisor of every stage's count, or give each chunk's layers with --pipeline-layout"
        )
    rows = [[n // chunks] * chunks for n in per_rank]
    rows[0][0] -= opts.account_for_embedding
    rows[-1][-1] -= opts.account_for_loss
    if rows[0][0] < 0 or rows[-1][-1] < 0:
        raise MeshplanError(
            "--account-for-embedding/--account-for-loss: a first or last chunk of no layers cannot also hold "
            "the embedding or loss; use fewer virtual stages"
        )
    rows[-1][-1] += mtp_layers
    return tuple(tuple(row) for row in rows)


def chunk_block_counts(model, chunk_layers: tuple[tuple[int, ...], ...]) -> tuple[tuple[dict[str, int], ...], ...]:
    """Invocations of each block kind in each rank's chunks: virtual stage k = c·p + r holds the layers
    after those of stages 0 … k − 1 (Megatron-Core's get_layer_offset)."""
    pp, chunks = len(chunk_layers), len(chunk_layers[0])
    flat = model.stage_block_counts(tuple(chunk_layers[k % pp][k // pp] for k in range(pp * chunks)))
    return tuple(tuple(flat[c * pp + r] for c in range(chunks)) for r in range(pp))


def rank_block_counts(model, layout: StageLayout) -> tuple[dict[str, int], ...]:
    """Invocations of each block kind on each rank: its chunks' where they differ, else its contiguous
    layers (ModelSpec.stage_block_counts)."""
    if not layout.uneven_chunks:
        return model.stage_block_counts(layout.stage_layers)
    out = []
    for row in chunk_block_counts(model, layout.chunk_layers):
        counts: dict[str, int] = {}
        for chunk in row:
            for kind, n in chunk.items():
                counts[kind] = counts.get(kind, 0) + n
        out.append(counts)
    return tuple(out)


def in_flight_chunks(stage: int, pp: int, microbatches: int, chunks: int) -> int:
    """Model chunks (of 1/`chunks` of the stage's layers) whose activations stage `stage` holds at its
    peak: 1F1B keeps min(m, p − r) micro-batches; interleaved, Megatron's warm-up (p − r − 1)·2 +
    (v − 1)·p chunks plus the one in hand, at most all m·v."""
    if chunks == 1:
        return min(microbatches, pp - stage)
    return min(microbatches * chunks, (pp - stage - 1) * 2 + (chunks - 1) * pp + 1)


def in_flight_peak(stage: int, pp: int, microbatches: int, chunk_weights: tuple[float, ...]) -> float:
    """The most of its chunks' activations stage `stage` holds at once where its chunks differ: walking
    its units in the schedule's order (pipeline_sim.rank_order), each forward keeps `chunk_weights[c]`
    until its backward. Equal weights w give in_flight_chunks × w."""
    held = peak = 0.0
    for kind, _, c in rank_order(stage, pp, microbatches, len(chunk_weights)):
        held += chunk_weights[c] if kind == "F" else -chunk_weights[c]
        peak = max(peak, held)
    return peak


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
    *,
    chunk_fwd_s: tuple[tuple[float, ...], ...] = (),
    chunk_bwd_s: tuple[tuple[float, ...], ...] = (),
) -> PipelinePasses:
    """The passes of `microbatches` micro-batches through stages whose layers take `fwd_s[r]` and
    `bwd_s[r]` a micro-batch (in `chunks` equal model chunks a rank under the interleaved schedule),
    the last stage's last chunk adding the output head and loss (`head_fwd_s`, `head_bwd_s`).

    Closed form where it is exact (closed_form_holds): the last stage, slowest, sets the steady
    state, m of its micro-batches; the others fill and drain around it in chunks of 1/v of a stage —
    for stages of t and a head of h, m·(t + h) + (p − 1)·t/v, the bubble (p − 1)/(v·m + p − 1) of the
    passes without a head (Narayanan et al. 2021 §2.2). Elsewhere the schedule is simulated
    (meshplan.costmodel.pipeline_sim, Megatron-Core's order). `chunk_fwd_s[r][c]`, `chunk_bwd_s[r][c]`:
    each chunk's share of `fwd_s[r]`, `bwd_s[r]` where a rank's chunks differ (StageLayout.chunk_layers):
    simulated as given."""
    pp, m = len(fwd_s), microbatches
    stage_s = [f + b for f, b in zip(fwd_s, bwd_s)]
    stage_s[-1] += head_fwd_s + head_bwd_s
    critical = max(range(pp), key=lambda r: (stage_s[r], r))
    busy = m * stage_s[critical]
    if chunk_fwd_s:
        fwd, bwd = [list(row) for row in chunk_fwd_s], [list(row) for row in chunk_bwd_s]
        fwd[-1][-1] += head_fwd_s
        bwd[-1][-1] += head_bwd_s
        return PipelinePasses(simulate(fwd, bwd, m, chunks=chunks).total_s, busy, critical, True)
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
    layers: int,
    pp: int,
    dp: int,
    micro_batch: int,
    global_batch: int,
    chunks: int,
    stage_layers: tuple[int, ...] = (),
    *,
    opts=None,
    mtp_layers: int = 0,
) -> tuple[int, ...]:
    """The stages' layer counts, after checking what production schedules need: a global batch that
    DP × MBS divides, virtual stages that divide every stage's layers — or, under a production layout of
    the options (`opts`: --pipeline-layout, --first/--last-stage-layers, --account-for-*), a layout
    Megatron-Core would build (stage_layout). One clear error otherwise."""
    if micro_batch < 1:
        raise MeshplanError(f"--micro-batch must be >= 1, got {micro_batch}")
    if global_batch and global_batch % (dp * micro_batch):
        raise MeshplanError(
            f"--global-batch {global_batch} is not divisible by dp × micro-batch = {dp} × {micro_batch}"
            f" = {dp * micro_batch}; use a multiple of {dp * micro_batch}"
        )
    if chunks > 1 and pp == 1:
        raise MeshplanError("--schedule interleaved needs pp > 1")
    if opts is not None and production_layout(opts):
        return stage_layout(layers, pp, opts, mtp_layers).stage_layers
    stages = pipeline_stages(layers, pp, stage_layers)
    if chunks > 1:
        bad = [n for n in stages if n % chunks]
        if bad:
            raise MeshplanError(
                f"--virtual-stages {chunks} does not divide a stage's {bad[0]} layers "
                f"(stages {list(stages)}); pick a divisor of every stage's layer count, or chunks of unequal "
                "size: --account-for-embedding/--account-for-loss, --first/--last-stage-layers or --pipeline-layout"
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

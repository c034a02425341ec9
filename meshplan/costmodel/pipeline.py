"""Pipeline parallelism as production stacks run it: uneven stages, the 1F1B and interleaved 1F1B
schedules, the micro-batches a fixed global batch gives, the bubble, and what each stage keeps in flight.

Sources: Narayanan et al. 2021 §2.2 (1F1B: bubble (p − 1)/m of the ideal time; interleaved with v model
chunks a rank: (p − 1)/(v·m)); Korthikanti et al. 2022 §4.2.3 (the first stage holds p micro-batches of
its layers, L layers' worth; interleaved, (1 + (p − 1)/(p·v)) times that); Megatron-LM's interleaved
schedule (megatron/core/pipeline_parallel/schedules.py: rank r warms up (p − r − 1)·2 + (v − 1)·p chunks).
"""

from __future__ import annotations

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


def pipeline_time_s(stage_s: list[float], microbatches: int, chunks: int) -> tuple[float, float]:
    """(seconds of a step's forward and backward passes through the pipeline, the bubble's share of it).

    `stage_s`: each stage's time for one micro-batch's forward and backward. The slowest stage sets the
    steady state, m of its micro-batches; the others fill and drain around it, in chunks of 1/v of a
    stage under the interleaved schedule — for even stages (m + (p − 1)/v)·t, the bubble (p − 1)/(v·m)
    of the ideal (Narayanan et al. 2021 §2.2)."""
    slowest = max(stage_s)
    fill = (sum(stage_s) - slowest) / chunks
    total = microbatches * slowest + fill
    return total, (fill / total if total > 0 else 0.0)


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

"""Launch shapes of the SSD scan kernels that the cost model also needs (how many dB/dC partial sums
the backward writes), kept free of Triton so that the cost model can import them; and how the scan
and conv kernels take a tensor whose tokens lie apart in memory (token_rows)."""

from __future__ import annotations

import math

SSD_CHUNK = 64  # tokens per chunk of the scan the executor runs (meshplan.kernels.ssd, and the reference)

# Programs to aim for in the chunk kernels that loop over a group's heads: a few waves over an H200's
# 132 SMs.
SPLIT_TARGET = 1024
# d_state block of the backward's dB/dC kernel: with the backward's other settings, the fastest of 12
# on an H200 (benchmarks/results/ssd-bwd-tune-h200.json, `python benchmarks/bench_ssd.py --tune`).
BWD_STATE_BLOCK = 128


# Tile (headdim × d_state) of the state passings (meshplan/kernels/ssd.py _pass_chunks): of 54 settings on
# an H200, 64 × 64 (with 4 warps and 4 stages, ssd.PASS_WARPS, ssd.PASS_STAGES) was among the fastest at
# 16K × 80 heads (0.33 / 0.34 ms forward / backward, against 0.42-1.05 ms for tiles of 16 or 32 headdim
# rows) and the fastest at 4 × 4K (0.22 ms): benchmarks/results/ssd-pass-tune-h200.json, `python
# benchmarks/bench_ssd.py --tune-passing` (weights still formed in the loop then); d_state blocks of
# 16-128 again in ssd-pass-acc-ab-h200.json.
PASS_HEADDIM_BLOCK, PASS_STATE_BLOCK = 64, 64


def _pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def pass_tile(headdim: int, d_state: int) -> tuple[int, int]:
    """The state passings' (headdim, d_state) block for these sizes (at least 16, Triton's dot minimum)."""
    return min(PASS_HEADDIM_BLOCK, max(16, _pow2(headdim))), min(PASS_STATE_BLOCK, max(16, _pow2(d_state)))


def pass_programs(rows: float, heads: float, headdim: int, d_state: int) -> float:
    """Programs of one state passing: one per row, head and state tile (each takes its row's chunks in turn)."""
    bp, bn = pass_tile(headdim, d_state)
    return rows * heads * -(-headdim // bp) * -(-d_state // bn)


# Programs the state passings aim for. A program takes its chunks in turn, so a long row with few heads
# leaves SMs idle: at 16K × 80 heads (160 programs) the passing ran at 51% of the copy roofline where
# 4 × 4K (640 programs) ran at 74% (benchmarks/results/ssd-h200.json). Where a whole row's passing would
# run fewer than PASS_SEGMENT_BELOW programs, each row's chunks are cut into segments that pass at once
# from a zero state (enough for PASS_PROGRAM_TARGET programs, each segment at least PASS_MIN_SEGMENT_CHUNKS
# chunks), and the chunk kernels add each segment's true entering state, carried across the segments by a
# short pass of its own (meshplan/kernels/ssd.py pass_states). The backward's two passings are cut only
# below PASS_SEGMENT_BACKWARD_BELOW programs: there the dx and dB/dC kernels add each segment's entering
# state to the states they read, which costs them registers (the dx kernel, at 255 a thread, from 128 to
# 232 bytes of spills on sm_90: benchmarks/results/sass-counts.json).
# Timed on an H100 (`python benchmarks/bench_ssd.py --segments`, benchmarks/results/ssd-segments-h100.json,
# the kernels' profiled sums, forward + backward, against whole rows): 16K × 12 heads (24 programs) 0.772
# → 0.602 ms with both directions cut (target 256: 11 segments), 0.681 with the forward alone; 16K × 24
# heads (48) 1.006 → 0.974 with the forward alone, 1.102 with both; 8K × 24 heads 0.538 → 0.527 (sums of the
# named kernels, torch's other kernels apart). Every shape of 40 or 80 heads that a variant cut ran slower
# (+2-7% with the forward alone, +29-55% with both; 4 × 4K and 2 × 8K × 80 heads have enough programs to stay
# whole at target 256). Targets of 512-2048 were no better than 256.
PASS_PROGRAM_TARGET = 256
PASS_SEGMENT_BELOW = 64
PASS_SEGMENT_BACKWARD_BELOW = 32
PASS_MIN_SEGMENT_CHUNKS = 8


def pass_segments(
    rows: int, heads: int, headdim: int, d_state: int, chunks: int, backward: bool = False
) -> tuple[int, int]:
    """(segments, chunks a segment) of each row in a state passing — the forward's, or with `backward` the
    backward's two: (1, chunks) where the rows, heads and tiles give PASS_SEGMENT_BELOW programs or more
    (PASS_SEGMENT_BACKWARD_BELOW), else the fewest segments that give PASS_PROGRAM_TARGET programs, each of
    whole chunks (the last may be shorter)."""
    programs = pass_programs(rows, heads, headdim, d_state)
    if programs >= (PASS_SEGMENT_BACKWARD_BELOW if backward else PASS_SEGMENT_BELOW):
        return 1, chunks
    want = min(-(-PASS_PROGRAM_TARGET // max(int(programs), 1)), max(chunks // max(PASS_MIN_SEGMENT_CHUNKS, 1), 1))
    per = -(-chunks // max(want, 1))
    return -(-chunks // per), per


def head_splits(heads_per_group: int, programs: int, target: int | None = None) -> int:
    """How many programs share one group's heads: the fewest that give `target` programs in all
    (enough to fill the GPU), each split a whole number of heads (all of them when none does)."""
    target = SPLIT_TARGET if target is None else target
    best = 1
    for s in range(1, heads_per_group + 1):
        if heads_per_group % s == 0:
            best = s
            if programs * s >= target:
                break
    return best


def state_blocks(d_state: int) -> tuple[int, int]:
    """(block, blocks): the backward dB/dC kernel's d_state block and how many cover d_state."""
    padded = max(16, _pow2(d_state))
    block = min(padded, BWD_STATE_BLOCK)
    return block, -(-d_state // block)


def bwd_splits(chunks: int, heads: int, groups: int, d_state: int, target: int | None = None) -> int:
    """Head splits of the backward's dB/dC kernel over `chunks` chunks (batch included): the number of
    fp32 dB and dC partial sums it writes per token (the kernel launches with these; the memory and
    cost models count with them)."""
    return head_splits(heads // groups, chunks * groups * state_blocks(d_state)[1], target)


# The int8 all-reduce over peer-mapped memory (meshplan/executor/peer.py): each slot of its double
# buffer holds PEER_HEADER bytes of signal words (one int32 per rank, up to 8), then one packed int8 row
# — 1 byte an element and a 4-byte fp32 scale per 128 — and is rounded up to PEER_SLOT_ALIGN (the
# buffer grows only when a larger tensor arrives). The memory model counts both slots.
PEER_HEADER = 128
PEER_SLOT_ALIGN = 2 * 2**20


def peer_slot_bytes(elements: float, group: int = 128) -> int:
    """Bytes of one slot for an all-reduce of `elements` values (a multiple of `group`)."""
    need = PEER_HEADER + int(elements) + 4 * (int(elements) // group)
    return -(-need // PEER_SLOT_ALIGN) * PEER_SLOT_ALIGN


def token_rows(t):
    """(t, its token stride) when t (batch, tokens, …) keeps each token's trailing block contiguous and
    its tokens evenly spaced — as column slices of a wider tensor are: the scan's x, B and C of the conv
    output, the conv's xBC of the in_proj output — so that a kernel reads it where it lies; else a
    contiguous copy and its stride."""
    b, s, *inner = t.shape
    # The token's block is contiguous: each of its dimensions (but those of size 1) spans the ones after it.
    block = all(stride == math.prod(inner[i + 1 :]) for i, stride in enumerate(t.stride()[2:]) if inner[i] != 1)
    if block and (b == 1 or t.stride(0) == s * t.stride(1)):
        return t, t.stride(1)
    t = t.contiguous()
    return t, t.stride(1)

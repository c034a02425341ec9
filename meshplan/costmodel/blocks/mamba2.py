"""Mamba-2 blocks (Dao & Gu 2024) as meshplan's executor runs them: in_proj, the causal conv1d and the
chunked SSD scan as Triton kernels (meshplan/kernels), the gated RMSNorm, out_proj; the mixer core
recomputed in backward; on a sequence shard, a zero-start scan corrected for the entering state. Its
kernels are priced by their bytes at measured fractions of HBM and its state passings by their issue
(below); its transients phase by phase (forward_transient_bytes, backward_transient_bytes).
"""

from __future__ import annotations

import math
from dataclasses import replace

from meshplan.costmodel.activations import Saved
from meshplan.costmodel.blocks.base import BlockKind
from meshplan.costmodel.blocks.ssm import boundary, decode_state_io, mixer_inputs_saved
from meshplan.costmodel.device import Device, linear_gemm_time_s
from meshplan.costmodel.options import MemoryOptions
from meshplan.costmodel.shapes import local_bc_channels
from meshplan.kernels import launch  # its settings read at call time: benchmarks and tests set them
from meshplan.kernels.launch import SSD_CHUNK, bwd_splits, pass_programs, pass_segments
from meshplan.models import ModelSpec

# Mamba-2's own kernels (meshplan/kernels), as achieved fractions of the device's HBM rate (the
# datasheet's for presets), measured on an H200 against bytes counted as in their benchmarks, over the
# kernels' own profiled times (the host's launches are the step's launch floor, below). The chunked SSD
# scan, against `ssd_kernel_bytes`: its chunk kernels at 16K tokens × 80 heads of 64, d_state 128 — the
# forward's output kernel, and the backward's dx and dB/dC kernels together. Its state passings are bound
# by their programs' issue, not by HBM (ncu: benchmarks/results/ncu-state-passing-h200.txt): a program (a
# row, head and state tile) takes its row's chunks in turn, so a passing takes steps · max(latency,
# ⌈programs / SMs⌉ · issue); the latency from 16K × 40 heads (one program an SM), the issue time from
# 16K × 80 (two); 4 × 4K × 80 (five) comes out 10% under (benchmarks/results/kernels-h200.json
# "scan_cost_model_constants", computed by benchmarks/make_kernels_summary.py from ssd-h200.json,
# `python benchmarks/bench_ssd.py`; the same passings ran 0.24 ms on this H200 against 0.28 on the one
# before, whose fit was 0.677 / 0.550 µs and within 1.3% of 4 × 4K). Other GPUs get the H200's step
# times and SM count. The causal
# conv1d at 4 × 16K × 5376 channels with its time-marching kernels, against x read and the output
# written (forward), x and dy read and dx written (backward): forward 3.64e12 B/s (0.388 ms), backward
# 3.39e12 B/s (0.623 ms) (benchmarks/results/conv1d-kernels-h200-r1.json, `python
# benchmarks/bench_conv1d.py`, its main row; -r2, the run after it: 0.388 and 0.624 ms). A conv call timed
# alone takes 0.43-0.45 and 0.72-0.73 ms: the host's launch before the kernel, and in the backward 0.03
# ms of torch's dw, db partial sums.
SCAN_FWD_HBM_FRACTION = 0.670


SCAN_BWD_HBM_FRACTION = 0.458


# The chunk kernels reading the states of a passing cut into segments (meshplan.kernels.launch.pass_segments)
# add each segment's entering state, decayed, to every tile they read: more instructions and registers, not
# more HBM bytes (a few segments' states stay in L2). Their profiled time against whole rows, the same shapes
# on an H100 (benchmarks/results/ssd-segments-h100.json, target 256, the median of two rounds): the forward's
# output kernel 1.62, 1.59, 1.55, 1.47 and 1.45x at 8K × 24 and 16K × 12, 24, 40 and 80 heads (falling as the
# programs rise), 1.59 the median of the shapes the thresholds cut (48 programs or fewer); the backward's dx and
# dB/dC kernels together 1.68-1.75x (median 1.71; 1.70 at 16K × 12 heads, the one shape cut there).
SEGMENTED_SCAN_FACTOR = 1.59
SEGMENTED_BWD_CHUNKS_FACTOR = 1.71


SCAN_PASS_STEP_LATENCY_S = 0.638e-6


SCAN_PASS_STEP_ISSUE_S = 0.478e-6


SCAN_PASS_SMS = 132  # an H200's multiprocessors (torch.cuda.get_device_properties on the lent H200s)


CONV_FWD_HBM_FRACTION = 0.758


CONV_BWD_HBM_FRACTION = 0.706


# A sequence shard's correction for its entering state (meshplan/kernels/shard_state.py), against
# `sp_correction_bytes`, on an H200 at a shard of 256K tokens × 80 heads of 64, d_state 128: forward
# 2.05 ms, backward's dC/dcum kernel 1.97 ms and dE kernel 1.29 ms (at 64K tokens: 0.549 / 0.315 / 0.443 of
# the rated rate, against 0.561 / 0.316 / 0.458) (benchmarks/results/shard-state-h200.json, `python
# benchmarks/bench_shard_state.py`; fitted by benchmarks/make_kernels_summary.py into kernels-h200.json).
SP_CORRECTION_FWD_HBM_FRACTION = 0.561


SP_CORRECTION_DC_HBM_FRACTION = 0.316


SP_CORRECTION_DE_HBM_FRACTION = 0.458


def sp_correction_bytes(
    tokens: float, heads: float, headdim: int, groups: float, d_state: int, e: int
) -> dict[str, float]:
    """HBM bytes of each kernel of a Mamba-2 sequence shard's correction for the state E entering it
    (meshplan/kernels/shard_state.py) over `tokens` tokens: forward, y0 read and y written; backward, dy
    read twice (once for dC and dcum, once for dE) — each with C (d_state a group and token, written
    again as dC) and the fp32 cum (dcum written). E and the dE partial sums are a few MB.
    benchmarks/bench_shard_state.py divides each by its kernel's measured time."""
    x, c, cum = tokens * heads * headdim * e, tokens * groups * d_state * e, 4 * tokens * heads
    return {"entering_fwd": 2 * x + c + cum, "entering_bwd_dc": x + 2 * c + 2 * cum, "entering_bwd_de": x + c + cum}


def sp_correction_s(model: ModelSpec, tokens: float, head_div: int, e: int, dev: Device) -> tuple[float, float]:
    """Seconds, forward and backward, of a Mamba-2 sequence shard's correction for the state E entering
    it (meshplan/executor/layouts/mamba.py, _finish_shard; Triton kernels, meshplan/kernels/shard_state.py)
    over `tokens` tokens: each kernel's bytes (sp_correction_bytes) at its measured HBM fraction."""

    m = model.mamba2
    groups = local_bc_channels(m, head_div) / 2 / m.d_state  # the B/C groups this rank's heads use
    b = sp_correction_bytes(tokens, m.nheads / head_div, m.headdim, groups, m.d_state, e)
    hbm = dev.rated_hbm
    return (
        b["entering_fwd"] / (hbm * SP_CORRECTION_FWD_HBM_FRACTION),
        b["entering_bwd_dc"] / (hbm * SP_CORRECTION_DC_HBM_FRACTION)
        + b["entering_bwd_de"] / (hbm * SP_CORRECTION_DE_HBM_FRACTION),
    )


def ssd_kernel_bytes(
    tokens: float, heads: float, headdim: int, groups: float, d_state: int, e: int, chunk: int = 64
) -> dict[str, dict[str, float]]:
    """HBM bytes of each SSD scan kernel (meshplan/kernels/ssd.py, ssd_bwd.py) over `tokens` tokens of
    `heads` heads whose B and C come in `groups` groups, `e` bytes per input element: the token inputs and
    outputs once (B and C, shared by a group's heads, stay in L2), and each per-chunk state buffer at its
    stored width — the entering states and dS in the inputs' dtype (the state passings form each
    chunk's own state, or dE, in registers and store only what they pass on) — plus the backward's C·B
    gradient (chunk² per head and chunk, inputs' dtype) and fp32 dB/dC partial sums.
    Forward: the passing's weights, the state passing, the outputs. Backward: the weights of both
    passings, the passing (recomputed), the backward passing, the dx and dB/dC kernels.
    benchmarks/bench_ssd.py divides each by its kernel's measured time."""

    chunks = math.ceil(tokens / chunk)
    tokens = chunks * chunk  # padded to whole chunks
    x, bc, dt = tokens * heads * headdim * e, tokens * groups * d_state * e, 4 * tokens * heads
    state = chunks * heads * headdim * d_state  # elements of one per-chunk state buffer
    dcb = e * chunks * heads * chunk * chunk
    partials = 2 * 4 * tokens * groups * d_state * bwd_splits(chunks, int(heads), int(groups), d_state)
    passing = x + dt + bc + e * state  # x (or dy), its weights, B (or C) in; the entering states (or dS) out
    weights = 2 * dt  # dt in, one passing's weights out (fp32, like dt; the decays are a chunk's)
    return {
        "forward": {
            "chunk_weights_kernel": weights,
            "state_passing": passing,
            "chunk_scan": 2 * x + dt + 2 * bc + e * state,
        },
        "backward": {
            "chunk_weights_kernel": 2 * weights,
            "state_passing": passing,
            "state_passing_bwd": passing,
            "chunk_bwd_dx": 3 * x + 2 * dt + 2 * bc + 2 * e * state + dcb,
            "chunk_bwd_dbc": 2 * x + dt + 2 * bc + 2 * e * state + dcb + partials,
        },
    }


def mamba2_kernel_bytes(model: ModelSpec, tokens: float, head_div: int, e: int) -> dict[str, float]:
    """HBM bytes of the Mamba-2 kernels on one rank, counted as their benchmarks count them: the scan's
    kernels by `ssd_kernel_bytes` (benchmarks/bench_ssd.py) — one state passing with its weights kernel
    (the forward's, its recompute in the backward, and the backward's each move as much), the forward's
    output kernel and
    the backward's two chunk kernels; the conv reads x and writes its output forward, reads x and dy and
    writes dx backward (benchmarks/bench_conv1d.py)."""

    m = model.mamba2
    h = m.nheads / head_div
    gn = local_bc_channels(m, head_div) / 2  # B (or C) channels this rank uses
    scan = ssd_kernel_bytes(tokens, h, m.headdim, gn / m.d_state, m.d_state, e, SSD_CHUNK)
    conv = tokens * (h * m.headdim + 2 * gn) * e
    bwd = scan["backward"]
    fwd = scan["forward"]
    return {
        "scan_pass": fwd["chunk_weights_kernel"] + fwd["state_passing"],
        "scan_fwd_chunks": fwd["chunk_scan"],
        "scan_bwd_chunks": bwd["chunk_bwd_dx"] + bwd["chunk_bwd_dbc"],
        "conv_fwd": 2 * conv,
        "conv_bwd": 3 * conv,
    }


def scan_pass_s(
    rows: float, row_tokens: float, heads: float, headdim: int, d_state: int, backward: bool = False
) -> float:
    """Seconds of one SSD state passing (meshplan/kernels/ssd.py, with the kernel forming its weights)
    over `rows` sequence rows of `row_tokens` tokens and `heads` heads: each program takes its row's
    chunks (or its segment's, meshplan.kernels.launch.pass_segments: the forward's, or with `backward`
    one of the backward's two) in turn, and the SM's programs share its issue slots (see
    SCAN_PASS_STEP_ISSUE_S)."""

    chunks = math.ceil(row_tokens / SSD_CHUNK)
    segments, steps = pass_segments(math.ceil(rows), heads, headdim, d_state, chunks, backward)
    per_sm = math.ceil(segments * pass_programs(math.ceil(rows), heads, headdim, d_state) / SCAN_PASS_SMS)
    # A segmented passing's join takes one step a segment (as a passing's step; profiled at 3-12 µs a join,
    # ssd-segments-h100.json, against 1.3-7 µs priced: a few µs a layer).
    join = segments * SCAN_PASS_STEP_LATENCY_S if segments > 1 else 0.0
    return steps * max(SCAN_PASS_STEP_LATENCY_S, per_sm * SCAN_PASS_STEP_ISSUE_S) + join


def mamba2_kernel_s(
    model: ModelSpec, tokens: float, head_div: int, e: int, dev: Device, row_tokens: float | None = None
) -> tuple[float, float]:
    """(forward, backward) seconds of the scan and conv kernels: the chunk kernels and the conv at their
    measured HBM fractions, each state passing by `scan_pass_s` (`row_tokens` tokens a sequence row on
    this rank; `tokens` when not given). The backward runs the passing twice (the forward's again, and
    its own), cut into segments by their own threshold (meshplan.kernels.launch.pass_segments)."""
    if tokens <= 1:  # decode: the state update, costed by the step's decode state I/O
        return 0.0, 0.0
    m = model.mamba2
    row_tokens = row_tokens or tokens
    b = mamba2_kernel_bytes(model, tokens, head_div, e)
    hbm = dev.rated_hbm

    shape = (tokens / row_tokens, row_tokens, m.nheads / head_div, m.headdim, m.d_state)
    passing, bwd_passing = scan_pass_s(*shape), scan_pass_s(*shape, backward=True)
    rows, chunks = math.ceil(shape[0]), math.ceil(row_tokens / SSD_CHUNK)
    heads = shape[2]
    fwd_cut = pass_segments(rows, heads, m.headdim, m.d_state, chunks)[0] > 1
    bwd_cut = pass_segments(rows, heads, m.headdim, m.d_state, chunks, backward=True)[0] > 1
    return (
        passing
        + b["scan_fwd_chunks"] / (hbm * SCAN_FWD_HBM_FRACTION) * (SEGMENTED_SCAN_FACTOR if fwd_cut else 1.0)
        + b["conv_fwd"] / (hbm * CONV_FWD_HBM_FRACTION),
        2 * bwd_passing
        + b["scan_bwd_chunks"] / (hbm * SCAN_BWD_HBM_FRACTION) * (SEGMENTED_BWD_CHUNKS_FACTOR if bwd_cut else 1.0)
        + b["conv_bwd"] / (hbm * CONV_BWD_HBM_FRACTION),
    )


def scan_state_bytes(m, local_tokens: float, head_div: int, nbytes: int) -> float:
    """One buffer of per-chunk SSM states (b, chunks, heads, headdim, d_state) on one rank holding
    `local_tokens` tokens and 1/head_div of the heads, `nbytes` per element (meshplan/kernels/ssd.py:
    the entering states and their gradient dS, in the activations' dtype)."""
    return math.ceil(local_tokens / SSD_CHUNK) * m.nheads / head_div * m.headdim * m.d_state * nbytes


def _scan_state_bytes(model: ModelSpec, tokens: float, sh, nbytes: int) -> float:
    return scan_state_bytes(model.mamba2, tokens / sh.token_div, sh.head_div, nbytes)


def scan_join_bytes(m, rows: int, local_tokens: float, head_div: int, nbytes: int, backward: bool = False) -> float:
    """What a state passing in segments (meshplan/kernels/ssd.py pass_states, launch.pass_segments: the
    forward's, or with `backward` one of the backward's) leaves beside its states for the chunk kernels,
    on one rank holding `rows` sequence rows of `local_tokens` tokens in all: each segment's entering
    state in the activations' dtype and each chunk's decay from its segment's start (fp32). 0 for rows
    passed whole."""
    rows = max(int(rows), 1)
    chunks = math.ceil(local_tokens / rows / SSD_CHUNK)
    heads = m.nheads / head_div
    segments, _ = launch.pass_segments(rows, heads, m.headdim, m.d_state, chunks, backward)
    if segments == 1:
        return 0.0
    return rows * heads * (segments * m.headdim * m.d_state * nbytes + chunks * 4)


def mixer_forward_bytes(model: ModelSpec, tokens: float, sh, e: int, decode: bool = False, rows: int = 1) -> float:
    """Forward without grad (prefill), Mamba-2: the mixer's transients on top of the in_proj output,
    as the larger of three phases (meshplan/executor/blocks.py mamba2_mixer). Scan: the conv output
    (d_inner + B/C columns; the scan reads x, B, C from it in place), dt (fp32), the states entering
    each chunk (in the activations' dtype: meshplan/kernels/ssd.py; the passing keeps each chunk's own
    state in registers; passed in segments, with scan_join_bytes) and the scan output beside them.
    Gated norm (Triton, meshplan/kernels/gated_norm.py, which reads z where it lies in the in_proj
    output): conv output, dt, scan output and the norm's output; under SP also the shard's zero-start
    scan output. Decode (`tokens` = the batch): no chunked scan; the state update's
    torch ops hold three state-sized fp32 temporaries (decayed state, the dt·x ⊗ B update, the new
    state) next to the cached one (meshplan/executor/layouts/mamba.py decode)."""
    m = model.mamba2
    if decode:
        return 3 * tokens * m.nheads / sh.head_div * m.headdim * m.d_state * 4
    t = tokens / sh.token_div
    di, nh = m.d_inner / sh.head_div, m.nheads / sh.head_div
    bc = local_bc_channels(m, sh.head_div)
    scan_in = t * ((di + bc) * e + nh * 4)  # conv output (x, B, C) and dt
    y = t * di * e  # the scan's output
    norm = scan_in + 2 * y  # the scan's output and the norm's (which reads z where it lies)
    if sh.token_div > 1:
        # A sequence shard's zero-start output lives through the norm too (_finish_shard; the Triton
        # correction, meshplan/kernels/shard_state.py, writes the corrected output and nothing else of
        # its width). With C·E as a torch tensor beside it: benchmarks/results/memory-peak-mamba2-prefill-sp2-h200.json
        # (0.95 GiB at sp=2, 16K, when the norm still copied z: five such tensors).
        norm += y
    states = _scan_state_bytes(model, tokens, sh, e) + scan_join_bytes(m, rows, t, sh.head_div, e)
    return max(scan_in + y + states, norm)


def mixer_backward_bytes(model: ModelSpec, tokens: float, sh, e: int, rows: int = 1) -> float:
    """Training, Mamba-2: the peak inside one block's backward, where Mamba2CoreFn recomputes the core
    with grad and differentiates it (meshplan/executor/blocks.py), as the largest of three phases.

    Gated-norm phase (backward starts): what the recomputed graph saved — conv output (d_inner + B/C
    columns), dt (fp32), the scan output and out_proj's input (d_inner each; the Triton gated norm
    keeps nothing wider, meshplan/kernels/gated_norm.py) — out_proj's input gradient, and the norm's
    dy and dz.
    Its in_proj output's gradient comes last, assembled after the conv's backward; until then only its
    z part, the norm's dz, waits (in the scan and conv phases): at 128K tokens on one GPU the full-width
    gradient the model once added here over-predicted the peak by 5%
    (benchmarks/results/memory-peak-mamba2-train-128k-h200.json).
    Scan phase (meshplan/kernels/ssd_bwd.py): conv output, dt, the scan's output gradient dy and dz, the
    recomputed entering states and dS in the activations' dtype (with, passed in segments, what each
    passing leaves beside them: scan_join_bytes), and what the chunk kernels write: the
    C·B gradient (chunk² per head and chunk in the activations' dtype), dx, ddt, and fp32 dB/dC partial
    sums, one pair per head split (meshplan.kernels.launch.bwd_splits). Conv
    phase (meshplan/kernels/conv1d.py, two-pass backward): the conv output's gradient, the fp32
    pre-activation gradient, and dx."""
    m = model.mamba2
    t = tokens / sh.token_div
    di, nh = m.d_inner / sh.head_div, m.nheads / sh.head_div
    bc = local_bc_channels(m, sh.head_div)
    common = t * ((di + bc) * e + nh * 4)
    norm_phase = common + t * di * 5 * e
    narrow = _scan_state_bytes(model, tokens, sh, e)
    narrow += scan_join_bytes(m, rows, t, sh.head_div, e, backward=True)
    chunks = math.ceil(t / SSD_CHUNK)
    dcb = chunks * nh * SSD_CHUNK**2 * e
    partials = bc * 4 * bwd_splits(chunks, int(nh), int(bc / 2 / m.d_state), m.d_state)  # fp32 dB and dC per split
    dz = t * di * e
    scan_phase = common + t * di * e + dz + 2 * narrow + dcb + t * (di * e + nh * 4 + partials)
    conv_phase = common + dz + t * (di + bc) * (2 * e + 4)
    if sh.token_div > 1:
        # SP: the correction for the entering state (meshplan/executor/layouts/mamba.py, _finish_shard)
        # keeps the corrected output beside the zero-start scan's output; its Triton backward
        # (meshplan/kernels/shard_state.py) passes dy on as the zero-start output's gradient and writes
        # nothing else of the shard's width.
        norm_phase += t * di * e
    return max(norm_phase, scan_phase, conv_phase)


def mamba2_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    """Our Mamba-2 block: the mixer core (conv1d, scan, gated norm, out_proj) is one autograd function
    that saves only the in_proj output (z, x, B, C, dt) and recomputes the core in backward — one step
    further than mamba_ssm's `mamba_split_conv1d_scan_combined`, which also keeps the scan output."""
    m = model.mamba2
    e = opts.nbytes("act_dtype")
    return mixer_inputs_saved(m.d_model, e) + [
        Saved("zxdt", e * (2 * m.d_inner + m.nheads), "heads"),
        Saved("bc", e * 2 * m.ngroups * m.d_state, "groups"),
    ]


class Mamba2(BlockKind):
    name = "mamba2"
    recurrent = True
    triton_launches = True

    def params(self, model):
        return model.mamba2.param_count()

    def gemms(self, model, head_div):
        m = model.mamba2
        return [(m.in_proj_width / head_div, m.d_model), (m.d_model, m.d_inner / head_div)]

    def memory_bound_bytes_per_token(self, model, head_div, e):
        # Conv and scan are kernels of their own (mamba2_kernel_s); dt's softplus is fp32.
        m = model.mamba2
        gate_norm = 3 * m.d_inner / head_div
        return e * (5 * m.d_model + gate_norm) + (e + 4) * m.nheads / head_div

    def saved(self, model, opts):
        return mamba2_saved(model, opts)

    def eager_factor(self, dev, model=None, head_div=1):
        return dev.elementwise_factor_mamba2

    def kernels_s(self, model, tokens, sh, e, dev, row_tokens):
        fwd, bwd = mamba2_kernel_s(model, tokens, sh.head_div, e, dev, row_tokens)
        if sh.token_div > 1:
            # A sequence shard corrects its zero-start scan for the state entering it, in forward and in
            # the recomputed forward, and differentiates the correction (meshplan/executor/layouts/mamba.py).
            corr_fwd, corr_bwd = sp_correction_s(model, tokens, sh.head_div, e, dev)
            fwd, bwd = fwd + corr_fwd, bwd + corr_bwd
        return fwd, bwd

    def partial_recompute_s(self, model, recompute, sh, *, gemm, core, mem, kernel_fwd, tokens, e, dev):
        # The mixer core (conv, scan, gated norm, out_proj) is recomputed in backward.
        return mem + kernel_fwd + linear_gemm_time_s(tokens, *self.gemms(model, sh.head_div)[-1], e, dev)

    def decode(self, comp, model, batch, seq, sh, opts, dev):
        # under TSP each decode step gathers and rebuilds the whole weights as the forward does
        # (executor/layouts/tsp_mamba.py TSPMamba2.decode): comp's forward motion, which has no token term
        return replace(decode_state_io(comp, model.mamba2, batch, sh, opts, dev), motion_fwd_s=comp.motion_fwd_s)

    def boundary_bytes(self, model, batch, head_div, opts, shards=1):
        m = model.mamba2
        conv = m.d_inner / head_div + local_bc_channels(m, head_div)
        state = m.nheads * m.headdim * m.d_state / head_div
        return boundary(m, conv, state, m.nheads / head_div, batch, opts, shards)

    def forward_transient_bytes(self, model, tokens, sh, e, *, decode=False, rows=1):
        return mixer_forward_bytes(model, tokens, sh, e, decode=decode, rows=rows)

    def backward_transient_bytes(self, model, tokens, sh, e, rows=1):
        return mixer_backward_bytes(model, tokens, sh, e, rows)


MAMBA2 = Mamba2()

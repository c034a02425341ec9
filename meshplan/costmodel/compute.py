"""Compute time per block on one rank: GEMMs by roofline at an achieved rate, attention at the fused
kernel's rate, memory-bound work (norms, activations, residuals, conv, scan) from HBM bytes.

FLOPs per op (docs/design.md §4): a GEMM of (m × k)·(k × n) is 2·m·n·k; causal attention is
4·t·s·(a·d)/2 forward (QKᵀ and PV, half the keys masked); backward is 2× a GEMM's forward and
2.5× attention's (FlashAttention-2, Dao 2023: 5 matmuls against 2).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from meshplan.costmodel.layouts import Sharding
from meshplan.costmodel.shapes import local_bc_channels
from meshplan.kernels import launch  # its settings read at call time: benchmarks and tests set them
from meshplan.kernels.launch import SSD_CHUNK, bwd_splits, pass_programs, pass_segments
from meshplan.models import ModelSpec

# Achieved / peak of the bf16 GEMMs in a training step of the 7B-shaped layers (forward and backward
# shapes, cuBLAS nvjet kernels) on an H200: 0.73 at 32K tokens, 0.74 at 16K, 0.78 at 4K
# (benchmarks/results/profile-step-h200.json, `python benchmarks/profile_step.py`); a square 8192³
# GEMM reaches 0.80 (benchmarks/results/attention-h200.json). Replaced by `meshplan calibrate` profiles.
GEMM_EFFICIENCY = 0.74
# HBM traffic of the executor's eager elementwise work (SwiGLU, residual adds, layout copies; RMSNorm
# runs as Triton kernels) against the single pass per tensor the byte counts below assume: 3.1× at 32K
# and 3.4× at 16K tokens on an H200 (kernels other than GEMM, attention and the optimizer;
# benchmarks/results/profile-step-h200-triton-norm.json, `python benchmarks/profile_step.py`). With the
# torch RMSNorm and its fp32 upcasts it was 5.9× (profile-step-h200.json). A fused SwiGLU would lower it.
EAGER_ELEMENTWISE_FACTOR = 3.3
# Achieved / peak of torch SDPA forward + backward (bf16, 32 heads of 128) by key length, measured on
# an H200 with torch 2.11 (benchmarks/results/attention-h200.json, `python benchmarks/bench_attention.py`):
# the fused causal kernel (queries and keys aligned: one GPU, TP) and the lower-right causal bias over
# a key prefix that sequence shards use (SP, TSP), which torch runs on its memory-efficient kernel.
# Other GPUs get the same fractions of their own peak until `meshplan calibrate` measures them.
ATTENTION_EFFICIENCY_CAUSAL = ((4096, 0.39), (16384, 0.54), (32768, 0.56))
ATTENTION_EFFICIENCY_PREFIX = ((8192, 0.27), (16384, 0.31), (32768, 0.33))
ATTENTION_EFFICIENCY = 0.35  # decode and anything off the tables' shapes
ATTENTION_BWD_FACTOR = 2.5  # FlashAttention-2: backward runs 5 matmuls to forward's 2
# Unfused attention saves its scores and probabilities, so its backward recomputes nothing: the two batched
# GEMMs' input and weight-side gradients (4 matmuls to forward's 2) and the softmax and dropout gradients,
# which read and write about as many score bytes as their forward (Narayanan et al. 2021 §4.2's kernels).
UNFUSED_ATTENTION_BWD_FACTOR = 2.0
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
# Mamba-2's eager work (dt softplus and its fp32 casts, the SP window concatenation, dtype copies,
# partial-sum reductions; the gated RMSNorm runs as Triton kernels, meshplan/kernels/gated_norm.py)
# against the one pass per tensor counted below, over the four passes a training step makes
# (forward, the core's recompute, backward at twice forward): 2.89× at 16K and 2.64× at 32K tokens in a
# 2-layer mamba2-2.7b training step on an H200 (kernels other than GEMM, scan, conv and the optimizer;
# benchmarks/results/profile-step-mamba2-h200-norm-one-pass.json, `python benchmarks/profile_step.py
# --model mamba2-2.7b`: each measured time over the model's at 4.36, times 4.36), once the gated norm ran
# one pass a direction. Before that, with the conv reading xBC in place, 4.5× and 4.2×
# (profile-step-mamba2-h200-conv-in-place.json); before that, and before the executor's later launch
# cuts, 6.1× and 5.8× (profile-step-mamba2-h200-triton-norm.json); with the torch RMSNorm 6.7×, with the
# torch gated norm too 13.2×. (At 4K the step's small kernels set it: 4.8×.)
EAGER_ELEMENTWISE_FACTOR_MAMBA2 = 2.77
# Decode, measured on an H200 at batch 8 after a 16K prefill (2 layers, one GPU;
# benchmarks/results/decode-profile-h200.json, `torchrun --nproc-per-node 1 benchmarks/gpu_validation.py --modes decode
# --only single --profile 3 --steps 20`): torch's attention over the KV cache runs as two cuBLAS gemv
# kernels (q·Kᵀ, then ·V) reading 4.29 GB in 2.34 ms, 1.84e12 B/s — 0.38 of the datasheet HBM rate.
DECODE_ATTENTION_HBM_FRACTION = 0.38
# A decode step's kernels are tiny, and the GPU spends time on each beyond its bytes: idle between one
# dependent kernel and the next, and a small kernel's floor. In the same profile the step took 3.163 ms
# for 92 kernels: 2.340 ms in the attention gemvs (priced above), 0.283 ms in the other GEMMs and 0.255
# ms in elementwise kernels, where the model puts 0.224 and 0.002 ms, and 0.285 ms idle — 0.595 ms more
# than the model's work, 6.4 µs a kernel. Charged per launched kernel of a decode step (the launch
# floor's count), on top of the GPU work; checked on runs 53-55
# (benchmarks/results/validation-h200-run5{3,4,5}-*.json), which were not used to set it: dense decode at one GPU
# 3.14-3.31 ms measured.
DECODE_KERNEL_GPU_S = 6.4e-6
# The eager executor's kernel launches, a host-side floor under every step. Kernels per block
# invocation counted by torch.profiler on 2 × H200 over 2-layer stacks (training and prefill at
# 4K-32K tokens, decode at batch 8 after 16K), the optimizer's per-parameter kernels included
# (benchmarks/results/validation-h200-run30-x2-fewer-launches.json, `bash
# benchmarks/sweeps/h200x2-profiled.sh`: `phases_s.kernels_per_step`, divided by the layers). The
# host's time per kernel: median 53 µs over the 30 training and prefill runs, on two 2-GPU machines,
# whose host did not wait on the GPU (issuing a step took under 0.9 of the step; `host_enqueue_s` over
# the kernels): 48-72 µs on one (run 28), 29-69 µs on the other (run 30). A decode step's kernels
# (no autograd, small tensors) cost less: median 46 µs over the 14 decode runs of runs 28 and 30
# (24-106 µs). Not split by family: the profiled runs' dense decode steps are GPU-bound and their host
# time includes waiting (medians by family 60.5 against 37.3 µs), while on runs 54 and 55, whose host
# never waited on a dense decode step, it issued its kernels at 22 µs each against Mamba-2's 20, and
# `meshplan calibrate`'s probes on five machines put the two 0.95-1.37 of each other
# (benchmarks/results/calibration-*.toml). What the pooled cost hides there is the dense decode's GPU
# time, which the model puts 1.22x low (2.58 against 3.14-3.17 ms measured, runs 54-55). Host time
# depends on the host's CPU: a single-GPU machine issued the Mamba-2 decode step's kernels at 23 µs each
# (decode-profile-h200.json). A dense layer's count is split evenly
# between its two blocks (only the sum is measured); blocks the executor does not run (Mamba-1,
# Zamba2's projection) are assumed to launch what an MLP block does. Mamba-2 training counted again
# once the gated norm took one pass a direction: 213 a 2-layer step at 16K and 32K (was 227), 106.5 a
# block (benchmarks/results/profile-step-mamba2-h200-norm-one-pass.json, `kernels_per_step`); its
# prefill and decode counts were not profiled again (the norm's forward launches one kernel where it
# launched two, and no copy of z: they are 1-3 high).
STEP_KERNEL_HOST_S = 53e-6
DECODE_KERNEL_HOST_S = 46e-6
STEP_KERNELS_PER_BLOCK = {
    "train": {"attention": 41.9, "mlp": 41.9, "mamba2": 106.5},
    "prefill": {"attention": 10.0, "mlp": 10.0, "mamba2": 23.0},
    "decode": {"attention": 16.0, "mlp": 16.0, "mamba2": 32.0},
}
# What sharding adds per block, from the same runs (degree 2): TP-SSM's collectives and their copies;
# a sequence split — for Mamba-2 the shard's conv tail, the all-gather of the shards' summaries and the
# correction for the entering state (forward, recomputed forward, their backward): 126 in training,
# from 465 kernels a 2-layer SP step at 16K and 128K
# (benchmarks/results/validation-h200-run64-x2-mamba2-sp-correction-cat.json, `kernels_per_step`) less one GPU's 213,
# a block; 23 in prefill (92 a 2-layer
# step, less twice the 23 above). With the correction as torch ops it was 142 and 30
# (profile-sp-mamba2-128k-conv-head-h200x2.json; validation-h200-run4{0,1}-x2-mamba2-sp-one-scan.json);
# TSP's Mamba-2 block (the ring's hops, the gathered weights' unpacking, SP's shard steps, the gradients'
# packing): 137 in training, 35 in prefill, 10 in decode at degree 2 (487, 116 and 84 kernels a 2-layer
# step, less the counts above: validation-h200-run67-x2-mamba2-tsp.json),
# for a dense layer the K/V exchange (decode: each rank's partial attention and their combination) —;
# and TSP's shard-by-shard loops, taken as growing with the degree (each ring step runs one attention
# call and one weight shard). TP leaves a dense training layer within 2% of one GPU's count (82.5
# against 83.8); in decode it adds one launch a layer. Dense prefill under SP or TSP was not profiled:
# nothing is added there, so the floor is a lower bound.
STEP_KERNELS_SHARDED = {
    "train": {
        "mamba2": {"tpssm": 6.5, "sp": 126.0, "tsp2": 137.0},
        "attention": {"sp": 12.3, "tsp2": 117.0},
        "mlp": {"sp": 12.3, "tsp2": 117.0},
    },
    "prefill": {"mamba2": {"tpssm": 2.0, "sp": 23.0, "tsp2": 35.0}},
    "decode": {
        "mamba2": {"tpssm": 1.0, "tsp2": 10.0},
        "attention": {"tp": 0.5, "sp": 4.5, "tsp2": 33.0},
        "mlp": {"tp": 0.5, "sp": 4.5, "tsp2": 33.0},
    },
}


def step_kernels_per_block(kind: str, mode: str, layout) -> float:
    """Kernels the eager executor launches for one invocation of a `kind` block in a training,
    prefill or decode step under `layout` (STEP_KERNELS_PER_BLOCK and STEP_KERNELS_SHARDED)."""
    base = STEP_KERNELS_PER_BLOCK[mode]
    known = kind if kind in base else "mlp"
    extra = STEP_KERNELS_SHARDED[mode].get(known, {})
    n = base[known]
    if layout.tp > 1:
        n += extra.get("tp", 0.0)
    if layout.tpssm > 1:
        n += extra.get("tpssm", 0.0)
    if layout.sp > 1:
        n += extra.get("sp", 0.0)
    if layout.tsp > 1 and known == "mamba2":
        # Measured at degree 2; each rank more adds a ring hop each way (its send/recv and the copy into
        # the gathered rows: meshplan/executor/layouts/tsp_mamba.py ring_gather) and a row of packed
        # gradients — the rest (SP's shard steps, the unpacking) does not grow with the degree.
        n += extra.get("tsp2", 0.0) + TSP_MAMBA_KERNELS_PER_RANK[mode] * (layout.tsp - 2)
    elif layout.tsp > 1:
        n += extra.get("tsp2", 0.0) * layout.tsp / 2
    return n


TSP_MAMBA_KERNELS_PER_RANK = {"train": 5.0, "prefill": 2.0, "decode": 2.0}


# Adam step traffic per parameter, as meshplan.executor.optim.MixedAdam runs it: the bf16 gradient
# cast to fp32 (read 2, write 4), one fused AdamW pass (read fp32 weight, grad, m, v: 16; write
# weight, m, v: 12), the bf16 copy-back (read 4, write 2).
ADAM_STEP_BYTES_PER_PARAM = 40


@dataclass(frozen=True)
class Device:
    peak_flops: float
    hbm_bytes_per_s: float
    gemm_efficiency: float = GEMM_EFFICIENCY
    attention_causal: tuple = ATTENTION_EFFICIENCY_CAUSAL
    attention_prefix: tuple = ATTENTION_EFFICIENCY_PREFIX
    # The datasheet HBM rate the measured fractions above (eager factors, Mamba-2 kernel rates, decode
    # attention) are relative to; `meshplan calibrate` replaces hbm_bytes_per_s, not this.
    hbm_rated_bytes_per_s: float = 0.0
    # Host seconds per launched kernel (the launch floor): this workplace's H200 hosts unless
    # `meshplan calibrate` measured the cluster's own, then per block family (Mamba-2's are mostly
    # Triton launches, which cost the host more: 42 against 34 µs in its probes, 49 against 40 µs in
    # run 30, benchmarks/results/validation-h200-run30-x2-fewer-launches.json).
    host_kernel_s: float = STEP_KERNEL_HOST_S
    decode_host_kernel_s: float = DECODE_KERNEL_HOST_S
    mamba2_host_kernel_s: float | None = None  # None: as the other blocks
    mamba2_decode_host_kernel_s: float | None = None
    # The stack's elementwise work against one pass per tensor (meshplan.costmodel.stacks): the eager
    # executor's measured factors by default, 1 for fused kernels.
    elementwise_factor: float = EAGER_ELEMENTWISE_FACTOR
    elementwise_factor_mamba2: float = EAGER_ELEMENTWISE_FACTOR_MAMBA2
    flash_attention: bool = True  # False: QKᵀ and PV as batched GEMMs around a fused softmax (Megatron ≤ 2022)

    def host_kernel_cost(self, kind: str, decode: bool) -> float:
        """Host seconds per kernel a block of this kind launches."""
        if kind == "mamba2":
            own = self.mamba2_decode_host_kernel_s if decode else self.mamba2_host_kernel_s
            if own:
                return own
        return self.decode_host_kernel_s if decode else self.host_kernel_s

    @property
    def rated_hbm(self) -> float:
        return self.hbm_rated_bytes_per_s or self.hbm_bytes_per_s

    @classmethod
    def of(cls, cluster, stack=None) -> "Device":
        """The cluster's GPU under a stack (meshplan.costmodel.stacks; None: meshplan's executor), with
        what `meshplan calibrate` measured where it measured it (made once per cluster and stack: the
        planner asks thousands of times a ranking)."""
        return _device_of(cls, cluster, stack)

    @classmethod
    def _of(cls, cluster, stack) -> "Device":
        cal = cluster.calibration
        dev = cls(
            cluster.gpu.bf16_flops_per_s, cluster.gpu.hbm_bytes_per_s, hbm_rated_bytes_per_s=cluster.gpu.hbm_bytes_per_s
        )
        if stack is not None and stack.elementwise_factor is not None:
            dev = replace(
                dev,
                elementwise_factor=stack.elementwise_factor,
                elementwise_factor_mamba2=stack.elementwise_factor,
                flash_attention=stack.flash_attention,
            )
            gemm, attn = stack.gemm_rate(cluster.gpu.name), stack.attention_rate(cluster.gpu.name)
            if gemm:
                dev = replace(dev, gemm_efficiency=gemm)
            if attn:
                dev = replace(dev, attention_causal=((1, attn),), attention_prefix=((1, attn),))
        if cal is None:
            return dev
        return replace(
            dev,
            hbm_bytes_per_s=cal.hbm_bytes_per_s or dev.hbm_bytes_per_s,
            gemm_efficiency=cal.gemm_efficiency or dev.gemm_efficiency,
            attention_causal=cal.attention_causal or dev.attention_causal,
            attention_prefix=cal.attention_prefix or dev.attention_prefix,
            host_kernel_s=cal.host_kernel_s or dev.host_kernel_s,
            decode_host_kernel_s=cal.decode_host_kernel_s or dev.decode_host_kernel_s,
            mamba2_host_kernel_s=cal.mamba2_host_kernel_s,
            mamba2_decode_host_kernel_s=cal.mamba2_decode_host_kernel_s,
        )


@functools.lru_cache(maxsize=64)
def _device_of(cls, cluster, stack) -> Device:
    return cls._of(cluster, stack)


def _efficiency_table(prefix: bool, dev: "Device | None"):
    if dev is not None:
        return dev.attention_prefix if prefix else dev.attention_causal
    return ATTENTION_EFFICIENCY_PREFIX if prefix else ATTENTION_EFFICIENCY_CAUSAL


def attention_efficiency(keys: float, prefix: bool, dev: "Device | None" = None) -> float:
    """Interpolate the measured table in log(keys), clamped at its ends."""
    table = _efficiency_table(prefix, dev)
    if keys <= table[0][0]:
        return table[0][1]
    for (k0, e0), (k1, e1) in zip(table, table[1:]):
        if keys <= k1:
            f = (math.log(keys) - math.log(k0)) / (math.log(k1) - math.log(k0))
            return e0 + f * (e1 - e0)
    return table[-1][1]


def gemm_time_s(m: float, n: float, k: float, e: int, dev: Device) -> float:
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2 * m * n * k
    return max(flops / (dev.peak_flops * dev.gemm_efficiency), (m * k + k * n + m * n) * e / dev.hbm_bytes_per_s)


@dataclass(frozen=True)
class BlockCompute:
    gemm_fwd_s: float  # projections (what TSP's weight stream can hide behind)
    attn_fwd_s: float  # the attention core
    mem_fwd_s: float  # memory-bound work
    recompute_fwd_s: float  # extra forward work redone in backward
    flops_fwd: float  # model FLOPs (no recompute)
    kernel_fwd_s: float = 0.0  # Mamba-2's scan and conv kernels
    kernel_bwd_s: float = 0.0
    attn_bwd_factor: float = ATTENTION_BWD_FACTOR  # backward / forward time of the attention core

    @property
    def fwd_s(self) -> float:
        return self.gemm_fwd_s + self.attn_fwd_s + self.mem_fwd_s + self.kernel_fwd_s

    @property
    def bwd_s(self) -> float:
        return (
            2 * self.gemm_fwd_s
            + self.attn_bwd_factor * self.attn_fwd_s
            + 2 * self.mem_fwd_s
            + self.recompute_fwd_s
            + self.kernel_bwd_s
        )


def _gemms(model: ModelSpec, kind: str, head_div: int) -> list[tuple[float, float]]:
    """(n, k) of each projection in a block on one rank (m is the token count)."""
    if kind == "attention":
        a = model.attention
        return [((a.q_width + 2 * a.kv_width) / head_div, a.hidden), (a.out_hidden, a.q_width / head_div)]
    if kind == "mlp":
        f = model.mlp
        return [(f.n_input_matrices * f.ffn_hidden / head_div, f.hidden), (f.out_hidden, f.ffn_hidden / head_div)]
    if kind == "mamba2":
        m = model.mamba2
        return [(m.in_proj_width / head_div, m.d_model), (m.d_model, m.d_inner / head_div)]
    if kind == "mamba1":
        m = model.mamba1
        di = m.d_inner / head_div
        return [(2 * di, m.d_model), (m.x_proj_width, di), (di, m.dt_rank), (m.d_model, di)]
    # hybrid_proj: the invocation's linear back to d_model, and its LoRA adapters (down to the rank and
    # up again) beside the shared MLP's gate/up and, if any, the shared Q, K and V (models.adapter_params).
    gemms = [(model.d_model, model.mlp.out_hidden)]
    rank = model.adapter_rank
    if rank:
        f, a = model.mlp, model.attention
        gemms += [(rank, f.hidden), (f.n_input_matrices * f.ffn_hidden, rank)]
        if model.attention_adapters:
            gemms += 3 * [(rank, a.hidden), (a.hidden, rank)]
    return gemms


def _memory_bound_bytes_per_token(model: ModelSpec, kind: str, head_div: int, e: int) -> float:
    """HBM traffic of the non-GEMM work per token: norm (read + write), residual add (2 reads + write),
    and the block's own elementwise ops; for Mamba the conv and the scan's inputs and outputs."""
    if kind == "attention":
        a = model.attention
        return e * (5 * a.hidden + 2 * (a.q_width + a.kv_width) / head_div)  # + rotary on q, k
    if kind == "mlp":
        f = model.mlp
        return e * (5 * f.hidden + 3 * f.ffn_hidden / head_div)  # SwiGLU reads gate, up; writes product
    if kind == "mamba2":  # conv and scan are kernels of their own (mamba2_kernel_s); dt's softplus is fp32
        m = model.mamba2
        gate_norm = 3 * m.d_inner / head_div
        return e * (5 * m.d_model + gate_norm) + (e + 4) * m.nheads / head_div
    if kind == "mamba1":
        m = model.mamba1
        di = m.d_inner / head_div
        # selective scan reads u, delta, z and B, C; writes y; conv reads and writes x.
        return e * (5 * m.d_model + 2 * di + 4 * di + 2 * m.d_state) + 4 * di * m.d_state * 2 / 2048
    return e * 2 * model.d_model


def zigzag_attention_s(q_width: float, tokens: float, keys: float, parts: int, dev: Device) -> float:
    """Seconds of the slowest rank's attention forward under a zigzag split of each sequence of `keys`
    tokens over `parts` ranks, for the rank's `tokens` local queries (keys / parts of each sequence, so
    tokens·parts/keys sequences): on each sequence a rank runs two prefix attentions of keys/2D queries,
    over (i+1)·c and (2D−i)·c keys (c = keys / 2D), at the prefix kernel's rate for that many keys —
    shorter prefixes run at a lower rate, so the balanced FLOPs do not take balanced time. Attention is
    per sequence: the time is linear in the sequences a micro-batch holds."""
    import numpy as np  # here, not at the top: importing the planner loads no numpy

    c = keys / (2 * parts)
    q = c  # each half-shard holds keys / 2D queries of one sequence
    sequences = tokens * parts / keys
    i = np.arange(parts)
    ends = np.concatenate([(i + 1) * c, (2 * parts - i) * c])  # each rank's two prefixes, rank by rank
    # attention_efficiency at every end at once (np.interp clamps at the table's ends as it does): the
    # planner meets splits over thousands of ranks, where a loop of scalar calls took most of its time.
    table = _efficiency_table(True, dev)
    eff = np.interp(np.log(ends), np.log([k for k, _ in table]), [e for _, e in table])
    # q queries, the last q of `end` positions, lower-right causal
    t = 4 * q_width * (q * ends - q * q / 2) / (dev.peak_flops * eff)
    return sequences * float((t[:parts] + t[parts:]).max())


def block_compute(
    model: ModelSpec,
    kind: str,
    tokens: float,
    keys: float,
    sh: Sharding,
    e: int,
    dev: Device,
    *,
    recompute: str,
    training: bool,
    causal_fraction: float = 0.5,
    zigzag: int = 0,
    row_tokens: float | None = None,
) -> BlockCompute:
    """One invocation of `kind` on one rank: `tokens` local queries attending to `keys` keys, of which
    a query sees `causal_fraction` on average (0.5 for a balanced causal split); `zigzag`: the ranks a
    zigzag split deals the keys over (zigzag_attention_s), 0 for none; `row_tokens`: the local tokens
    of one sequence row (the scan passes over a row's chunks in turn; `tokens` when not given)."""
    head_div = sh.head_div
    gemm = sum(gemm_time_s(tokens, n, k, e, dev) for n, k in _gemms(model, kind, head_div))
    flops = sum(2 * tokens * n * k for n, k in _gemms(model, kind, head_div))
    attn = 0.0
    if kind == "attention":
        core_flops = 4 * tokens * keys * model.attention.q_width / head_div * causal_fraction
        if keys <= 1:
            attn = 0.0
        elif not dev.flash_attention:
            attn = unfused_attention_s(model, tokens, keys, head_div, e, dev)
        elif zigzag > 1:
            attn = zigzag_attention_s(model.attention.q_width / head_div, tokens, keys, zigzag, dev)
        else:
            attn = core_flops / (dev.peak_flops * attention_efficiency(keys, sh.token_div > 1, dev))
        windowed = model.windowed_share(keys) if keys > 1 else 0.0
        if windowed:
            # A sliding window of w keys: a query sees min(i, w) of them, w − w²/2s on average over s
            # positions, instead of s/2; one invocation here is the mean over the window and full layers.
            w = model.attention_window
            window_flops = 4 * tokens * (w - w * w / (2 * keys)) * model.attention.q_width / head_div
            window_s = window_flops / (dev.peak_flops * attention_efficiency(w, sh.token_div > 1, dev))
            attn = (1 - windowed) * attn + windowed * window_s
            core_flops = (1 - windowed) * core_flops + windowed * window_flops
        flops += core_flops
    eager = dev.elementwise_factor_mamba2 if kind == "mamba2" else dev.elementwise_factor
    mem = tokens * _memory_bound_bytes_per_token(model, kind, head_div, e) * eager / dev.rated_hbm
    kernel_fwd, kernel_bwd = (
        mamba2_kernel_s(model, tokens, head_div, e, dev, row_tokens) if kind == "mamba2" else (0.0, 0.0)
    )
    if kind == "mamba2" and sh.token_div > 1:
        # A sequence shard corrects its zero-start scan for the state entering it, in forward and in the
        # recomputed forward, and differentiates the correction (meshplan/executor/layouts/mamba.py).
        corr_fwd, corr_bwd = sp_correction_s(model, tokens, head_div, e, dev)
        kernel_fwd, kernel_bwd = kernel_fwd + corr_fwd, kernel_bwd + corr_bwd
    recompute_s = 0.0
    if training:
        if recompute == "full":
            recompute_s += gemm + attn + mem + kernel_fwd
        elif kind == "attention" and (recompute == "selective" or sh.gathers_kv):
            # Sequence shards keep only their local q, k, v: attention is recomputed in backward.
            recompute_s += attn
        elif kind in ("mamba2", "mamba1"):
            # The mixer core (conv, scan, gated norm, out_proj) is recomputed in backward.
            recompute_s += mem + kernel_fwd + gemm_time_s(tokens, *_gemms(model, kind, head_div)[-1], e, dev)
    bwd_factor = ATTENTION_BWD_FACTOR if dev.flash_attention else UNFUSED_ATTENTION_BWD_FACTOR
    return BlockCompute(gemm, attn, mem, recompute_s, flops, kernel_fwd, kernel_bwd if training else 0.0, bwd_factor)


# Megatron-LM's core attention without a fused kernel (Narayanan et al. 2021 §4.2: baddbmm for QKᵀ,
# a fused scale-mask-softmax, dropout, bmm for PV): the full s × s scores of every head are computed and
# then masked, and cross HBM as fp16 — written by QKᵀ (2 B), read and written by the softmax (4 B), by
# dropout with its 1-byte mask (5 B), read by PV (2 B): 13 bytes a score forward.
UNFUSED_SCORE_BYTES = 13


def unfused_attention_s(model: ModelSpec, tokens: float, keys: float, head_div: int, e: int, dev: Device) -> float:
    """Forward seconds of unfused attention over all `keys` (no causal saving): its two batched GEMMs at
    the GEMM rate and the scores' HBM traffic (UNFUSED_SCORE_BYTES)."""
    a = model.attention
    flops = 4 * tokens * keys * a.q_width / head_div
    scores = tokens * keys * a.heads / head_div
    return flops / (dev.peak_flops * dev.gemm_efficiency) + scores * UNFUSED_SCORE_BYTES * e / 2 / dev.rated_hbm


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


def int8_allreduce_kernels_s(elements: float, ranks: int, dev: Device) -> float:
    """HBM time on one rank of our int8 all-reduce's kernels (meshplan/kernels/quant.py) over a tensor
    of `elements`. Two ranks: quantize (bf16 in, int8 out), dequantize-sum (both int8 copies in, bf16
    out) — 3 + (2 + 2) bytes per element. More: quantize, dequantize-sum-requantize (the group's int8
    copies of this rank's 1/n in, 1/n out), dequantize (int8 in, bf16 out) — 3 + (1 + 1/n) + 3. The
    fp32 scales (4 B per 128) aside. Two ranks over peer-mapped memory (meshplan/executor/peer.py) read
    and write the same bytes. Launches and the collectives' latency are not in it: on NVLink over
    NCCL that fixed cost, not these bytes, made the int8 path slower on 4 ranks
    (benchmarks/results/quant-allreduce-h200x4.json); the 2-rank peer path issues in 33 us
    (quant-allreduce-peer-h200x2.json)."""
    per_element = 3 + (2 + 2) if ranks == 2 else 3 + (1 + 1 / ranks) + 3
    return elements * per_element / dev.rated_hbm


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
    rows: float, row_tokens: float, heads: float, headdim: int, d_state: int, segment: bool = True
) -> float:
    """Seconds of one SSD state passing (meshplan/kernels/ssd.py, with the kernel forming its weights)
    over `rows` sequence rows of `row_tokens` tokens and `heads` heads: each program takes its row's
    chunks (or its segment's, meshplan.kernels.launch.pass_segments, unless `segment` is False) in
    turn, and the SM's programs share its issue slots (see SCAN_PASS_STEP_ISSUE_S)."""

    chunks = math.ceil(row_tokens / SSD_CHUNK)
    segments, steps = pass_segments(math.ceil(rows), heads, headdim, d_state, chunks) if segment else (1, chunks)
    per_sm = math.ceil(segments * pass_programs(math.ceil(rows), heads, headdim, d_state) / SCAN_PASS_SMS)
    # A segmented passing's join takes one step a segment (as a passing's step, unmeasured apart).
    join = segments * SCAN_PASS_STEP_LATENCY_S if segments > 1 else 0.0
    return steps * max(SCAN_PASS_STEP_LATENCY_S, per_sm * SCAN_PASS_STEP_ISSUE_S) + join


def mamba2_kernel_s(
    model: ModelSpec, tokens: float, head_div: int, e: int, dev: Device, row_tokens: float | None = None
) -> tuple[float, float]:
    """(forward, backward) seconds of the scan and conv kernels: the chunk kernels and the conv at their
    measured HBM fractions, each state passing by `scan_pass_s` (`row_tokens` tokens a sequence row on
    this rank; `tokens` when not given). The backward runs the passing twice (the forward's again, and
    its own), in segments only with meshplan.kernels.launch.PASS_SEGMENT_BACKWARD."""
    if tokens <= 1:  # decode: the state update, costed by the step's decode state I/O
        return 0.0, 0.0
    m = model.mamba2
    row_tokens = row_tokens or tokens
    b = mamba2_kernel_bytes(model, tokens, head_div, e)
    hbm = dev.rated_hbm

    shape = (tokens / row_tokens, row_tokens, m.nheads / head_div, m.headdim, m.d_state)
    passing, bwd_passing = scan_pass_s(*shape), scan_pass_s(*shape, segment=launch.PASS_SEGMENT_BACKWARD)
    return (
        passing + b["scan_fwd_chunks"] / (hbm * SCAN_FWD_HBM_FRACTION) + b["conv_fwd"] / (hbm * CONV_FWD_HBM_FRACTION),
        2 * bwd_passing
        + b["scan_bwd_chunks"] / (hbm * SCAN_BWD_HBM_FRACTION)
        + b["conv_bwd"] / (hbm * CONV_BWD_HBM_FRACTION),
    )


def logits_compute(model: ModelSpec, tokens: float, sh: Sharding, e: int, dev: Device) -> BlockCompute:
    vocab = model.vocab / sh.vocab_div
    gemm = gemm_time_s(tokens, vocab, model.d_model, e, dev)
    # softmax / cross-entropy over the fp32 logits: read and write them twice.
    mem = tokens * vocab * 4 * 4 / dev.hbm_bytes_per_s
    return BlockCompute(gemm, 0.0, mem, 0.0, 2 * tokens * vocab * model.d_model)


def optimizer_time_s(local_params: float, dev: Device) -> float:
    return local_params * ADAM_STEP_BYTES_PER_PARAM / dev.hbm_bytes_per_s

"""What a GPU achieves under a stack (docs/design.md §4): the Device the compute model prices with —
its peak, its HBM rate, and the achieved fractions of them (GEMM rate, attention's by key length, the
eager elementwise passes, the host's time a launched kernel) — with the executor's measured values as
defaults, a stack's (meshplan.costmodel.stacks) where it states its own, and `meshplan calibrate`'s
where a profile measured them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from meshplan import hardware
from meshplan.errors import MeshplanError
from meshplan.models import frozen_hash

# Achieved / peak of the bf16 GEMMs in a training step of the 7B-shaped layers (forward and backward
# shapes, cuBLAS nvjet kernels) on an H200: 0.73 at 32K tokens, 0.74 at 16K, 0.78 at 4K
# (benchmarks/results/profile-step-h200.json, `python benchmarks/profile_step.py`); a square 8192³
# GEMM reaches 0.80 (benchmarks/results/attention-h200.json). Replaced by `meshplan calibrate` profiles.
GEMM_EFFICIENCY = 0.74


# HBM traffic of the executor's elementwise work (RMSNorm, SwiGLU and the rotary as Triton kernels, one pass
# each way: meshplan/kernels/gated_norm.py, swiglu.py, rotary.py; the residual adds and layout copies in
# torch) against the single pass per tensor the byte counts below assume: 1.23× at 16K and 1.21× at 32K
# tokens on an H200 (kernels other than GEMM, attention and the optimizer, 2-layer dense-7b step;
# benchmarks/results/profile-step-h200-fused.json, `python benchmarks/profile_step.py`: its elementwise time
# over its predicted memory_bound, which that run priced at the factor 3.3 then, times 3.3; 1.35× at 4K,
# where small kernels weigh more). Before the SwiGLU and rotary kernels and the one-pass Adam (whose fp32
# casts counted here) it was 3.4× / 3.1× (profile-step-h200-triton-norm.json); with the torch RMSNorm too,
# 5.9× (profile-step-h200.json).
EAGER_ELEMENTWISE_FACTOR = 1.22

# The rate of the executor's torch ops over large tensors — the copies, sums, in-place products and cats TSP's
# motion is made of (axes/tsp.motion_bytes, head_motion_bytes) — as a fraction of the rated HBM rate: the median
# of 11 timings on one H200 (0.58-0.70: the loss's former torch path 0.63-0.70 over 8K-16K tokens × 32K-128K
# vocabulary, bf16 and fp32 logits; TSP's fp32 logits sum 0.58-0.59; its shard packing cats 0.59-0.69),
# benchmarks/results/loss-h200.json, `python benchmarks/bench_loss.py` (again 0.64 in loss-kernels-h200.json).
# Measured on an H200 and used for every GPU, as the eager factors above are. What those ops move is counted
# exactly; the rate is what the measurement adds. The whole TSP steps' elementwise kernels ran at 0.52-0.54 of the
# rated rate over the counter's bytes (benchmarks/results/s25-h200x2-tsp/), the Triton norms and activations
# among them. The zigzag motion's own rate is below.
TORCH_OP_HBM_FRACTION = 0.645
# The zigzag shard's data motion (executor/layouts/common.py attend_zigzag: index_select, the blocks' lerp_
# merges, slice gradients, cats) as a fraction of the rated HBM rate over the bytes
# blocks/attention.zigzag_motion_bytes counts: the median of 4 timings on one H200 (0.46-0.55: 16K-64K tokens over
# 2-4 shards, 32 heads, 32 or 8 K/V heads; forward + backward with the attention kernels stubbed, replayed as a
# CUDA graph, over benchmarks/zigzag_bytes.py's count of the same call), benchmarks/results/zigzag-motion-h200.json,
# `python benchmarks/bench_zigzag_motion.py`. (The s22-s23 profiles had put them under half the rated rate.)
ZIGZAG_MOTION_HBM_FRACTION = 0.495
# The executor's loss kernels (meshplan.kernels.cross_entropy: row statistics, exponentials, gradient) as a
# fraction of the rated HBM rate over the bytes compute.executor_loss_bytes counts: the median of 6 timings on
# one H200 (0.61-0.78: 8K-16K tokens × 32K-128K vocabulary, bf16 and fp32 logits; 2.5-4.0× faster than the torch
# path on the same logits), benchmarks/results/loss-kernels-h200.json, `python benchmarks/bench_loss.py`.
LOSS_KERNEL_HBM_FRACTION = 0.706


# The executor's MoE routing in torch — the MoE sublayer's pre-norm and residual, the router's softmax and
# top-k, the copies gathered into expert order and back (executor/experts.py Take), the weighted sum of a
# token's copies, and their backward — against one pass a tensor of what blocks/moe.py counts for them (the
# router kind's bytes and the experts' permutation bytes; the experts' SwiGLU runs as the Triton kernel, at
# the factor above): 3.2× (Mixtral-8x7B) and 3.3× (Qwen3-30B-A3B) at 16K tokens, 3.2× / 3.4× at 8K, 3.5× /
# 3.6× at 4K, in 2-layer training steps on an H200
# (benchmarks/results/profile-step-{mixtral-8x7b,qwen3-30b-a3b}-h200-fused.json,
# `python benchmarks/profile_step.py --model M --seqs 4096,8192,16384`: the kernels other than GEMM,
# attention and the optimizer, less the attention block's and the SwiGLU's bytes at the factor above, over
# the rest, from the file's raw_memory_bound_s). The pre-norm and residual are in the
# routing's share because the router kind counts them; priced at the elementwise factor instead, the routing
# proper comes out 4.1× (Mixtral) and 3.6× (Qwen3). One factor for both families, 8 experts of 14336 top-2 and
# 128 of 768 top-8, within 3%.
EAGER_ROUTING_FACTOR = 3.3


# Achieved / peak of the executor's attention forward + backward (bf16, 32 heads of 128) by key length,
# measured on an H200 with torch 2.11 through its own paths (meshplan/executor/attention.py;
# benchmarks/results/attention-paths-h200.json, `python benchmarks/bench_attention_paths.py`): whole-sequence
# causal attention through SDPA with cuDNN asked first (queries and keys aligned: one GPU, TP), and a
# sequence shard's queries over its key prefix (SP, TSP) as an unmasked off-diagonal block and a causal
# diagonal block merged by log-sum-exp, each on cuDNN's fused kernel (keys/2 queries a shard). The shard
# path ran at 0.27-0.33 as one SDPA call with a lower-right causal mask, on the memory-efficient kernel
# (attention-h200.json, the tables before #34). The same bench on an H100 gave the same within 0.04
# (attention-paths-h100.json). Other GPUs get the same fractions of their own peak until `meshplan
# calibrate` measures them.
ATTENTION_EFFICIENCY_CAUSAL = ((4096, 0.344), (16384, 0.514), (32768, 0.541))


# A shard's rate is keyed by its keys alone, measured with keys/2 queries (sp = 2); hardware.py's cuDNN
# prefix table was measured with keys/4: a shard with fewer queries over the same keys runs smaller calls
# (slower), with more faster — neither table is keyed by the queries, nor by the heads a rank holds.
ATTENTION_EFFICIENCY_PREFIX = ((8192, 0.442), (16384, 0.526), (32768, 0.534))


ATTENTION_EFFICIENCY = 0.35  # decode and anything off the tables' shapes


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
    elementwise_factor_routing: float = EAGER_ROUTING_FACTOR
    flash_attention: bool = True  # False: QKᵀ and PV as batched GEMMs around a fused softmax (Megatron ≤ 2022)
    # Sequence shards redo the attention core in backward (the stack's: Stack.sequence_attention_recompute)
    sequence_attention_recompute: bool = True
    # Zigzag sequence shards move the gathered K/V around their attention kernels (Stack.zigzag_motion)
    zigzag_motion: bool = True
    # TSP's torch-op data motion around its GEMMs (Stack.tsp_motion)
    tsp_motion: bool = True
    # The loss as the executor's Triton passes (Stack.executor_loss: compute.executor_loss_bytes)
    executor_loss: bool = True
    # Where the rates are borrowed (meshplan.hardware.rates): the note a prediction prints; "" when the
    # table or a calibration has this GPU's own.
    rates_note: str = ""
    # The linear layers' GEMM precision (meshplan.costmodel.stacks.FP8_GEMM_LAYERS says which): "bf16",
    # "fp8" or "mxfp8"; under FP8 they run `fp8_speedup` times the bf16 GEMM rate (measured, or the
    # datasheet's peak ratio: hardware.fp8_speedup), below `fp8_peak_flops`, the ceiling
    # costmodel/invariants.py holds them to.
    precision: str = "bf16"
    fp8_speedup: float = 1.0
    fp8_peak_flops: float = 0.0
    fp8_input_bytes: float = 1.0  # bytes an FP8 GEMM operand element reads (MXFP8: + a scale a 32)
    fp8_current_scaling: bool = False  # each quantized tensor read once more for its amax (--fp8-recipe current)

    __hash__ = frozen_hash  # block_compute's cache keys on it

    @property
    def linear_gemm_rate(self) -> float:
        """FLOP/s of the linear layers' GEMMs at the run's precision."""
        rate = self.peak_flops * self.gemm_efficiency
        return rate * self.fp8_speedup if self.precision != "bf16" else rate

    def host_kernel_cost(self, triton_launches: bool, decode: bool) -> float:
        """Host seconds per kernel a block launches; `triton_launches`: mostly Triton kernels (Mamba-2's),
        which `meshplan calibrate` times apart."""
        if triton_launches:
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
        rates, note = hardware.rates(cluster.gpu.name, stack.name if stack is not None else "meshplan")
        if stack is not None:
            dev = replace(
                dev, zigzag_motion=stack.zigzag_motion, tsp_motion=stack.tsp_motion, executor_loss=stack.executor_loss
            )
        if stack is not None and stack.elementwise_factor is not None:
            dev = replace(
                dev,
                elementwise_factor=stack.elementwise_factor,
                elementwise_factor_mamba2=stack.elementwise_factor,
                elementwise_factor_routing=stack.elementwise_factor,
                flash_attention=stack.flash_attention,
                sequence_attention_recompute=stack.sequence_attention_recompute,
            )
            if rates.gemm:
                dev = replace(dev, gemm_efficiency=rates.gemm)
            if rates.attention:
                dev = replace(dev, attention_causal=((1, rates.attention),), attention_prefix=((1, rates.attention),))
            if rates.attention_causal:
                dev = replace(dev, attention_causal=rates.attention_causal, attention_prefix=rates.attention_prefix)
        if cal is not None and cal.gemm_efficiency:
            note = ""  # `meshplan calibrate` measured this cluster
        dev = replace(dev, rates_note=note)
        if stack is not None and stack.precision != "bf16":
            dev = replace(_at_fp8(dev, cluster, stack.precision), fp8_current_scaling=stack.fp8_recipe == "current")
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


def _at_fp8(dev: Device, cluster, precision: str) -> Device:
    """`dev` with its linear GEMMs in FP8: the GPU's FP8 peak from its cluster file, the rate over bf16
    measured where hardware.py has it (else the datasheet's ratio, noted)."""
    gpu = cluster.gpu
    if not gpu.fp8_flops_per_s:
        raise MeshplanError(
            f"--precision {precision}: {gpu.name} has no FP8 peak in its cluster description "
            "([gpu] fp8_tflops); add it or use --precision bf16"
        )
    kind = hardware.gpu_kind(gpu.name)
    if precision == "mxfp8" and not (kind and kind.mxfp8):
        raise MeshplanError(
            f"--precision mxfp8: {gpu.name} has no MXFP8 tensor cores (Blackwell has); use --precision fp8"
        )
    speedup, fp8_note = hardware.fp8_speedup(gpu.name, gpu.bf16_flops_per_s, gpu.fp8_flops_per_s)
    note = "; ".join(n for n in (dev.rates_note, fp8_note) if n)
    return replace(
        dev,
        precision=precision,
        fp8_speedup=speedup,
        fp8_peak_flops=gpu.fp8_flops_per_s,
        fp8_input_bytes=1.0 + (1 / 32 if precision == "mxfp8" else 0.0),
        rates_note=note,
    )


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
    """A bf16 GEMM (m × k)·(k × n) by roofline: its FLOPs at the GEMM rate, or its operands and output
    through HBM."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2 * m * n * k
    return max(flops / (dev.peak_flops * dev.gemm_efficiency), (m * k + k * n + m * n) * e / dev.hbm_bytes_per_s)


def linear_gemm_time_s(m: float, n: float, k: float, e: int, dev: Device) -> float:
    """A linear layer's GEMM at the run's precision: gemm_time_s under bf16; under FP8 its FLOPs at the
    FP8 rate (Device.linear_gemm_rate), or its FP8 operands and its `e`-byte output through HBM."""
    if dev.precision == "bf16":
        return gemm_time_s(m, n, k, e, dev)
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2 * m * n * k
    return max(flops / dev.linear_gemm_rate, ((m * k + k * n) * dev.fp8_input_bytes + m * n * e) / dev.hbm_bytes_per_s)


# The routed experts' grouped GEMM (torch._grouped_mm, bf16, gate/up and down, forward and backward, the
# gradients returned as a training step makes them) as a fraction of one large dense GEMM's rate (8192 × 4096 ×
# 16384, forward + backward, 790 TFLOP/s) timed in the same run on one H100 — the rate GEMM_EFFICIENCY stands
# for — by the routed copies each expert runs: the median of the 7 cells at 16 and 64 local experts over four
# expert shapes (Qwen3-30B's 2048 → 768, Qwen2-57B's 3584 → 2560, DeepSeek-V3's 7168 → 2048 at 16 and 64;
# Mixtral-8x7B's 4096 → 14336 at 16) (benchmarks/results/grouped-gemm-grid-h100.json, its "table", `python
# benchmarks/bench_grouped_gemm.py --grid`; the cells spread about ±0.1 around it; 4 experts or fewer run
# slower at few rows, the grouped kernel having too few tiles; above 4,096 rows the last value). Few rows an
# expert leave the tensor cores waiting on each expert's weights. The table before it (grouped-gemm-h100.json)
# divided the grouped rate by a dense GEMM of the same few total rows, itself below the large GEMM's rate at
# those sizes, with an activation between the GEMMs and gradients accumulated between repetitions:
# 0.43 / 0.65 / 0.77 / 0.87 / 0.93 at 256 … 4,096 rows. Transformer Engine's GroupedLinear (Megatron-Core's:
# one cuBLAS GEMM an expert over 4 streams, timed forward there) ran within a few percent of
# torch._grouped_mm from 1,024 rows an expert and slower below.
GROUPED_GEMM_FACTOR = (
    (128, 0.346),
    (256, 0.596),
    (512, 0.747),
    (1024, 0.817),
    (2048, 0.844),
    (4096, 0.842),
)


def grouped_gemm_factor(rows: float) -> float:
    """The grouped GEMM's rate over a dense GEMM's at `rows` routed copies an expert (GROUPED_GEMM_FACTOR,
    interpolated in log rows; below the table in proportion to the rows, above it flat)."""
    table = GROUPED_GEMM_FACTOR
    if rows <= table[0][0]:
        return table[0][1] * max(rows, 1.0) / table[0][0]
    for (r0, f0), (r1, f1) in zip(table, table[1:]):
        if rows <= r1:
            t = math.log(rows / r0) / math.log(r1 / r0)
            return f0 + t * (f1 - f0)
    return table[-1][1]


def grouped_gemm_time_s(rows: float, n: float, k: float, groups: float, e: int, dev: Device) -> float:
    """`groups` GEMMs of (rows × k)·(k × n), one an expert: the dense rate scaled by grouped_gemm_factor,
    or each expert's operands through HBM, whichever is slower. Transformer Engine's GroupedLinear runs
    them in FP8 under --precision fp8 (at the linear GEMMs' FP8 rate: the grouped factor measured in
    bf16 is assumed to carry over)."""
    if rows <= 0 or n <= 0 or k <= 0 or groups <= 0:
        return 0.0
    flops = 2 * rows * n * k * groups
    if dev.precision == "bf16":
        rate = dev.peak_flops * dev.gemm_efficiency * grouped_gemm_factor(rows)
        return max(flops / rate, groups * (rows * k + k * n + rows * n) * e / dev.hbm_bytes_per_s)
    operand_bytes = (rows * k + k * n) * dev.fp8_input_bytes + rows * n * e
    return max(flops / (dev.linear_gemm_rate * grouped_gemm_factor(rows)), groups * operand_bytes / dev.hbm_bytes_per_s)

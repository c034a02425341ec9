"""What each GPU achieves under each stack, in one table: the fraction of its bf16 peak its layer GEMMs
and its attention reach, where it was measured or published. The cost model's Device
(meshplan.costmodel.device) reads its rates here; the executor's worker finds the cluster preset of the
GPU it runs on here. A GPU or stack the table lacks is priced at the executor's rates measured on an
H200 (the defaults in meshplan.costmodel.device), and the prediction says so in a note — never
silently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Rates:
    """Achieved / peak under one stack on one GPU kind; None: the executor's measured defaults."""

    gemm: float | None
    attention: float | None  # one rate for every key length; None: the tables below, or the executor's
    source: str
    # Attention's rate by key length, ((keys, achieved / peak), ...), whole-sequence causal and on a
    # sequence shard's key prefix, where the stack's kernel was measured by length (else `attention`).
    attention_causal: tuple[tuple[int, float], ...] | None = None
    attention_prefix: tuple[tuple[int, float], ...] | None = None

    def __post_init__(self) -> None:
        if (self.attention_causal is None) != (self.attention_prefix is None):
            raise ValueError(f"Rates({self.source}): give attention_causal and attention_prefix together")


@dataclass(frozen=True)
class GpuKind:
    key: str  # found in the GPU's name (the cluster file's or torch's device name), upper case
    preset: str  # the cluster preset of one node of it
    rates: tuple[tuple[str, Rates], ...]  # (stack, its rates here)
    # FP8 linear-layer GEMMs over bf16 at the same shapes, where measured (None: the vendor's dense FP8
    # over bf16 peak ratio, which the prediction notes as specification)
    fp8_speedup: float | None = None
    fp8_source: str = ""
    mxfp8: bool = False  # MXFP8 (32-element blocks, E8M0 scales) in the tensor cores: Blackwell
    # Its figures are the vendor's datasheet, not a measurement: no published run is priced on it
    # (benchmarks/published_runs.py counts none), and every prediction on it says so.
    specification: bool = False


# Achieved / peak of a transformer layer's bf16 GEMMs (forward, input-gradient and weight-gradient
# shapes) on an H100 SXM at the shapes of the Megatron-LM README's H100 models (h 2048-18432, TP 1-8,
# micro-batch 1-2 × 4096 tokens): 638-720 TFLOP/s, median 0.679 of 989.4
# (benchmarks/results/gemm-shapes-h100.json, `python benchmarks/bench_gemm_shapes.py --gpu-kind h100`). The
# same run put torch SDPA's causal flash attention (forward + backward) at 0.20-0.39, median 0.31. Under
# sustained load (a minute of large GEMMs first, then 2 s a shape) the same shapes at micro-batch 1 ran
# at 0.689 against 0.712 in 20-call bursts on one machine (gemm-shapes-h100-sustained.json,
# gemm-shapes-h100-burst.json): the power-limited clock costs ~3%, inside this constant's spread across
# machines.
H100_GEMM_EFFICIENCY = 0.679
H100_ATTENTION_EFFICIENCY = 0.31
# cuDNN's fused attention, which Transformer Engine's DotProductAttention runs on Hopper whenever both it
# and FlashAttention take the shape (TE v1.2 on, NVIDIA/TransformerEngine commit 32db3928, 2023-12: "Select
# FusedAttention on sm90 and FlashAttention on others for performance"; v2.x get_attention_backend
# keeps it for sm90+), its context-parallel ring included (AttnFuncWithCPAndKVP2P calls fused_attn_fwd when
# FusedAttention is selected, TE v1.3 on). Measured through torch SDPA's CUDNN backend (cuDNN 9.19, bf16,
# 128-wide heads, forward + backward, useful FLOPs 3.5 × 2·s²·d·heads) on one H100 SXM by key length:
# whole-sequence causal, 2K (24 heads, batch 4) to 32K (32 query / 8 KV heads); and a sequence shard as
# TE's ring attends it, each K/V block apart, unmasked off the diagonal and causal on it — timed as a
# quarter of the keys' queries over the keys before them plus their own causal block ("cudnn-blocks";
# TE's ring makes one call a step, smaller than these two). Achieved TFLOP/s over 989.4
# (benchmarks/results/attention-blocks-h100.json, `python benchmarks/bench_rates.py --only attention`;
# the first run, rates-h100.json, within 3%). torch's default FLASH backend (FlashAttention-2) reached
# 0.20-0.33 on the same shapes.
H100_CUDNN_ATTENTION_CAUSAL = ((2048, 0.344), (4096, 0.428), (8192, 0.516), (16384, 0.541), (32768, 0.569))
H100_CUDNN_ATTENTION_PREFIX = ((2048, 0.146), (4096, 0.233), (8192, 0.366), (16384, 0.471), (32768, 0.528))
_CUDNN_H100 = "benchmarks/results/attention-blocks-h100.json"

# A100 GEMM rate under Megatron-LM (fp16): no A100 is lent to this project, so it is set from the
# published per-layer timings of the same software on the same cluster — Korthikanti et al. 2022 Table 4,
# one 22B layer (h 6144, TP 8, MBS 4, s 2048) forward and backward under five recompute / SP settings:
# the rate that makes the model's layer time match those ten timings in the least-squares sense
# (benchmarks/published_runs.py --fit-a100 recomputes it; Table 4's rows are marked role = "calibration"
# and are not counted as tests).
A100_GEMM_EFFICIENCY = 0.736

# FP8 (e4m3, per-tensor scales: Transformer Engine's delayed and current scaling) over bf16 GEMMs at
# the forward shapes of the h4096 and h8192 layers (QKV, fc1, fc2; TP 1 and 8; 8192 tokens), measured
# on one H100 SXM with torch._scaled_mm: 1.68-1.91, median 1.763 over the seven layer shapes
# (benchmarks/results/rates-h100.json, `python benchmarks/bench_rates.py`; row-wise scales: median
# 1.684; a square 8192³ GEMM: 2.00). Applied to the bf16 GEMM rate above: 0.679 × 1.763 = 1.197 of the
# bf16 peak, 0.60 of the FP8 peak. Backward shapes were not measured.
FP8_GEMM_SPEEDUP_H100 = 1.763
_RATES_H100 = "benchmarks/results/rates-h100.json (torch._scaled_mm, per-tensor scales)"

# Megatron-Core runs its attention through Transformer Engine (--transformer-impl transformer_engine,
# --attention-backend auto: TE chooses), so cuDNN's on Hopper.
_H100_MEGATRON = Rates(
    H100_GEMM_EFFICIENCY,
    None,
    f"benchmarks/results/gemm-shapes-h100.json (GEMMs), {_CUDNN_H100} (cuDNN attention)",
    attention_causal=H100_CUDNN_ATTENTION_CAUSAL,
    attention_prefix=H100_CUDNN_ATTENTION_PREFIX,
)
# Flash attention as the Llama 3 paper's stack runs it (FlashAttention-2, not Transformer Engine's choice)
_H100_FLASH = Rates(H100_GEMM_EFFICIENCY, H100_ATTENTION_EFFICIENCY, "benchmarks/results/gemm-shapes-h100.json")
# An H200 is an H100's SM at the same clocks with more and faster HBM: its GEMM and attention rates are
# the H100's (the executor's own rates were measured on H200s and priced H100 runs within 2-7%:
# benchmarks/results/smoke-*-h100.json).
_H200_AS_H100 = replace(_H100_MEGATRON, source="the H100's (same SM and clocks)")
_H200_FLASH_AS_H100 = replace(_H100_FLASH, source="the H100's (same SM and clocks)")
_A100 = Rates(A100_GEMM_EFFICIENCY, None, "Korthikanti et al. 2022 Table 4 (fitted)")
_EXECUTOR = Rates(None, None, "meshplan's executor measured on H200 (meshplan/costmodel/device.py)")

GPUS: tuple[GpuKind, ...] = (
    GpuKind(
        "H100",
        "h100-sxm-8",
        (
            ("megatron", _H100_MEGATRON),
            ("megatron-2021", Rates(H100_GEMM_EFFICIENCY, None, _H100_FLASH.source)),
            # Llama 3's PyTorch stack: the same cuBLAS GEMMs at layer shapes and flash attention
            ("llama3", _H100_FLASH),
            ("meshplan", Rates(None, None, "the executor's H200 rates (H100 smoke runs within 2-7%)")),
        ),
        fp8_speedup=FP8_GEMM_SPEEDUP_H100,
        fp8_source=_RATES_H100,
    ),
    GpuKind(
        "H200",
        "h200-8",
        (
            ("megatron", _H200_AS_H100),
            ("megatron-2021", Rates(H100_GEMM_EFFICIENCY, None, _H200_FLASH_AS_H100.source)),
            ("llama3", _H200_FLASH_AS_H100),
            ("meshplan", _EXECUTOR),
        ),
        fp8_speedup=FP8_GEMM_SPEEDUP_H100,  # the H100's: the same SM and tensor cores
        fp8_source=_RATES_H100 + ", the H100's",
    ),
    # Blackwell, from NVIDIA's specifications only (no B200 is lent to this project): its GEMM and
    # attention fractions are the executor's H200 defaults, its FP8 rate the datasheet's dense FP8 over
    # bf16 ratio (4.5 / 2.25 PFLOP/s on DGX B200, 5 / 2.5 on GB200 NVL72). GB200 before B200: its name
    # holds "B200".
    GpuKind("GB200", "gb200-nvl72", (), mxfp8=True, specification=True),
    GpuKind("B200", "dgx-b200-8", (), mxfp8=True, specification=True),
    GpuKind("A100", "a100-sxm-8", (("megatron", _A100), ("megatron-2021", _A100), ("deepspeed", _A100))),
    GpuKind("MI300X", "mi300x-8", ()),
    GpuKind("V100", "v100-dgx2-16", ()),
    GpuKind("A6000", "a6000-pcie-4", ()),
)


def gpu_kind(name: str) -> GpuKind | None:
    """The table's entry for a GPU named `name`, or None."""
    upper = name.upper()
    return next((g for g in GPUS if g.key in upper), None)


def rates(gpu_name: str, stack: str) -> tuple[Rates, str]:
    """(the rates `stack` achieves on the GPU named `gpu_name`, a note when they are borrowed — empty
    when the table has them)."""
    kind = gpu_kind(gpu_name)
    found = dict(kind.rates).get(stack) if kind else None
    if found is not None:
        return found, ""
    spec = ""
    if kind is not None and kind.specification:
        spec = "; its peaks are NVIDIA's datasheet figures (specification, not measurement)"
    return _EXECUTOR, (
        f"no measured rates for {gpu_name} under --stack {stack}: its GEMMs and attention are priced at the "
        f"fractions of peak meshplan's executor reached on an H200 (`meshplan calibrate` measures them){spec}"
    )


def fp8_speedup(gpu_name: str, bf16_flops: float, fp8_flops: float) -> tuple[float, str]:
    """(the FP8 linear GEMMs' rate over the bf16 GEMMs' on the GPU named `gpu_name`, a note when it is
    the datasheet's peak ratio rather than a measurement)."""
    kind = gpu_kind(gpu_name)
    if kind is not None and kind.fp8_speedup is not None:
        return kind.fp8_speedup, ""
    return fp8_flops / bf16_flops, (
        f"no measured FP8 GEMM rate for {gpu_name}: FP8 GEMMs priced at the bf16 rate times the datasheet's "
        f"dense FP8 / bf16 peak ratio ({fp8_flops / bf16_flops:.2f}; specification, not measurement)"
    )


def preset_for_device(device_name: str) -> tuple[str, str]:
    """(the cluster preset of the GPU torch names `device_name`, a note when the table does not know it:
    then an H200 node's, the GPUs the time model was calibrated on)."""
    kind = gpu_kind(device_name)
    if kind is not None:
        return kind.preset, ""
    return "h200-8", f"{device_name} is not in meshplan/hardware.py: its run is predicted as an H200's"


def replace_rates(gpu_key: str, stack: str, new: Rates) -> None:
    """Swap one entry of the table (benchmarks/published_runs.py fits the A100 rate this way)."""
    global GPUS
    GPUS = tuple(
        replace(g, rates=tuple((s, new if (g.key, s) == (gpu_key, stack) else r) for s, r in g.rates)) for g in GPUS
    )

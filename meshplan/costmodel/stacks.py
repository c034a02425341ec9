"""Which training stack a prediction assumes: its kernels' rates and its overlap rules, in one place.

The same mesh runs at different speeds under different software (what each GPU achieves under each
stack is meshplan/hardware.py's table). A stack says how the block's
elementwise work is done (eager torch ops or fused kernels), how attention's core runs (a fused flash
kernel, or Megatron's batched GEMMs around a fused softmax), which collectives hide behind compute
(tensor-parallel ones behind the GEMMs, gradient reductions behind the backward, ZeRO-3 gathers
behind the layers), how pipeline stages pass activations, and whether the host's kernel launches
floor a step. Each number carries its source; `megatron` is what a user planning a real cluster runs,
`meshplan` is this project's own executor, calibrated by its runs (docs/validation.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from meshplan.errors import MeshplanError


@dataclass(frozen=True)
class Stack:
    name: str
    summary: str
    launch_floor: bool  # the eager executor's per-kernel host cost floors each step
    elementwise_factor: float | None  # HBM passes of non-GEMM work per pass counted; None: the executor's measured
    flash_attention: bool  # fused attention kernel; False: QKᵀ and PV as batched GEMMs around a fused softmax
    tp_overlap: bool  # tensor-parallel collectives hide behind the neighbouring GEMMs
    grad_overlap: bool  # data-parallel gradient reductions hide behind the backward
    zero3_prefetch: bool  # ZeRO-3 parameter gathers run ahead, behind the layers' compute; the distributed
    # optimizer's all-gather of updated parameters runs behind the next step's forward (--overlap-param-gather)
    pp_scatter_gather: bool  # a stage sends 1/t of its activations over the network, all-gathered on NVLink
    pp_overlap: bool = False  # pipeline sends hide behind the next micro-batch's compute
    # Gradients kept in fp32 (Megatron's main_grad buffers, --accumulate-allreduce-grads-in-fp32, the
    # default under bf16: 18 B a parameter with Adam); meshplan's executor keeps them in bf16.
    grad_dtype: str = "fp32"
    # Megatron-SP on the tensor axis (Korthikanti et al. 2022 §4.2.2) unless an option says otherwise:
    # the Megatron-LM README's H100 runs use it wherever tp > 1 (benchmarks/published/megatron_readme.toml);
    # the 2021 PTD-P code predates it, and meshplan's executor does not run it.
    tp_sequence_parallel: bool = False
    # SwiGLU as one fused op that recomputes silu(gate) in its backward (Megatron's bias_swiglu_impl):
    # it saves gate and up, not silu(gate) too, as an eager torch SwiGLU does.
    fused_swiglu: bool = True
    # The pipeline schedules and data-parallel sharding the stack runs (each stack's entry names its
    # sources; meshplan.costmodel.pipeline.schedule_violation applies them): the fewest stages its
    # interleaved schedule takes (0: it has none), the highest ZeRO stage it runs, and with pp > 1.
    interleaved_min_pp: int = 0
    max_zero: int = 3
    max_zero_with_pp: int = 3
    # One micro-batch's expert all-to-alls beside another's compute (Megatron-Core 0.14's
    # --overlap-moe-expert-parallel-comm; model_chunk_schedule_plan.py interleaves a forward and a
    # backward layer by layer)
    moe_a2a_overlap: bool = False
    # Mixtures of experts under TP need Megatron-SP (MoELayer.forward's ValueError in Megatron-Core: each
    # tensor rank routes its sequence shard); False: every tensor rank routes all its tokens (meshplan's
    # executor, meshplan/executor/layouts/ep.py)
    moe_needs_tp_sequence_parallel: bool = True
    # HBM bytes the optimizer step moves for each parameter whose states the rank keeps (mixed-precision
    # Adam, bf16 gradients and weights): 40 as torch's ops run it — the gradient cast to fp32 (read 2,
    # write 4), one fused AdamW pass over the fp32 weight, gradient, m and v (read 16, write 12), the
    # bf16 copy-back (read 4, write 2) — which every stack but meshplan's is priced at; 28 for one pass
    # that reads the bf16 gradient where it lies and writes the bf16 weight (meshplan/kernels/adam.py).
    optimizer_step_bytes_per_param: float = 40.0
    # The optimizer step's rate as a fraction of the GPU's rated (datasheet) HBM bandwidth, where measured
    # (meshplan's); None: the device's HBM rate as it stands — the datasheet's, or the copy rate `meshplan
    # calibrate` measured — for the stacks whose step the model has not timed.
    optimizer_hbm_fraction: float | None = None
    # fp32 copies of the rank's largest weight matrix (memory.largest_matrix) held beside the gradients
    # during the optimizer step, over the ZeRO shards: the model's count for the stacks that step through
    # fp32 gradient copies; 0 where the step allocates nothing (meshplan/kernels/adam.py).
    optimizer_fp32_temporaries: int = 2
    # Sequence shards recompute the attention core in backward (meshplan's executor keeps only the
    # local q, k, v); Transformer Engine's context-parallel attention keeps each step's output and
    # log-sum-exp instead (AttnFuncWithCPAndKVP2P saves them for its backward), recomputing nothing.
    sequence_attention_recompute: bool = True
    # Zigzag sequence shards put the gathered K/V in position order, slice, merge and concatenate around
    # their attention kernels (meshplan's executor: blocks.attention.zigzag_motion_bytes); fused stacks
    # attend the gathered keys in place (Transformer Engine's context-parallel attention)
    zigzag_motion: bool = False
    # TSP packs its weight shards, sums the shards' partial outputs and input gradients, concatenates the
    # saved per-shard tensors and sums its LM head's fp32 logits shard by shard in torch ops (meshplan's
    # executor: axes.tsp.motion_bytes, head_motion_bytes); a stack without a TSP executor is priced without them
    tsp_motion: bool = False
    # The loss over the logits as meshplan's executor runs it on the GPU (meshplan/kernels/cross_entropy.py's three
    # passes: compute.executor_loss_bytes at device.LOSS_KERNEL_HBM_FRACTION); False: four fp32 passes a
    # direction over the logits at the device's HBM rate
    executor_loss: bool = False
    # ZeRO shards over the sequence ranks too (Megatron's distributed optimizer over its data-parallel
    # group with context parallelism, dp × cp); meshplan's executor shards over dp only.
    zero_over_sequence: bool = False
    # How attention on sequence shards (context parallelism) reaches the other shards' K/V, in Megatron's
    # names (--cp-comm-type): "allgather" gathers them before attending (Llama 3's CP, meshplan's
    # executor); "p2p" passes K/V blocks around a ring beside the attention of the block in hand
    # (Transformer Engine's AttnFuncWithCPAndKVP2P, Megatron's default); "a2a" swaps sequence for heads
    # by all-to-alls around whole-sequence attention (DeepSpeed-Ulysses; TE's AttnFuncWithCPAndQKVOA2A).
    cp_comm_type: str = "allgather"
    # FP8 GEMMs through Transformer Engine (Megatron-Core's --fp8-format): which layers take them is
    # FP8_GEMM_LAYERS' rule below; False: the stack's GEMMs are bf16 only.
    fp8: bool = False
    # A pipeline stage frees each micro-batch's output once it is sent, keeping only the autograd graph
    # that leads to it (Korthikanti et al. 2022 App. B; Megatron-Core's deallocate_output_tensor under
    # ModelParallelConfig.deallocate_pipeline_outputs): of the stage-boundary tensors only the gradient
    # received stays (memory.boundary_activation_bytes). meshplan's executor keeps every output.
    frees_stage_outputs: bool = False
    # Bytes a parameter of one sharded unit (a transformer layer) holds while the backward reduce-scatters
    # its gradients each micro-batch, ZeRO-2/3 as FSDP2 runs it (torch/distributed/fsdp/_fully_shard/
    # _fsdp_collectives.py foreach_reduce): the unit's unsharded gradients in the parameter dtype, and
    # their copy in the reduce dtype as the reduce-scatter's input, live until the next unit's
    # post-backward waits for it. 0: the stack's reductions run from its own buckets (not counted).
    unit_grad_reduce_bytes_per_param: float = 0.0
    source: str = ""
    # Which release of the stack these habits are of, and the attention kernel it runs (printed with
    # every prediction: the rates in meshplan/hardware.py are that kernel's)
    version: str = ""
    attention_kernel: str = ""
    # The run's GEMM precision under the stack ("bf16", "fp8", "mxfp8") and whether its FP8 weights are
    # gathered in FP8 (--fp8-param-gather): set per run by stack_at, not per stack.
    precision: str = "bf16"
    fp8_param_gather: bool = False
    # Per-tensor FP8 scaling (Megatron-Core --fp8-recipe): "delayed" (amax history, TE's default) or
    # "current" (each tensor's own amax, a pass over it before the cast: Float8CurrentScaling)
    fp8_recipe: str = "delayed"
    # What the GPU holds beside the caching allocator (meshplan/costmodel/runtime.py): the CUDA context
    # once the stack's kernels are loaded (0: runtime.CONTEXT_BYTES, CUDA with cuBLAS and cuDNN, a floor
    # for stacks that load more), and whether the default process group opens an NCCL communicator
    # (Megatron's initialize.py barriers on it while loading its fused kernels; a stack that runs no
    # collective there leaves it unconnected).
    cuda_context_bytes: int = 0
    default_group_nccl: bool = True


PRECISIONS = ("bf16", "fp8", "mxfp8")
FP8_RECIPES = ("delayed", "current")
CP_COMM_TYPES = ("allgather", "p2p", "a2a")

# Which GEMMs run in FP8 under Megatron-Core with Transformer Engine (--fp8-format hybrid: e4m3 forward,
# e5m2 gradients): those of TE's Linear modules — QKV and the output projection (TELayerNormColumnParallel-
# Linear, TERowParallelLinear, MLA's projections too), the MLP's fc1 and fc2, the routed experts'
# TEGroupedLinear, the shared experts, Mamba's in_proj and out_proj. In bf16: the attention core (TE's
# FP8 dot-product attention is a separate switch, --fp8-dot-product-attention, off by default), the
# router (a plain torch linear, in fp32 or bf16: --moe-router-dtype), the embedding and the output head
# (Megatron's ColumnParallelLinear, not TE's), and Mamba's scan. Megatron-Core's
# --first-last-layers-bf16 (the first and last layers' GEMMs in bf16) is not priced: every layer's
# linear GEMMs are FP8. Each block kind says whether its GEMMs are among them (BlockKind.fp8_gemms).


@functools.lru_cache(maxsize=64)
def stack_at(name: str, precision: str = "bf16", fp8_param_gather: bool = False, fp8_recipe: str = "delayed") -> Stack:
    """The stack `name` as a run runs it, at its GEMM precision and FP8 scaling (its own object, made once:
    the cost model's caches key on it)."""
    stack = get_stack(name)
    if precision == "bf16" and not fp8_param_gather:
        return stack
    return replace(stack, precision=precision, fp8_param_gather=fp8_param_gather, fp8_recipe=fp8_recipe)


# Megatron-LM's fused kernels (fused LayerNorm, bias-GeLU, bias-dropout-add, scaled masked softmax:
# Narayanan et al. 2021 §4.2; Transformer Engine since) read and write each tensor once, which is what
# the cost model's per-token byte counts assume: factor 1.
_FUSED = 1.0

STACKS: dict[str, Stack] = {
    "megatron": Stack(
        "megatron",
        "Megatron-Core with Transformer Engine (2024): fused kernels, flash attention, TP / DP / PP "
        "communication overlapped, distributed optimizer",
        launch_floor=False,
        elementwise_factor=_FUSED,
        flash_attention=True,
        tp_overlap=True,
        moe_a2a_overlap=True,
        sequence_attention_recompute=False,
        zero_over_sequence=True,
        grad_overlap=True,
        zero3_prefetch=True,
        pp_scatter_gather=True,
        pp_overlap=True,
        # Interleaving from pp = 2: Megatron-Core >= 0.8 asserts pp > 1 with --overlap-p2p-comm, which
        # arguments.py turns on by default (pp > 2 without it; NVIDIA/Megatron-LM commit 3ee489d9).
        # ZeRO: the distributed optimizer shards the optimizer states only (ZeRO-1: its full fp32
        # gradient buffer stays; docs/user-guide/features/dist_optimizer.md) and runs with pipelines;
        # gradient and parameter sharding (ZeRO-2/3) is Megatron-FSDP or torch FSDP2, and FSDP2 asserts
        # pipeline_model_parallel_size == 1 (arguments.py, core_v0.11+); Megatron-FSDP has no pipelined
        # configuration in its tests.
        interleaved_min_pp=2,
        max_zero=3,
        max_zero_with_pp=1,
        tp_sequence_parallel=True,
        fp8=True,
        # arguments.py: --cp-comm-type, default ["p2p"] (core 0.9 on; core_v0.14.0 unchanged)
        cp_comm_type="p2p",
        # megatron/training/arguments.py core_transformer_config_from_args: deallocate_pipeline_outputs = True
        frees_stage_outputs=True,
        source="NVIDIA/Megatron-LM README at 937571cfd4 (--overlap-grad-reduce --overlap-param-gather "
        "--tp-comm-overlap, PP overlap by default)",
        # NeMo 24.07 ships Megatron-Core 0.8 with TE 1.8, 25.09 core 0.14 with TE 2.7, 25.11 core 0.15 with
        # TE 2.9 (NVIDIA's 24.09 software-versions page; Megatron-Bridge docs/releases/software-versions.md)
        version="Megatron-Core 0.8-0.15 + Transformer Engine 1.8-2.9, NeMo 24.07-25.11",
        # TE's DotProductAttention picks cuDNN's fused attention over FlashAttention on sm90+ (TE v1.2 on,
        # commit 32db3928; v2.x get_attention_backend), context-parallel ring included (TE v1.3 on);
        # Megatron-Core hands attention to TE (--attention-backend auto).
        attention_kernel="cuDNN fused, Transformer Engine's pick on Hopper",
    ),
    "megatron-2021": Stack(
        "megatron-2021",
        "Megatron-LM of the PTD-P and selective-recompute papers (2021-22): fused elementwise "
        "kernels, attention as batched GEMMs with a fused softmax, no TP or DP overlap, scatter/gather PP sends",
        launch_floor=False,
        elementwise_factor=_FUSED,
        flash_attention=False,
        tp_overlap=False,
        grad_overlap=False,
        zero3_prefetch=False,
        pp_scatter_gather=True,
        # Interleaving needs pp > 2 (arguments.py's assertion, Megatron-LM commit 182841f7, 2021-03);
        # no ZeRO (the distributed optimizer came in 2022).
        interleaved_min_pp=3,
        max_zero=0,
        max_zero_with_pp=0,
        # Korthikanti et al. 2022 App. B: the stage's output is deallocated after it is sent
        frees_stage_outputs=True,
        source="Narayanan et al. 2021 §4.1-4.2 (scatter/gather, fused kernels); Korthikanti et al. 2022 §6 "
        "(gradient all-reduce not overlapped)",
        version="Megatron-LM of 2021-22 (the PTD-P and selective-recompute papers' code)",
        attention_kernel="QKᵀ and PV as batched GEMMs around a fused scaled masked softmax",
    ),
    "deepspeed": Stack(
        "deepspeed",
        "DeepSpeed ZeRO-3 inside Megatron-LM (2021): Megatron's kernels, parameter gathers "
        "prefetched behind the layers, gradient reduce-scatter behind the backward",
        launch_floor=False,
        elementwise_factor=_FUSED,
        flash_attention=False,
        tp_overlap=False,
        grad_overlap=True,
        zero3_prefetch=True,
        pp_scatter_gather=False,
        # One pipeline schedule, synchronous 1F1B (deepspeed/runtime/pipe/schedule.py TrainSchedule); its
        # PipelineEngine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
        # parallelism", deepspeed/runtime/pipe/engine.py).
        interleaved_min_pp=0,
        max_zero=3,
        max_zero_with_pp=1,
        source="Rajbhandari et al. 2020 (ZeRO) §7; Narayanan et al. 2021 §5.2 (ZeRO-3 comparison)",
        version="DeepSpeed ZeRO-3 in Megatron-DeepSpeed (2021)",
        attention_kernel="Megatron's: batched GEMMs around a fused softmax",
    ),
    "llama3": Stack(
        "llama3",
        "Meta's Llama 3 stack (2024): FSDP (ZeRO-2-like: optimizer states and gradients sharded over DP, "
        "parameters kept whole from forward to backward) with TP, PP and CP, fp32 gradient reduce-scatter "
        "behind the backward, interleaved pipeline with stage inputs and outputs freed",
        launch_floor=False,
        # Flash-attention-era fused kernels: the paper trains 8K sequences without activation
        # checkpointing (§3.3.2), which leaves no room for an s² score matrix or unfused elementwise copies.
        elementwise_factor=_FUSED,
        flash_attention=True,
        # TP as Megatron's (Shoeybi et al. 2019, the paper's TP) with sequence parallelism on the norms, as
        # torchtitan's Llama 3 TP plan shards them (torchtitan/models/llama3/infra/parallelize.py apply_tp:
        # SequenceParallel on attention_norm / ffn_norm); the paper describes no TP overlap.
        tp_overlap=False,
        tp_sequence_parallel=True,
        # "we use FP32 gradient accumulation during backward computation over multiple micro-batches and
        # also reduce-scatter gradients in FP32 across data parallel workers in FSDP" (§3.3.2, numerical
        # stability); FSDP issues each unit's reduce-scatter from its post-backward hook, behind the
        # backward of the units before it.
        grad_dtype="fp32",
        grad_overlap=True,
        unit_grad_reduce_bytes_per_param=2 + 4,  # bf16 unsharded gradients + their fp32 reduce-scatter input
        # FSDP prefetches the next unit's all-gather of the updated parameters in the forward; "for model
        # shards we do not reshard after forward computation to avoid an extra all-gather communication
        # during backward passes" (§3.3.2): ZeRO-2-like under pipelining, no re-gather in the backward.
        zero3_prefetch=True,
        max_zero=3,
        max_zero_with_pp=2,
        # "we adopt asynchronous point-to-point communication in PP" (§3.3.2); whole activations are sent.
        pp_scatter_gather=False,
        pp_overlap=True,
        # "we use an interleaved schedule (Narayanan et al., 2021) with V pipeline stages on one pipeline
        # rank" (§3.3.2). Its schedule also runs micro-batch counts that are not a multiple of pp (their
        # Figure 6, N = 5); schedule_violation applies Megatron's N = p rule, which the 405B's 8K runs
        # (16 stages, 32 micro-batches a step: Table 4's batch size / DP) satisfy.
        interleaved_min_pp=2,
        # "we proactively deallocate tensors that will not be used for future computation, including the
        # input and output tensors of each pipeline stage" (§3.3.2)
        frees_stage_outputs=True,
        # Context parallelism all-gathers K and V before attending (§3.3.2: "all-gather based")
        cp_comm_type="allgather",
        source="Llama Team, The Llama 3 Herd of Models (arXiv 2407.21783) §3.3.2 and Table 4",
        version="Meta's Llama 3 pre-training stack (2024, as the paper describes it)",
        # The paper names no attention kernel; priced at FlashAttention-2's measured rate.
        attention_kernel="FlashAttention-2",
    ),
    "meshplan": Stack(
        "meshplan",
        "meshplan's own executor (eager PyTorch, torch SDPA, Triton kernels for norms and Mamba-2), "
        "calibrated by its runs on H200s",
        launch_floor=True,
        elementwise_factor=None,
        flash_attention=True,
        zigzag_motion=True,
        tsp_motion=True,
        executor_loss=True,
        tp_overlap=False,
        grad_overlap=True,
        zero3_prefetch=False,
        pp_scatter_gather=False,
        grad_dtype="bf16",
        fused_swiglu=True,  # executor.experts.SwiGLUFn keeps [gate; up], recomputing silu(gate)
        moe_needs_tp_sequence_parallel=False,
        # optim.MixedAdam / ZeroAdam step each parameter as one Triton kernel on the GPU
        # (meshplan/kernels/adam.py): the bf16 gradient (or its reduce-scattered shard) read where it
        # lies, fp32 weight, m and v read and written, the bf16 weight written into the parameter (or the
        # slice the ZeRO all-gather fills around in place) — 2 + 12 + 12 + 2 B a parameter and no fp32
        # temporaries. (A weight whose size is not a multiple of the ZeRO group gathers into a padded
        # bf16 buffer of its size instead, up to three at once; every matrix of the presets divides by
        # power-of-two groups, so that is not priced.)
        optimizer_step_bytes_per_param=28.0,
        # The executor's first run in a process held 769-841 MiB beside the allocator before any NCCL
        # buffer (median 823: CUDA, cuBLAS, cuDNN and its Triton kernels' modules;
        # benchmarks/results/s22-h200x4/, each file's first run, and s22-h200x2-execute's single run, 839);
        # its workers report through files, so the default group never connects (the same runs: a
        # standalone tp=2 run held one communicator's buffers).
        cuda_context_bytes=823 * 2**20,
        default_group_nccl=False,
        # The kernel runs at the GPU's copy rate (0.96-1.00 of it on the large weights): 4.15 TB/s of the
        # rated 4.8 on an H200 (0.865; 0.84 at 134M elements) and 2.98 of 3.35 on an H100 (0.89; 0.86 at
        # 134M), benchmarks/results/adam-h200.json and adam-h100.json (`python benchmarks/bench_adam.py`) — a
        # fraction of the rated rate, so a calibrated profile's measured copy rate does not count it twice.
        optimizer_hbm_fraction=0.86,
        optimizer_fp32_temporaries=0,
        # The executor's pipeline runs 1F1B only (meshplan/executor/pipeline.py), with ZeRO 0-3.
        interleaved_min_pp=0,
        source="docs/validation.md; the constants of meshplan/costmodel/device.py and costmodel/blocks/",
        version="meshplan's executor at this commit",
        attention_kernel="cuDNN fused through torch SDPA (a shard's two blocks merged by log-sum-exp)",
    ),
}
DEFAULT_STACK = "megatron"


def get_stack(name: str) -> Stack:
    try:
        return STACKS[name]
    except KeyError:
        raise MeshplanError(f"--stack: unknown {name!r}; use one of {', '.join(STACKS)}") from None

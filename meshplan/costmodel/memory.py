"""Per-GPU memory for a model, layout and shape (docs/design.md §3).

    total = kept + the largest of three moments
    kept      = parameters + optimizer state + KV / SSM caches
    layer     = saved activations + gradients present + one layer's working set + gathered K/V
                + in-flight TSP shards + ZeRO-3 gathers
    logits    = saved activations + gradients present + the logits (and the loss's log-softmax)
    optimizer = all gradients + the step's fp32 temporaries of the largest matrix
Gradients present at the activation peak: all of them with gradient accumulation (pipelining), else
only the last block's — gradients are set to None after each step and rebuilt during backward.

Pipeline parallelism: the first stage holds `pp` micro-batches of activations in flight (1F1B,
Korthikanti et al. 2022 §4.2.3), the last stage holds the output head and the logits; the larger of
the two is reported.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from meshplan.costmodel.activations import Saved, checkpoint_units, head_saved
from meshplan.costmodel.axes import PlanContext, Sharding, own_shardings, plan_context, sharding_for, sp, tp
from meshplan.costmodel.axes.dp import expert_zero_stage, zero_stage
from meshplan.costmodel.axes.pp import extra_copy_params
from meshplan.costmodel.blocks import BLOCKS, block_params, block_saved, streamed_block_params
from meshplan.costmodel.blocks.hybrid_proj import tensor_replicated_hybrid_params
from meshplan.costmodel.blocks.moe import tensor_replicated_params
from meshplan.costmodel.options import MemoryOptions
from meshplan.costmodel.pipeline import StageLayout, in_flight_chunks, in_flight_peak, rank_block_counts, stage_layout
from meshplan.costmodel.shapes import local_bc_channels
from meshplan.costmodel.stacks import Stack
from meshplan.layout import Layout, grad_group, validate_layout, validate_seq
from meshplan.models import ModelSpec

ADAM_STATE_BYTES_PER_PARAM = 12  # fp32 master weights + Adam m + v (ZeRO, Rajbhandari et al. 2020 §3)
ADAM_STATE_BYTES_FP32_PARAMS = 8  # m + v only: fp32 weights are their own master copy
# cuBLAS/cuBLASLt workspace per handle, taken from the caching allocator: 32 MiB on Hopper (PyTorch's
# default since pytorch/pytorch#120925). Measured on H200, torch 2.11: 32 MiB in prefill and decode,
# 64 MiB in training, whose backward runs on the autograd engine's own thread and handle
# (`blas_workspace_bytes` in benchmarks/results/validation-h200-run17-x4-triton-norm.json). Older
# GPUs get 4 MiB or less, so this over-counts them by under 60 MiB.
BLAS_WORKSPACE_BYTES = 32 * 2**20
# Transformer Engine's FP8 copies of a weight its FP8 GEMMs read, bytes an element, kept from the first
# micro-batch of a step to the last (TE's Linear caches its weight workspaces while Megatron passes
# is_first_microbatch; NVIDIA/TransformerEngine transformer_engine/pytorch/module/linear.py):
# - fp8 (per-tensor scales): the FP8 weight and its FP8 transpose (Hopper's FP8 GEMMs take only the TN
#   layout, so the backward's dgrad reads the transpose), 1 + 1; Blackwell's take every layout and TE
#   may keep no transpose there: over-counted by 1 B a weight on B200/GB200;
# - mxfp8: row-wise and column-wise MXFP8 copies (the scale blocks run along the contraction, which
#   differs between forward and backward), each 1 B + an E8M0 scale a 32 elements;
# - fp8 with --fp8-param-gather: the weight itself is FP8 (TE's fp8_model_init: 1 B in `parameters`, not
#   2), and only its transpose is extra.
# Per-tensor scaling state (a scale, its inverse and an amax history an FP8 tensor, fp32; Megatron's
# --fp8-amax-history-len defaults to 1) is under 100 bytes a GEMM: not counted.
FP8_WEIGHT_COPY_BYTES = {"fp8": 2.0, "mxfp8": 2 * (1 + 1 / 32)}
FP8_PARAM_GATHER_COPY_BYTES = 1.0  # the transpose beside an FP8 parameter

COMPONENTS = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "kv_cache",
    "ssm_state_cache",
    "transient_working",
    "transient_kv_gather",
    "transient_weight_shards",
    "transient_comm_buffers",
    "transient_logits",
    "blas_workspace",
    "int8_peer_buffer",
    "fp8_weights",
)


@dataclass(frozen=True)
class MemoryBreakdown:
    per_gpu_bytes: dict[str, int]  # COMPONENTS → bytes
    total_bytes: int
    peak_phase: str  # "layer", "logits" or "optimizer": the moment that decides the peak
    pipeline_stage: str  # "only", "first" or "last": the stage reported
    assumptions: dict = field(default_factory=dict)
    # COMPONENTS → bytes held at the peak moment (peak_phase): they sum to total_bytes, where
    # per_gpu_bytes gives each component at its own largest, moments that need not coincide.
    at_peak_bytes: dict[str, int] = field(default_factory=dict)


def _split_div(split: str, sh: Sharding, ngroups: int) -> int:
    if split == "heads":
        return sh.head_div
    if split == "groups":
        return math.gcd(sh.head_div, ngroups)
    return sh.hidden_div


def _saved_bytes(
    items: list[Saved], tokens: float, keys: int, sh: Sharding, ngroups: int = 1, opts: MemoryOptions | None = None
) -> float:
    """Bytes of `items` on one GPU for `tokens` tokens (all sequences of the micro-batch); `opts`: drop
    what its selective recompute rebuilds (Saved.dropped)."""
    total = 0.0
    for item in items:
        if opts is not None and item.dropped(opts):
            continue
        div = sh.token_div * _split_div(item.split, sh, ngroups)
        total += tokens * item.bytes_per_token * (keys if item.quadratic else 1) / div
    return total


def _block_bytes(
    model: ModelSpec,
    opts: MemoryOptions,
    kind: str,
    tokens: float,
    keys: int,
    sh: Sharding,
    by_kind: dict | None,
    groups: int = 1,
    selective: bool = False,
) -> float:
    """What one `kind` block saves for `tokens` tokens on one rank: under its own sharding where an
    axis splits it apart (`by_kind`, PlanContext's), at the busiest rank's load (the routed experts'
    copies under uneven routing or a capacity); `selective`: less what selective recompute rebuilds."""
    own = by_kind.get(kind, sh) if by_kind else sh
    load = BLOCKS[kind].load(opts)
    dropping = opts if selective else None
    return _saved_bytes(list(block_saved(kind, model, opts)), tokens * load, keys, own, groups, dropping)


def saved_activation_bytes(
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    opts: MemoryOptions,
    *,
    layers_fraction: float = 1.0,
    sh: Sharding | None = None,
    by_kind: dict | None = None,
) -> tuple[float, float]:
    """(bytes saved for backward by the layers on one GPU, bytes backward rebuilds at once: the largest
    unit's full set under full recompute, its whole-recomputed blocks' under selective).

    The second is the working set of one layer: what a layer's forward keeps alive, and what its
    backward allocates again as gradients (and what full recompute rebuilds). `sh`, `by_kind`: the
    layout's sharding and the kinds' own (PlanContext's) when the caller has them.
    """
    if sh is None:
        sh = sharding_for(layout, opts)
        by_kind = own_shardings(model, layout, opts, sh)
    tokens = batch * seq
    e = opts.nbytes("act_dtype")
    groups = model.mamba2.ngroups if model.mamba2 is not None else 1
    saved = 0.0
    largest = 0.0
    for blocks, count, width in checkpoint_units(model):
        per_block = {kind: _block_bytes(model, opts, kind, tokens, seq, sh, by_kind, groups) for kind in blocks}
        full = sum(per_block.values())
        if opts.recompute == "selective":
            # What backward rebuilds at once: the blocks a recompute module checkpoints whole (Megatron's
            # moe, mlp, shared_experts), their saved set (Saved.dropped), before their backward runs
            full = sum(v for kind, v in per_block.items() if rebuilt_whole(kind, opts))
        largest = max(largest, full)
        runs = math.ceil(count * layers_fraction)
        if sh.token_div > 1 and opts.recompute != "full":
            # A sequence shard keeps the conv tail and SSM state it started from, and every shard's
            # summary it built that state from (per sequence).
            saved += runs * sum(
                BLOCKS[kind].boundary_bytes(model, batch, sh.head_div, opts, sh.token_div) for kind in blocks
            )
        if opts.recompute == "full":
            saved += runs * tokens * e * width / (sh.token_div * sh.hidden_div)
        else:
            selective = opts.recompute == "selective"
            saved += runs * sum(
                _block_bytes(model, opts, kind, tokens, seq, sh, by_kind, groups, selective) for kind in blocks
            )
    return saved, largest


def _largest_block_share(model: ModelSpec) -> float:
    """The largest block's share of the layer parameters (whose gradients exist as backward starts)."""
    return max(block_params(model, k) for k, _ in model.block_invocations()) / model.layer_params()


def largest_matrix(model: ModelSpec, sh: Sharding) -> float:
    """Elements of the largest weight matrix one rank holds (the size of the optimizer step's fp32
    temporaries: Stack.optimizer_fp32_temporaries)."""
    sizes = []
    if model.mlp is not None:
        sizes.append(model.mlp.n_input_matrices * model.mlp.ffn_hidden * model.mlp.hidden / sh.weight_div)
    if model.attention is not None:
        sizes.append(model.attention.largest_projection() / sh.weight_div)
    if model.mamba2 is not None:
        sizes.append(model.mamba2.in_proj_width * model.d_model / sh.weight_div)
    if model.mamba1 is not None:
        sizes.append(2 * model.mamba1.d_inner * model.d_model / sh.weight_div)
    if model.moe is not None:
        sizes.append(model.moe.n_input_matrices * model.moe.expert_ffn * model.moe.hidden / sh.weight_div)
    return max(sizes)


def _widest_gradient(model: ModelSpec, kind: str, sh: Sharding, seq: int, batch: int, opts: MemoryOptions) -> float:
    """Bytes of the widest per-token activation of a `kind` block (`sh`: its own sharding) — its
    gradient is the backward's first big buffer."""
    groups = model.mamba2.ngroups if model.mamba2 is not None else 1
    tokens = batch * seq * BLOCKS[kind].load(opts)
    items = [item for item in block_saved(kind, model, opts) if not item.quadratic]
    return max((_saved_bytes([item], tokens, seq, sh, groups) for item in items), default=0.0)


def _block_backward_bytes(model: ModelSpec, kind: str, sh: Sharding, seq: int, batch: int, opts: MemoryOptions):
    """The peak inside one `kind` block's backward (`sh`: its own sharding): the phases it lists itself
    (Mamba-2's, blocks.mamba2.mixer_backward_bytes), else its widest gradient buffer."""
    own = BLOCKS[kind].backward_transient_bytes(model, batch * seq, sh, opts.nbytes("act_dtype"), batch)
    return _widest_gradient(model, kind, sh, seq, batch, opts) if own is None else own


def _boundary_bytes(model: ModelSpec, sh: Sharding, tokens: float, opts: MemoryOptions) -> float:
    """One layer-boundary activation (tokens × d_model) as one rank holds it."""
    return tokens * opts.nbytes("act_dtype") * model.d_model / (sh.token_div * sh.hidden_div)


def _backward_layer_bytes(
    model: ModelSpec, sh: Sharding, tokens: float, opts: MemoryOptions, unit_full: float
) -> float:
    """What every phase of a layer's backward holds: its input, output and output gradient, and under
    recompute the unit's (or its whole-recomputed blocks') rebuilt activations."""
    return 3 * _boundary_bytes(model, sh, tokens, opts) + (unit_full if opts.recompute != "none" else 0.0)


def rebuilt_whole(kind: str, opts: MemoryOptions) -> bool:
    """Selective recompute checkpoints the `kind` block whole (a recompute module it lists covers it)."""
    return any(opts.recomputes(m) for m in BLOCKS[kind].recompute_modules)


def _working_bytes(
    model: ModelSpec,
    sh: Sharding,
    seq: int,
    batch: int,
    opts: MemoryOptions,
    unit_full: float,
    kv_gather: float = 0.0,
    by_kind: dict | None = None,
) -> float:
    """Transient activations on top of what is kept.

    Forward (prefill, decode): the live set of the widest block — its inputs and intermediates (the
    tensors training would save) and its output; an attention block's includes the gathered K/V
    (`kv_gather`), which are gone before the MLP runs. Training: the layer's input, output and output
    gradient plus, for the block whose backward holds the most, its widest gradient buffer — or, for a
    Mamba-2 block, the phases of its backward, which list their own gradients (`_block_backward_bytes`);
    full recompute rebuilds one unit's activations first."""
    e = opts.nbytes("act_dtype")
    tokens = batch * seq
    groups = model.mamba2.ngroups if model.mamba2 is not None else 1
    if opts.training:
        inner = max(
            (
                _block_backward_bytes(model, kind, (by_kind or {}).get(kind, sh), seq, batch, opts)
                for kind, _ in model.block_invocations()
            ),
            default=0.0,
        )
        return _backward_layer_bytes(model, sh, tokens, opts, unit_full) + inner
    live = 0.0
    for kind, _ in model.block_invocations():
        b = BLOCKS[kind]
        block = _block_bytes(model, opts, kind, tokens, seq, sh, by_kind, groups)
        live = max(
            live,
            block
            + tokens * e * b.output_width(model) / (sh.token_div * sh.hidden_div)
            + b.forward_transient_bytes(model, tokens, sh, e, decode=opts.mode == "decode", rows=batch)
            + (kv_gather if b.attends else 0.0),
        )
    return live


def _stage_params(model: ModelSpec, pp: int, stage: str, layer_share: float | None = None) -> float:
    """Parameters held by one pipeline stage (before any sharding); `layer_share`: its share of the
    layers (1/pp unless the stages are uneven)."""
    if pp == 1:
        return model.param_count()
    layer = model.layer_params() * (1 / pp if layer_share is None else layer_share)
    vocab_matrix = model.vocab * model.d_model
    if stage == "first":
        return layer + vocab_matrix + model.position_params()
    if stage == "last":
        # The output head (for tied embeddings Megatron keeps a copy there) and the final norm.
        return layer + vocab_matrix + model.norm_elements * model.d_model
    return layer


def replicated_group_params(model: ModelSpec, head_div: int) -> float:
    """Extra parameters per rank when TP splits Mamba-2 heads finer than its B/C groups: the B/C
    columns of in_proj (and their conv channels) are held by every rank whose heads use the group."""
    m = model.mamba2
    if m is None or head_div == 1:
        return 0.0
    per_layer = 2 * m.ngroups * m.d_state * (m.d_model + m.d_conv + 1)
    layers = dict(model.block_invocations()).get("mamba2", 0)  # a mixed model's Mamba-2 layers
    return layers * per_layer * (1 / math.gcd(head_div, m.ngroups) - 1 / head_div)


def replicated_latent_params(model: ModelSpec, head_div: int) -> float:
    """Extra parameters per rank when TP splits MLA's heads: its down-projections stay whole on every
    tensor rank (models.AttentionSpec.down_projection_params)."""
    if model.attention is None or not model.attention.mla or head_div == 1:
        return 0.0
    return model.attention_layers * model.attention.down_projection_params() * (1 - 1 / head_div)


def local_params(
    model: ModelSpec,
    sh: Sharding,
    *,
    pp: int = 1,
    stage: str = "only",
    embeddings: bool = True,
    layer_share: float | None = None,
    by_kind: dict | None = None,
) -> float:
    """Parameters one rank holds: split weights / weight_div, plus the replicated norm scales,
    (TP-SSM with fewer B/C groups than ranks) the replicated B/C projections, (TP on MLA) the
    replicated latent down-projections and (TP on MoE) the routers. `layer_share`: the
    stage's share of the layers (1/pp unless the stages are uneven). `by_kind`: the block kinds an
    axis splits apart (PlanContext.by_kind), each held at its own split."""
    share = 1 / pp if layer_share is None else layer_share
    total = _stage_params(model, pp, stage, share) if embeddings else model.layer_params() * share
    norms = model.norm_params(embeddings) * share if sh.weight_div > 1 else 0.0
    held = (total - norms) / sh.weight_div + norms + replicated_group_params(model, sh.head_div) * share
    held += replicated_latent_params(model, sh.head_div) * share
    held += tensor_replicated_params(model, sh.head_div) * share
    held += tensor_replicated_hybrid_params(model, sh.head_div) * share
    for kind, own in (by_kind or {}).items():
        # These blocks' weights (less their norm scales, counted above) at their own split.
        held += share * _kind_weights(model, kind) * (1 / own.weight_div - 1 / sh.weight_div)
    return held


def fp8_weight_elements(model: ModelSpec, counts: dict[str, int], sh: Sharding, by_kind: dict | None = None) -> float:
    """Elements of the FP8 GEMMs' weights (BlockKind.fp8_weight_params) one rank holds for a stage that
    runs `counts` invocations of each block kind, each kind at its own split; a shared block (Zamba2's)
    once for each copy held. The replicated parts of a split (MLA's latent down-projections, Mamba-2's
    B/C columns under TP) are counted as split: a few percent of those blocks."""
    shared = set(model.shared_block_kinds())
    held = 0.0
    for kind, n in counts.items():
        copies = min(model.shared_blocks, n) if kind in shared else n
        held += copies * BLOCKS[kind].fp8_weight_params(model) / (by_kind or {}).get(kind, sh).weight_div
    return held


def _fp8_weight_bytes(
    model: ModelSpec, opts: MemoryOptions, counts: dict[str, int], sh: Sharding, by_kind, shards: int
) -> tuple[float, float]:
    """(bytes of a rank's FP8 weight copies, bytes its parameters save when they are FP8 themselves under
    --fp8-param-gather), over the ZeRO-3 shards `shards` as parameters are (FP8_WEIGHT_COPY_BYTES)."""
    if opts.precision == "bf16":
        return 0.0, 0.0
    elements = fp8_weight_elements(model, counts, sh, by_kind) / shards
    if opts.fp8_param_gather:
        return elements * FP8_PARAM_GATHER_COPY_BYTES, elements * (model.param_bytes_per_element - 1)
    return elements * FP8_WEIGHT_COPY_BYTES[opts.precision], 0.0


def _kind_weights(model: ModelSpec, kind: str) -> int:
    """The weights of every `kind` block of the model, less their norm scales (replicated, never split)."""
    n = dict(model.block_invocations()).get(kind, 0)
    return n * (BLOCKS[kind].params(model) - BLOCKS[kind].norm_width(model))


def split_apart_params(model: ModelSpec, by_kind: dict | None, kind: str, share: float = 1.0) -> float:
    """A rank's parameters of the `kind` blocks an axis splits apart (PlanContext.by_kind; 0 when none
    does), for a stage holding `share` of the layers."""
    if not by_kind or kind not in by_kind:
        return 0.0
    return share * _kind_weights(model, kind) / by_kind[kind].weight_div


def zero_sharded(
    model: ModelSpec,
    layout: Layout,
    params: float,
    by_kind: dict | None,
    share: float,
    *,
    from_stage: int,
    stack: Stack | None = None,
) -> float:
    """What of a rank's `params` (a stage holding `share` of the layers) it keeps under ZeRO from
    `from_stage` on (1: optimizer states, 2: + gradients, 3: + parameters): the gradient group's share
    (meshplan.layout.grad_group), and the routed experts' over the expert-data-parallel ranks
    (Layout.expert_data_degree: a stage's tp·sp·dp / (etp·ep)) — there even without data parallelism,
    as Megatron's distributed optimizer shards the experts over their own data-parallel group."""
    experts = split_apart_params(model, by_kind, "experts", share)
    dense = params - experts
    if zero_stage(layout, stack) >= from_stage:
        dense /= grad_group(layout)[1]
    if expert_zero_stage(layout) >= from_stage:
        experts /= layout.expert_data_degree
    return dense + experts


def mean_local_params(
    model: ModelSpec, sh: Sharding, pp: int = 1, embeddings: bool = True, by_kind: dict | None = None
) -> float:
    """A rank's parameters averaged over the pipeline stages (the first holds the embedding, the last
    the output head — a copy of the embedding when tied — and the final norm): what the executor's
    ranks hold on average, and what a step's collectives over them move per rank on average."""
    whole = local_params(model, sh, embeddings=embeddings, by_kind=by_kind)
    if pp > 1 and embeddings and model.tied_embeddings:
        whole += model.vocab * model.d_model / sh.weight_div
    whole += extra_copy_params(model, pp, sh.weight_div)  # a Zamba2's shared copies on several stages
    return whole / pp


def memory_per_gpu(
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    opts: MemoryOptions = MemoryOptions(),
    *,
    num_gpus: int | None = None,
    embeddings: bool = True,
    ctx: PlanContext | None = None,
) -> MemoryBreakdown:
    """Per-GPU bytes by component. `seq` is the context length (prompt + cache in decode), `batch`
    the micro-batch in sequences. `embeddings=False`: the bare layer stack the executor runs (no
    embedding, LM head or logits). In phases (docs/design.md §3): what every pipeline stage shares —
    the inference caches, the layer phase's transients, the logits — then each stage's model states
    and activations at its fullest moment, and the fullest stage."""
    if ctx is None:  # a plan its caller has not checked and sharded
        validate_layout(layout, model, num_gpus)
        validate_seq(layout, seq, batch)
        ctx = plan_context(model, layout, seq, batch, opts)
    sh = ctx.sharding
    train = opts.training
    zero = zero_stage(layout, opts.stack_spec)
    pp = layout.pp
    placed = stage_layout(model.layers, pp, opts, model.mtp_layers)
    stage_layers = placed.stage_layers
    microbatches = opts.steps_for(layout.dp, pp, batch) if train else 1
    chunks = opts.chunks if pp > 1 else 1
    # Saved activations of an even stage (1/pp of the layers); an uneven one scales by its layers.
    saved_all, unit_full = saved_activation_bytes(
        model, layout, seq, batch, opts, layers_fraction=1.0 / pp, sh=sh, by_kind=ctx.by_kind
    )
    step_tokens = 1 if opts.mode == "decode" else seq
    shared = _Shared(
        caches=(0.0, 0.0) if train else _inference_caches(model, layout, seq, batch, sh, opts),
        layer=_layer_transients(model, layout, seq, batch, sh, opts, unit_full, zero, ctx.by_kind),
        logits=_logits_transient(model, layout, seq, batch, sh, opts, embeddings),
        saved_all=saved_all,
        head_items=head_activation_bytes(model, sh, seq, batch, opts) if train and embeddings else 0.0,
        peer_buffer=tp.int8_peer_buffer_bytes(model, layout, opts, batch * step_tokens / sh.token_div),
    )
    results = [
        _stage_peak(
            model,
            layout,
            seq,
            batch,
            opts,
            sh,
            shared,
            index=index,
            stage_layers=stage_layers,
            microbatches=microbatches,
            chunks=chunks,
            embeddings=embeddings,
            by_kind=ctx.by_kind,
            chunk_layers=placed.chunk_layers,
        )
        for index in (
            range(pp)  # chunks that differ: any rank may hold the most
            if placed.uneven_chunks
            else _stages_to_check(
                stage_layers,
                pp,
                microbatches,
                chunks,
                None if model.uniform_layers else model.stage_block_counts(stage_layers),
            )
        )
    ]
    total, stage, phase, parts, at_peak = max(results, key=lambda r: r[0])
    return MemoryBreakdown(
        per_gpu_bytes={k: int(round(v)) for k, v in parts.items()},
        at_peak_bytes=_rounded_to(at_peak, int(round(total))),
        total_bytes=int(round(total)),
        peak_phase=phase,
        pipeline_stage=stage,
        assumptions={
            **opts.as_dict(),
            "pipeline_schedule": (opts.schedule if pp > 1 else "none"),
            "zero_stage": zero,
            "microbatches": microbatches,
            "stage_layers": list(stage_layers),
        },
    )


@dataclass(frozen=True)
class _Shared:
    """What every pipeline stage of one plan has in common: the inference caches (KV, SSM state), the
    layer phase's transients (_layer_transients), the logits phase's, the saved activations of an even
    stage, what the head saves, the int8 all-reduce's peer buffer."""

    caches: tuple[float, float]
    layer: dict
    logits: float
    saved_all: float
    head_items: float
    peer_buffer: float


def _inference_caches(
    model: ModelSpec, layout: Layout, seq: int, batch: int, sh: Sharding, opts: MemoryOptions
) -> tuple[float, float]:
    """(KV cache, SSM state cache) bytes a rank keeps for inference: K/V per attention invocation, conv
    + SSM state per Mamba layer."""
    kv_cache = ssm_cache = 0.0
    if model.attention is not None:
        # Sliding-window layers keep only the window's keys (transformers' sliding-window cache).
        windowed = model.windowed_share(seq) * model.attention_layers
        kept = (model.attention_layers - windowed) * seq + windowed * model.attention_window
        # MLA caches its latent, which every tensor rank keeps whole (AttentionSpec.kv_cache_width).
        cache_head_div = sh.head_div if model.attention.kv_cache_split_by_heads else 1
        kv_cache = (
            kept
            / layout.pp
            * batch
            * model.attention.kv_cache_width
            * opts.nbytes("kv_cache_dtype")
            / (sh.token_div * cache_head_div)
        )
    m = model.mamba2 or model.mamba1
    if m is not None:
        # Per sequence and layer: conv state (channels × (d_conv − 1)) and the SSM state.
        if model.mamba2 is not None:
            conv_ch = m.d_inner / sh.head_div + local_bc_channels(m, sh.head_div)
            ssm_elems = m.nheads * m.headdim * m.d_state / sh.head_div
        else:
            conv_ch, ssm_elems = m.d_inner / sh.head_div, m.d_inner * m.d_state / sh.head_div
        per_seq = conv_ch * (m.d_conv - 1) * opts.nbytes("act_dtype") + ssm_elems * opts.nbytes("ssm_state_dtype")
        ssm_cache = (model.mamba_layers / layout.pp) * batch * per_seq
    return kv_cache, ssm_cache


def _layer_transients(
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    sh: Sharding,
    opts: MemoryOptions,
    unit_full: float,
    zero: int,
    by_kind: dict | None = None,
) -> dict:
    """The layer phase's transients beside the saved activations: one layer's working set ("working"),
    the gathered K/V ("kv_gather"), the backward's attention moment ("attention_phase"), TSP's
    streamed weights ("weight_shards"), ZeRO 3's gathered layers and an FSDP unit's gradients on their way
    to the reduce-scatter ("comm_buffers")."""
    train = opts.training
    p_bytes = model.param_bytes_per_element
    kv_gather = 0.0
    if sh.gathers_kv and model.attention is not None and opts.mode != "decode":
        attn, act = model.attention, opts.nbytes("act_dtype")
        kv_gather = batch * seq * attn.kv_pair_width * act / sh.head_div
        comm = sp.exchange(layout, opts)
        if comm == "p2p":
            # A ring holds the K/V block in hand and the one arriving (TE's AttnFuncWithCPAndKVP2P's two
            # communication buffers), not the whole sequence's
            kv_gather *= 2 / layout.sp
        elif comm == "a2a":
            # The whole sequence's Q, K, V and output for a rank's share of the heads
            widths = attn.q_width + attn.kv_pair_width + attn.out_width
            kv_gather = batch * seq * widths * act / sh.head_div / layout.sp
        if train:
            kv_gather *= 2  # the gradients of what is held, before they go back
    step_tokens = 1 if opts.mode == "decode" else seq
    working = _working_bytes(model, sh, step_tokens, batch, opts, unit_full, 0.0 if train else kv_gather, by_kind)
    attention_phase = backward_working = mlp_saved = 0.0
    if train and kv_gather:
        # The backward reaches a layer's attention after its MLP, whose saved tensors are freed by then:
        # the gathered K/V and their gradients stand beside the layer's input, output and output
        # gradient, not beside the MLP's first gradient buffer. On 4 H200s at 64K tokens, SP and TSP
        # peak in the MLP's backward with the K/V gather long gone
        # (benchmarks/results/memory-peak-4xh200.json); charging both at once over-predicted them by 9-14% at 64K-256K
        # (memory-curves-4xh200-run16.json).
        mlp_saved = _saved_bytes(block_saved("mlp", model, opts), batch * seq, seq, sh, 1) if model.mlp else 0.0
        backward_working = _backward_layer_bytes(model, sh, batch * seq, opts, unit_full)
        attention_phase = backward_working + kv_gather - mlp_saved
    block_kinds = [k for k, _ in model.block_invocations()]
    own = by_kind or {}
    # A rank's largest block, each kind under its own sharding (the routed experts split by etp·ep)
    largest_block = max(block_params(model, k) * sh.weight_div / own.get(k, sh).weight_div for k in block_kinds)
    # What TSP streams: every kind but those an axis splits apart (the experts, under ep)
    streamed = [k for k in block_kinds if own.get(k, sh).streams_weights]
    largest_streamed = max((streamed_block_params(model, k) for k in streamed), default=0)
    weight_shards = 0.0
    if sh.streams_weights and model.mamba_layers:
        # A Mamba-2 block gathers every shard of its weights before its mixer runs, in forward and again
        # in backward (meshplan/executor/layouts/tsp_mamba.py): the whole block's weights stand beside
        # the mixer's transients (the ring's rows and the packed shard are freed by then: the replayed
        # training peak, memory-peak-mamba2-train-tsp2-h200.json). A decode step's peak is the
        # unpacking, where the ring's rows and the whole weights stand together before the step's own
        # tensors exist (0.30 GiB measured at tsp=2: validation-h200-run67-x2-mamba2-tsp.json).
        block = largest_streamed * p_bytes
        weight_shards = max(2 * block - working, block) if opts.mode == "decode" else block
    elif sh.streams_weights:
        shard = largest_streamed / sh.weight_div  # TSP: D shards
        # The rank's own shard packed for sending, the shard in use and the one arriving (the backward's
        # ring again: its own packed copy, the shard in hand, the next).
        weight_shards = 3 * shard * p_bytes
        if train:
            # Every rank's partial gradients of all D shards of the block, each hop's written straight
            # into its row, until their reduce-scatter (meshplan/executor/layouts/tsp.py, _TSPMlpFn.backward).
            # Until session 24 each hop's gradients and the row they were packed into stood beside these
            # (three more shards, memory-peak-4xh200.json); without them the whole dense-7b 2-layer tsp=2
            # step peaks at 6.99 / 9.82 GiB at 4K / 16K (benchmarks/results/s24-h200x2-reduce-scatter/).
            weight_shards += largest_streamed * opts.nbytes("grad_dtype")
    comm_buffers = 0.0
    if zero == 3:
        comm_buffers = 2 * largest_block / sh.weight_div * p_bytes  # gathered layer + the prefetched next one
    if train and zero >= 2 and opts.stack_spec.unit_grad_reduce_bytes_per_param:
        # One sharded unit's gradients on their way to the reduce-scatter (Stack.unit_grad_reduce_bytes_per_param):
        # a transformer layer, the unit FSDP wraps (torchtitan's apply_fsdp shards each TransformerBlock).
        unit = model.layer_params() / model.layers / sh.weight_div
        comm_buffers += unit * opts.stack_spec.unit_grad_reduce_bytes_per_param
    return {
        "working": working,
        "kv_gather": kv_gather,
        "attention_phase": attention_phase,
        "attention_working": backward_working,  # the attention phase's pieces, for at_peak_bytes
        "attention_mlp_freed": mlp_saved,
        "weight_shards": weight_shards,
        "comm_buffers": comm_buffers,
    }


def _logits_transient(
    model: ModelSpec, layout: Layout, seq: int, batch: int, sh: Sharding, opts: MemoryOptions, embeddings: bool
) -> float:
    """The logits phase's transient on a rank that holds the head (none for the bare layer stack)."""
    if not embeddings:
        return 0.0
    p_bytes = model.param_bytes_per_element
    if opts.training:
        # The head's GEMM writes the logits in the activation dtype; the loss takes an fp32 copy, which it
        # turns into exponentials in place and keeps for backward, whose gradient it becomes in place
        # (Megatron's vocab-parallel cross-entropy; meshplan/executor/layouts/vocab.py). Measured on one
        # H200, the whole model's peak is there, with these two copies live (4 + 2 bytes a logit:
        # benchmarks/results/memory-peak-whole-*-h200.json); counting two fp32 copies over-predicted
        # those peaks by 7-26%.
        # Under TSP the head's ring sums its column shards' products into fp32 logits (_TSPLogits), so both
        # copies are fp32: measured at the peak of mamba2-130m, whole, tsp=2, 16K (two 1.535 GiB fp32
        # buffers, vocab.py's _TSPLogits and the loss's copy; memory-peak-mamba2-130m-tsp2-sp2-h200x2.json).
        head = opts.nbytes("logits_dtype") if sh.streams_weights else opts.nbytes("act_dtype")
        logits = loss_logits_bytes(model, sh, seq, batch, opts) * (1 + head / opts.nbytes("logits_dtype"))
    else:
        logits = batch * model.vocab * opts.nbytes("logits_dtype") / sh.vocab_div  # last position only
    if sh.streams_weights:
        # TSP's head: its column shards travel the ring (the one in hand and the one arriving), and the
        # backward holds this rank's partial gradient of every shard until the reduce-scatter
        # (meshplan/executor/layouts/vocab.py, _TSPLogits) — beside the loss's fp32 exponentials and the
        # logits' gradient in the activation dtype, not beside the forward's two fp32 copies, which are
        # gone by then: the phase holds the larger of the two.
        matrix = model.vocab * model.d_model
        ring = 2 * matrix / sh.weight_div * p_bytes
        if opts.training:
            one = loss_logits_bytes(model, sh, seq, batch, opts)
            backward = one * (1 + opts.nbytes("act_dtype") / opts.nbytes("logits_dtype"))
            logits = max(logits, backward + matrix * opts.nbytes("grad_dtype"))
        logits += ring
    return logits


def _own_shares(model: ModelSpec, stage_layers: tuple[int, ...], index: int, opts: MemoryOptions):
    """(the share of the layers' weights stage `index` holds, its share of their saved tensors) where
    layers differ: its own layers' blocks, a shared block (Zamba2's) held once for each copy its layers
    invoke (a pipeline stage keeps its own copy of a block another stage invokes too)."""
    return _stage_shares(model, stage_layers, opts)[index]


@functools.lru_cache(maxsize=1024)
def _stage_shares(model: ModelSpec, stage_layers: tuple[int, ...], opts: MemoryOptions) -> tuple:
    """_own_shares of every stage, computed once for a model, its stages and the options."""
    shared = set(model.shared_block_kinds())
    saved = {k: sum(i.bytes_per_token for i in block_saved(k, model, opts)) for k, _ in model.block_invocations()}
    total_saved = sum(n * saved[k] for k, n in model.block_invocations())
    out = []
    for counts in model.stage_block_counts(stage_layers):
        own = sum(n * BLOCKS[k].params(model) for k, n in counts.items() if k not in shared)
        if shared & counts.keys():
            copies = min(model.shared_blocks, max(counts[k] for k in shared & counts.keys()))
            own += copies * sum(BLOCKS[k].params(model) for k in shared)
        out.append((own / model.layer_params(), sum(n * saved[k] for k, n in counts.items()) / total_saved))
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _chunk_shares(model: ModelSpec, chunk_layers: tuple[tuple[int, ...], ...], opts: MemoryOptions) -> tuple:
    """_own_shares of each rank's chunks, (weights, saved tensors) a chunk, where a rank's chunks differ:
    virtual stage c·p + r holds the layers after stages 0 … c·p + r − 1 (pipeline.chunk_block_counts)."""
    pp, chunks = len(chunk_layers), len(chunk_layers[0])
    flat = _stage_shares(model, tuple(chunk_layers[k % pp][k // pp] for k in range(pp * chunks)), opts)
    return tuple(tuple(flat[c * pp + r] for c in range(chunks)) for r in range(pp))


def _stage_peak(
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    opts: MemoryOptions,
    sh: Sharding,
    shared: _Shared,
    *,
    index: int,
    stage_layers: tuple[int, ...],
    microbatches: int,
    chunks: int,
    embeddings: bool,
    by_kind: dict | None = None,
    chunk_layers: tuple[tuple[int, ...], ...] = (),
) -> tuple[float, str, str, dict, dict]:
    """Pipeline stage `index`: (its peak bytes, its name, the phase that sets the peak, its components,
    what each holds at the peak):
    model states (ZeRO's shares), its in-flight micro-batches' activations, and the largest of the layer,
    logits, attention and optimizer phases."""
    train, pp = opts.training, layout.pp
    p_bytes = model.param_bytes_per_element
    zero = zero_stage(layout, opts.stack_spec)
    # ZeRO shards over the gradient group: dp, times sp where SP replicates the weights too, as the
    # schedule reduce-scatters (Megatron-LM builds its distributed optimizer over the data-parallel
    # group with context parallel: get_megatron_optimizer, megatron/core/optimizer/__init__.py).
    shards = grad_group(layout)[1] if zero else 1
    stage = "only" if pp == 1 else "first" if index == 0 else "last" if index == pp - 1 else "middle"
    share = stage_layers[index] / model.layers
    act_share = share
    # Each chunk's share of the layers' saved tensors, where a rank's chunks differ (StageLayout).
    chunk_acts = tuple(n / model.layers for n in chunk_layers[index]) if chunk_layers else ()
    if not model.uniform_layers and chunk_layers:  # its chunks' layers: their blocks' weights and saved tensors
        shares = _chunk_shares(model, chunk_layers, opts)[index]
        share, act_share = sum(w for w, _ in shares), sum(a for _, a in shares)
        chunk_acts = tuple(a for _, a in shares)
    elif not model.uniform_layers:  # the stage's own layers: their blocks' weights and saved tensors
        share, act_share = _own_shares(model, stage_layers, index, opts)
    params = local_params(model, sh, pp=pp, stage=stage, embeddings=embeddings, layer_share=share, by_kind=by_kind)
    param_b = zero_sharded(model, layout, params, by_kind, share, from_stage=3, stack=opts.stack_spec) * p_bytes
    counts = (
        rank_block_counts(model, StageLayout(stage_layers, chunk_layers))
        if chunk_layers
        else model.stage_block_counts(stage_layers)
    )[index]
    fp8_b, fp8_params_saved = _fp8_weight_bytes(model, opts, counts, sh, by_kind, shards if zero == 3 else 1)
    param_b -= fp8_params_saved
    grad_b = (
        zero_sharded(model, layout, params, by_kind, share, from_stage=2, stack=opts.stack_spec)
        * opts.nbytes("grad_dtype")
        if train
        else 0.0
    )
    opt_bytes = 0
    if train and opts.optimizer == "adam":
        opt_bytes = ADAM_STATE_BYTES_PER_PARAM if p_bytes < 4 else ADAM_STATE_BYTES_FP32_PARAMS
    opt_b = zero_sharded(model, layout, params, by_kind, share, from_stage=1, stack=opts.stack_spec) * opt_bytes
    acts = 0.0
    if train:
        # Chunks of 1/v of the stage's layers in flight (meshplan.costmodel.pipeline.in_flight_chunks):
        # the first stage of 1F1B holds pp micro-batches, interleaved (1 + (p − 1)/(p·v)) times that.
        in_flight = in_flight_chunks(index, pp, microbatches, chunks) if pp > 1 else 1
        stage_saved = shared.saved_all * act_share * pp * in_flight / chunks
        if chunk_acts:  # chunks that differ: the most of them in flight at once (pipeline.in_flight_peak)
            stage_saved = shared.saved_all * pp * in_flight_peak(index, pp, microbatches, chunk_acts)
        acts = stage_saved + (shared.head_items if stage in ("only", "last") else 0.0)
        if pp > 1:
            # A stage keeps each in-flight micro-batch's output until its gradient comes back, and
            # the gradient received (first stage); the last keeps its output and its input's
            # gradient going back (meshplan/executor/pipeline.py). Without them a pp=2 stage was
            # under-predicted by 0.63 GiB at 16K tokens (benchmarks/results/validation-h200-run51-x2-pp-first.json).
            acts += boundary_activation_bytes(model, sh, seq, batch, opts, in_flight)
    has_logits = stage in ("only", "last")
    kv_cache, ssm_cache = shared.caches
    layer = shared.layer
    workspace = BLAS_WORKSPACE_BYTES * (2 if train else 1)
    parts = {
        "parameters": param_b,
        "gradients": grad_b,
        "optimizer_state": opt_b,
        "activations": acts,
        "kv_cache": kv_cache,
        "ssm_state_cache": ssm_cache,
        "transient_working": layer["working"],
        "transient_kv_gather": layer["kv_gather"],
        "transient_weight_shards": layer["weight_shards"],
        "transient_comm_buffers": layer["comm_buffers"],
        "transient_logits": shared.logits if has_logits else 0.0,
        "blas_workspace": workspace,
        "int8_peer_buffer": shared.peer_buffer,
        "fp8_weights": fp8_b,
    }
    kept = param_b + opt_b + kv_cache + ssm_cache + workspace + shared.peer_buffer + fp8_b
    streaming = layer["weight_shards"] + layer["comm_buffers"]
    # Without gradient accumulation the gradients are set to None after each step and built up
    # during backward: at the activation peak (backward start) only the last layer's exist; all
    # of them meet the optimizer step instead, with its fp32 temporaries of the largest matrix (as many
    # as the stack's step makes: none for meshplan's one-kernel step).
    accumulating = pp > 1 or microbatches > 1
    grads_at_peak = grad_b if accumulating else grad_b * _largest_block_share(model)
    phases = {
        "layer": acts + grads_at_peak + layer["working"] + streaming,
        "logits": acts + grads_at_peak + parts["transient_logits"],
    }
    if train:
        temporaries = opts.stack_spec.optimizer_fp32_temporaries
        phases["optimizer"] = grad_b + temporaries * largest_matrix(model, sh) * 4 / shards
        if layer["attention_phase"]:
            phases["attention"] = acts + grads_at_peak + layer["attention_phase"] + streaming
    phase = max(phases, key=phases.get)
    # The same sums, by component: what is held at the peak moment.
    at_peak = dict.fromkeys(parts, 0.0)
    for key in _KEPT:
        at_peak[key] = parts[key]
    if phase == "optimizer":
        at_peak["gradients"] = grad_b
        at_peak["transient_working"] = phases["optimizer"] - grad_b  # the step's fp32 temporaries
    else:
        at_peak["activations"], at_peak["gradients"] = acts, grads_at_peak
    if phase == "logits":
        at_peak["transient_logits"] = parts["transient_logits"]
    elif phase in ("layer", "attention"):
        at_peak["transient_weight_shards"] = layer["weight_shards"]
        at_peak["transient_comm_buffers"] = layer["comm_buffers"]
        if phase == "layer":
            at_peak["transient_working"] = layer["working"]
        else:  # the layer's MLP activations freed by then, its backward's working set and the K/V gathered
            at_peak["activations"] -= layer["attention_mlp_freed"]
            at_peak["transient_kv_gather"] = layer["kv_gather"]
            at_peak["transient_working"] = layer["attention_working"]
    name = stage if stage in ("only", "first", "last") else f"stage {index}"
    return kept + phases[phase], name, phase, parts, at_peak


# Held whole from step to step: at the peak as in per_gpu_bytes, to the byte.
_KEPT = (
    "parameters",
    "optimizer_state",
    "kv_cache",
    "ssm_state_cache",
    "blas_workspace",
    "int8_peer_buffer",
    "fp8_weights",
)


def _rounded_to(parts: dict[str, float], total: int) -> dict[str, int]:
    """Whole bytes per component that sum to `total` exactly: the rounding's few bytes go to the largest
    of what the peak moment adds (the kept components stay as per_gpu_bytes rounds them)."""
    out = {k: int(round(v)) for k, v in parts.items()}
    moment = [k for k in out if k not in _KEPT] or list(out)
    out[max(moment, key=out.get)] += total - sum(out.values())
    return out


def head_activation_bytes(model: ModelSpec, sh: Sharding, seq: int, batch: int, opts: MemoryOptions) -> float:
    """What the final norm and the LM head save for backward on one rank (activations.head_saved)."""
    return _saved_bytes(head_saved(model, opts), batch * seq, seq, sh, 1)


def loss_logits_bytes(model: ModelSpec, sh: Sharding, seq: int, batch: int, opts: MemoryOptions) -> float:
    """One copy of a rank's training logits in the loss's dtype (fp32): the exponentials the loss keeps
    for backward. The logits phase holds these and the GEMM's logits in the activation dtype."""
    return batch * seq * model.vocab * opts.nbytes("logits_dtype") / (sh.token_div * sh.vocab_div)


def boundary_activation_bytes(
    model: ModelSpec, sh: Sharding, seq: int, batch: int, opts: MemoryOptions, in_flight: int
) -> float:
    """A pipeline stage's boundary tensors: each in-flight micro-batch's output, kept until its gradient
    comes back (meshplan/executor/pipeline.py) unless the stack frees it once sent
    (Stack.frees_stage_outputs), and the gradient received."""
    outputs = 0 if opts.stack_spec.frees_stage_outputs else in_flight
    return batch * seq / sh.token_div * model.d_model * opts.nbytes("act_dtype") * (outputs + 1)


def _stages_to_check(
    stage_layers: tuple[int, ...], pp: int, microbatches: int, chunks: int, counts: tuple | None = None
) -> list[int]:
    """The stages whose memory can be the largest: the first (most in flight, the embedding), the last
    (the output head and the logits) and the middle stage with the most layers in flight. Where layers
    differ (`counts`: each stage's block invocations), any may hold the heaviest: of the middle stages
    that run the same blocks, the one with the most micro-batches in flight (the same weights, more
    saved tensors)."""
    if pp == 1:
        return [0]
    if counts is not None:
        heaviest: dict = {}
        for i in range(1, pp - 1):
            key = tuple(sorted(counts[i].items()))
            held = in_flight_chunks(i, pp, microbatches, chunks)
            if key not in heaviest or held > heaviest[key][0]:
                heaviest[key] = (held, i)
        return sorted({0, pp - 1} | {i for _, i in heaviest.values()})
    middle = max(
        range(1, pp - 1), default=None, key=lambda i: stage_layers[i] * in_flight_chunks(i, pp, microbatches, chunks)
    )
    return sorted({0, pp - 1} | ({middle} if middle is not None else set()))

"""Compute time per block on one rank: GEMMs by roofline at an achieved rate, attention at the fused
kernel's rate, memory-bound work (norms, activations, residuals, conv, scan) from HBM bytes.

FLOPs per op (docs/design.md §4): a GEMM of (m × k)·(k × n) is 2·m·n·k; causal attention is
4·t·s·(a·d)/2 forward (QKᵀ and PV, half the keys masked); backward is 2× a GEMM's forward and
2.5× attention's (FlashAttention-2, Dao 2023: 5 matmuls against 2).
"""

from __future__ import annotations

import functools

from meshplan.costmodel.axes import Sharding, tsp
from meshplan.costmodel.blocks import BLOCKS, BlockCompute
from meshplan.costmodel.device import LOSS_KERNEL_HBM_FRACTION, TORCH_OP_HBM_FRACTION, Device, gemm_time_s
from meshplan.models import ModelSpec


@functools.lru_cache(maxsize=65536)
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
    load: float = 1.0,
) -> BlockCompute:
    """One invocation of `kind` on one rank: `tokens` local queries attending to `keys` keys, of which
    a query sees `causal_fraction` on average (0.5 for a balanced causal split); `zigzag`: the ranks a
    zigzag split deals the keys over (blocks.attention.zigzag_attention_s), 0 for none; `row_tokens`: the local tokens
    of one sequence row (the scan passes over a row's chunks in turn; `tokens` when not given); `load`:
    the busiest rank's work over the even share (BlockKind.load) — its time, not the model's FLOPs.
    A pure function of its arguments, computed once for each (the planner asks for the same blocks
    across meshes that differ only in dp, pp, ZeRO or where the experts live)."""
    b = BLOCKS[kind]
    busy = tokens * load
    gemm = b.gemm_s(model, busy, sh, e, dev)
    ran = tokens * min(load, 1.0)  # a capacity below the even share drops tokens: they run no FLOPs
    flops = sum(2 * ran * n * k for n, k in b.gemms(model, sh.head_div))
    core, core_flops = b.core_s(model, tokens, keys, sh, e, dev, causal_fraction=causal_fraction, zigzag=zigzag)
    flops += core_flops
    passes = b.eager_factor(dev, model, sh.head_div)
    mem = busy * b.memory_bound_bytes_per_token(model, sh.head_div, e) * passes / dev.rated_hbm
    kernel_fwd, kernel_bwd = b.kernels_s(model, tokens, sh, e, dev, row_tokens)
    motion_fwd, motion_bwd = b.shard_motion_s(model, busy, sh, e, dev, zigzag=zigzag)
    if sh.streams_weights and dev.tsp_motion:  # TSP's packing, partial sums and concatenations (torch ops)
        rows = busy / row_tokens if row_tokens else 1.0  # the sequence rows (the batch) on the rank
        fwd_bytes, bwd_bytes = tsp.motion_bytes(model, kind, busy, sh.weight_div, e, rows)
        rate = dev.rated_hbm * TORCH_OP_HBM_FRACTION
        motion_fwd, motion_bwd = motion_fwd + fwd_bytes / rate, motion_bwd + bwd_bytes / rate
    cast_fwd = cast_bwd = 0.0
    if dev.precision != "bf16":  # Transformer Engine's quantize kernels around the FP8 GEMMs
        fwd_bytes, bwd_bytes = b.fp8_cast_bytes_per_token(model, sh.head_div, dev.fp8_current_scaling)
        cast_fwd, cast_bwd = busy * fwd_bytes / dev.rated_hbm, busy * bwd_bytes / dev.rated_hbm
    recompute_s = 0.0
    if training:
        if recompute == "full":  # the whole forward again, its sequence-shard and TSP data motion included
            recompute_s += gemm + core + mem + kernel_fwd + cast_fwd + motion_fwd
        # What the block's own backward recomputes (a Mamba mixer's core, a sequence shard's attention) it recomputes
        # under full recompute too: in the backward of the recomputed forward, nested (executor/blocks.py's layer
        # checkpoint around layouts/dense.py's and the Mamba blocks' own), so that work runs three times.
        recompute_s += b.partial_recompute_s(
            model,
            "none" if recompute == "full" else recompute,
            sh,
            gemm=gemm,
            core=core,
            mem=mem,
            kernel_fwd=kernel_fwd,
            tokens=tokens,
            e=e,
            dev=dev,
        )
    return BlockCompute(
        gemm,
        core,
        mem,
        recompute_s,
        flops,
        kernel_fwd,
        kernel_bwd if training else 0.0,
        b.core_bwd_factor(dev),
        cast_fwd,
        cast_bwd if training else 0.0,
        motion_fwd,
        motion_bwd if training else 0.0,
    )


def executor_loss_bytes(logits: float, e: int) -> tuple[float, float]:
    """(forward, backward) bytes of meshplan's executor's cross-entropy on the GPU over `logits` logits held in
    e bytes (meshplan.kernels.cross_entropy, from executor/layouts/vocab.py _VocabParallelCE): forward the rows'
    statistics (read e) and the fp32 exponentials (read e, write 4); backward the gradient (read 4, write e) —
    14 bytes a logit in bf16, 20 in fp32. benchmarks/tsp_bytes.py counts the same (tests/test_tsp_motion.py)."""
    return logits * (2 * e + 4), logits * (4 + e)


def logits_compute(model: ModelSpec, tokens: float, sh: Sharding, e: int, dev: Device) -> BlockCompute:
    vocab = model.vocab / sh.vocab_div
    gemm = gemm_time_s(tokens, vocab, model.d_model, e, dev)
    motion_fwd = motion_bwd = 0.0
    if dev.executor_loss:  # the executor's loss kernels at their measured rate (TSP's logits are fp32 sums)
        mem = 0.0
        fwd_bytes, bwd_bytes = executor_loss_bytes(tokens * vocab, 4 if sh.streams_weights else e)
        rate = dev.rated_hbm * LOSS_KERNEL_HBM_FRACTION
        motion_fwd, motion_bwd = fwd_bytes / rate, bwd_bytes / rate
    else:  # softmax / cross-entropy over the fp32 logits: read and write them twice a direction
        mem = tokens * vocab * 4 * 4 / dev.hbm_bytes_per_s
    if sh.streams_weights and dev.tsp_motion:  # TSP's logits summed in fp32 over the head's column shards
        fwd_bytes, bwd_bytes = tsp.head_motion_bytes(model, tokens, sh.weight_div, e)
        rate = dev.rated_hbm * TORCH_OP_HBM_FRACTION
        motion_fwd, motion_bwd = motion_fwd + fwd_bytes / rate, motion_bwd + bwd_bytes / rate
    return BlockCompute(
        gemm, 0.0, mem, 0.0, 2 * tokens * vocab * model.d_model, motion_fwd_s=motion_fwd, motion_bwd_s=motion_bwd
    )


def optimizer_time_s(
    local_params: float, bytes_per_param: float, dev: Device, hbm_fraction: float | None = None
) -> float:
    """The optimizer step over the states a rank keeps, bound by HBM: `bytes_per_param` as the stack's
    step moves them (Stack.optimizer_step_bytes_per_param) at `hbm_fraction` of the rated HBM rate where
    the stack's step was timed (Stack.optimizer_hbm_fraction), else at the device's HBM rate."""
    rate = dev.rated_hbm * hbm_fraction if hbm_fraction is not None else dev.hbm_bytes_per_s
    return local_params * bytes_per_param / rate

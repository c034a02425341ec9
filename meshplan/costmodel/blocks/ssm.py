"""What Mamba-1 and Mamba-2 blocks share: a decode step's state traffic and a sequence shard's edges."""

from __future__ import annotations

from meshplan.costmodel.activations import FP32, Saved
from meshplan.costmodel.blocks.base import BlockCompute


def decode_state_io(comp: BlockCompute, m, batch, sh, opts, dev) -> BlockCompute:
    """A decode step reads and writes the layer's SSM state (fp32) once."""
    state = batch * m.d_inner * m.d_state / sh.head_div * opts.nbytes("ssm_state_dtype")
    return BlockCompute(
        comp.gemm_fwd_s, comp.attn_fwd_s, comp.mem_fwd_s + 2 * state / dev.hbm_bytes_per_s, 0.0, comp.flops_fwd
    )


def boundary(m, conv: float, state: float, decay: float, batch, opts, shards: int) -> float:
    """Conv tail ((d_conv − 1) × conv channels, activation dtype) and SSM state (state dtype) of one
    Mamba block for `batch` sequences on one rank. With `shards` > 1 (SP) also the gathered summaries
    the entering state was combined from — every shard's final state and log decay, and the
    combination's weights (one per shard and decay) — which its backward keeps."""
    summaries = shards * (state + 2 * decay) if shards > 1 else 0.0
    return batch * (
        conv * (m.d_conv - 1) * opts.nbytes("act_dtype") + (state + summaries) * opts.nbytes("ssm_state_dtype")
    )


def mixer_inputs_saved(d_model: int, e: int) -> list[Saved]:
    """What a Mamba block saves before its mixer: the norm's input and statistics, in_proj's input."""
    return [
        Saved("norm_input", e * d_model, "hidden"),
        Saved("norm_stats", FP32, "hidden"),
        Saved("in_proj_input", e * d_model, "hidden"),
    ]

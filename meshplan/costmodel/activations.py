"""The tensors each block saves for backward, one named entry each.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4.1)
count per layer, with bf16 activations, 1-byte dropout masks, LayerNorm, GeLU MLP with F = 4 and no
fused attention: attention 11·sbh + 5·a·s²·b, MLP 19·sbh, two norms 4·sbh, i.e.
s·b·h·(34 + 5·a·s/h). Listing the tensors one by one reproduces that sum (tests/test_activations.py)
and extends it to what Korthikanti does not cover: gated MLPs, GQA, fused attention (which keeps the
output and a per-head log-sum-exp instead of the s² scores), norm statistics, and Mamba blocks.

Each entry's `split` says how a layout divides it (all entries are per token, so every entry is
also divided by the layout's token split):
- "hidden": full-width tensors that TP replicates (norm inputs, projection inputs, dropout masks);
  Megatron-SP splits them by T as well.
- "heads": tensors between a column-parallel and a row-parallel projection: divided by T.
- "groups": Mamba-2's B and C, split by T when T divides ngroups, else replicated to the ranks whose
  heads share a group: divided by gcd(T, ngroups).
Entries with `quadratic=True` scale with the key length too (the s² attention scores).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from meshplan.costmodel.options import MemoryOptions
from meshplan.models import ModelSpec

FP32 = 4  # norm statistics and the attention log-sum-exp are kept in fp32
MASK = 1  # a dropout mask is one byte per element (Korthikanti §4.1)
NORM_STATS = {"rmsnorm": FP32, "layernorm": 2 * FP32}  # rstd; LayerNorm also keeps the mean


@dataclass(frozen=True)
class Saved:
    name: str
    bytes_per_token: float  # at full (unsharded) width
    split: str  # "hidden" | "heads"
    quadratic: bool = False  # × key length (attention scores)
    recomputed_by_selective: bool = False  # Korthikanti's selective recompute drops it


def attention_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    attn = model.attention
    e = opts.nbytes("act_dtype")
    items = [
        Saved("attn_norm_input", e * attn.hidden, "hidden"),
        Saved("attn_norm_stats", NORM_STATS[model.norm], "hidden"),
        Saved("qkv_input", e * attn.hidden, "hidden"),
        Saved("q", e * attn.q_width, "heads"),
        Saved("k", e * attn.kv_width, "heads"),
        Saved("v", e * attn.kv_width, "heads"),
        # The attention output is the out-projection's input; fused kernels save it once for both.
        Saved("attn_out", e * attn.q_width, "heads"),
    ]
    if opts.flash_attention:
        items.append(Saved("attn_logsumexp", FP32 * attn.heads, "heads"))
    else:
        # softmax output (a·s² per sequence), and with dropout its mask and the dropped-out copy.
        items.append(Saved("attn_softmax", e * attn.heads, "heads", quadratic=True, recomputed_by_selective=True))
        if attn.kv_heads < attn.heads:
            # GQA without a fused kernel: K and V are repeated to every query head before the matmuls.
            items.append(Saved("k_repeated", e * attn.q_width, "heads", recomputed_by_selective=True))
            items.append(Saved("v_repeated", e * attn.q_width, "heads", recomputed_by_selective=True))
        if opts.dropout:
            items.append(
                Saved(
                    "attn_softmax_dropout_mask",
                    MASK * attn.heads,
                    "heads",
                    quadratic=True,
                    recomputed_by_selective=True,
                )
            )
            items.append(
                Saved("attn_softmax_dropout_out", e * attn.heads, "heads", quadratic=True, recomputed_by_selective=True)
            )
    if opts.dropout:
        items.append(Saved("attn_dropout_mask", MASK * attn.out_hidden, "hidden"))
    return items


def mlp_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    mlp = model.mlp
    e = opts.nbytes("act_dtype")
    f = mlp.ffn_hidden
    items = [
        Saved("mlp_norm_input", e * mlp.hidden, "hidden"),
        Saved("mlp_norm_stats", NORM_STATS[model.norm], "hidden"),
        Saved("mlp_input", e * mlp.hidden, "hidden"),
    ]
    if mlp.gated:
        # SwiGLU: silu saves its input (gate), the product saves silu(gate) and up, down saves the product.
        items += [Saved("gate", e * f, "heads"), Saved("up", e * f, "heads"), Saved("gated_product", e * f, "heads")]
        if not opts.stack_spec.fused_swiglu:
            items.append(Saved("silu_gate", e * f, "heads"))
    else:
        items += [Saved("fc1_out", e * f, "heads"), Saved("act_out", e * f, "heads")]
    if opts.dropout:
        items.append(Saved("mlp_dropout_mask", MASK * mlp.out_hidden, "hidden"))
    return items


def mamba2_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    """Our Mamba-2 block: the mixer core (conv1d, scan, gated norm, out_proj) is one autograd function
    that saves only the in_proj output (z, x, B, C, dt) and recomputes the core in backward — one step
    further than mamba_ssm's `mamba_split_conv1d_scan_combined`, which also keeps the scan output."""
    m = model.mamba2
    e = opts.nbytes("act_dtype")
    return [
        Saved("norm_input", e * m.d_model, "hidden"),
        Saved("norm_stats", FP32, "hidden"),
        Saved("in_proj_input", e * m.d_model, "hidden"),
        Saved("zxdt", e * (2 * m.d_inner + m.nheads), "heads"),
        Saved("bc", e * 2 * m.ngroups * m.d_state, "groups"),
    ]


MAMBA1_SCAN_CHUNK = 2048  # mamba_ssm selective_scan keeps fp32 states every 2048 tokens (selective_scan_fwd)


def mamba1_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    """Mamba-1 as mamba_ssm's `mamba_inner_fn` with checkpoint_lvl=1 (conv output and delta recomputed)."""
    m = model.mamba1
    e = opts.nbytes("act_dtype")
    return [
        Saved("norm_input", e * m.d_model, "hidden"),
        Saved("norm_stats", FP32, "hidden"),
        Saved("in_proj_input", e * m.d_model, "hidden"),
        Saved("xz", e * 2 * m.d_inner, "heads"),
        # x_dbl = (dt, B, C) from all channels: all-reduced under TP, so full on every rank.
        Saved("x_dbl", e * m.x_proj_width, "hidden"),
        Saved("scan_out", e * m.d_inner, "heads"),
        Saved("scan_chunk_states", FP32 * m.d_inner * 2 * m.d_state / MAMBA1_SCAN_CHUNK, "heads"),
    ]


def hybrid_proj_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    """The linear's input, and each LoRA adapter's rank-wide middle (their inputs are the shared
    block's, saved there)."""
    e = opts.nbytes("act_dtype")
    items = [Saved("hybrid_proj_input", e * model.mlp.out_hidden, "hidden")]
    if model.adapter_rank:
        adapters = 1 + (3 if model.attention_adapters else 0)
        items.append(Saved("adapter_rank_out", e * adapters * model.adapter_rank, "hidden"))
    return items


def head_saved(model: ModelSpec, opts: MemoryOptions) -> list[Saved]:
    """Final norm and the LM head input (once per model, not per layer)."""
    e = opts.nbytes("act_dtype")
    # The loss keeps, a token, the fp32 sum of exponentials, the target's int64 column and whether this
    # rank's vocabulary holds it; the embedding its int64 ids (meshplan/executor/layouts/vocab.py). The
    # fp32 logits it keeps are the logits phase's (memory.memory_per_gpu).
    return [
        Saved("final_norm_input", e * model.d_model, "hidden"),
        Saved("final_norm_stats", FP32, "hidden"),
        Saved("lm_head_input", e * model.d_model, "hidden"),
        Saved("loss_stats", FP32 + 8 + 1, "hidden"),
        Saved("embedding_ids", 8, "hidden"),
    ]


@functools.lru_cache(maxsize=1024)
def block_saved(kind: str, model: ModelSpec, opts: MemoryOptions) -> tuple[Saved, ...]:
    """The tensors one `kind` block saves (a tuple: cached, the planner asks for the same ones a thousand
    times a ranking)."""
    return tuple(
        {
            "attention": attention_saved,
            "mlp": mlp_saved,
            "mamba2": mamba2_saved,
            "mamba1": mamba1_saved,
            "hybrid_proj": hybrid_proj_saved,
        }[kind](model, opts)
    )


def checkpoint_units(model: ModelSpec) -> list[tuple[tuple[str, ...], int, int]]:
    """(blocks in the unit, how many times the unit runs, width of the unit's input).

    Full recompute keeps only each unit's input; a dense layer is attention + MLP, a Mamba layer is
    one block, a hybrid invocation of the shared block is attention + MLP + its projection.
    """
    if model.family == "dense":
        return [(("attention", "mlp"), model.layers, model.d_model)]
    if model.family in ("mamba2", "mamba1"):
        return [((model.family,), model.layers, model.d_model)]
    return [
        (("mamba2",), model.layers, model.d_model),
        (("attention", "mlp", "hybrid_proj"), model.hybrid_invocations, model.attention.hidden),
    ]

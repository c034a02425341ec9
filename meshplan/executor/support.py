"""What the executor runs, checked before anything launches (torch-free: the CLI and the planner ask).

The cost model scores more than the executor runs: ZeRO 2 and 3 under pipeline stages with a tsp or
tpssm axis, ZeRO 3 under TSP, mixtures of experts beside tpssm (or under ZeRO 3), mixed models
(Nemotron-H's) under tpssm or ZeRO 3, Zamba2 hybrids under tsp, pp > 2, ZeRO 2-3 under pp, ZeRO 3 or
--layers-only, and models other than dense, Mamba-2, all-MoE, one-block-a-layer mixed stacks and Zamba2
hybrids (Mamba-1, Jamba-like mixed layers, MLA) are priced but not executed. `meshplan execute` refuses
them with one line; `meshplan recommend` marks them. What each layout module runs is checked beside
those modules (executor/layouts/limits.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.executor.layouts.limits import hybrid_limits, layer_limits, mixed_limits, moe_limits, vocab_limits
from meshplan.layout import Layout
from meshplan.models import ModelSpec, RopeSpec

if TYPE_CHECKING:
    from meshplan.costmodel.options import CostOptions


def unsupported(layout: Layout, model: ModelSpec, whole: bool = True, options: CostOptions | None = None) -> str | None:
    """Why the executor cannot run `layout` on `model` — the whole model, or with `whole=False` its
    layer stack alone — in one line naming the field and what it can run instead; None when it can.
    `options`: the cost model's settings a plan was priced with, where they choose what runs (an MoE's
    dispatcher and capacity)."""
    if model.attention is not None and model.attention.mla:
        return (
            f"model: the executor builds multi-head and grouped-query attention, not {model.name}'s latent "
            f"attention (MLA); `meshplan memory` and `recommend` price it"
        )
    if model.family == "moe":
        if (reason := moe_limits(layout, model, options)) is not None:
            return reason
    elif model.family == "mixed":
        if (reason := mixed_limits(layout, model, options)) is not None:
            return reason
    elif model.family == "hybrid":
        if not whole:  # its layers read the token embeddings (layouts.hybrid.SharedBlocks keeps them)
            return f"--layers-only: the executor runs {model.name}'s hybrid layers in the whole model only; drop it"
        if (reason := hybrid_limits(layout, model)) is not None:
            return reason
    elif model.family not in ("dense", "mamba2"):
        return (
            f"model: the executor builds dense, Mamba-2, mixture-of-experts, Nemotron-H-like mixed and Zamba2 "
            f"hybrid models, not {model.family} ({model.name}) in {layout}; `meshplan memory` and `recommend` "
            f"price it"
        )
    if layout.pp > 1 and model.layers % layout.pp:
        return f"layout: pp={layout.pp} does not divide {model.name}'s {model.layers} layers; pick pp from its divisors"
    if (reason := layer_limits(layout, model)) is not None:
        return reason
    if layout.zero and layout.dp == 1:
        return (
            f"layout: the executor shards ZeRO over dp only (the cost model, as Megatron, over dp × sp); "
            f"drop zero={layout.zero} or add dp"
        )
    return _whole_model(layout, model) if whole else None


def _whole_model(layout: Layout, model: ModelSpec) -> str | None:
    """What the embedding and the head add: even vocabulary or column splits, and a tied matrix that
    ZeRO 3 does not shard."""
    if (reason := vocab_limits(layout, model)) is not None:
        return reason
    if model.tied_embeddings and layout.dp > 1 and layout.zero >= 3:
        return (
            f"layout: the executor does not shard {model.name}'s tied embedding for ZeRO 3; execute zero=2 "
            f"or below, or --layers-only"
        )
    if model.tied_embeddings and layout.pp > 1 and layout.dp > 1 and layout.zero >= 2:
        return (
            f"layout: the executor sums a tied embedding's two pipeline ends once a step, which ZeRO "
            f"{layout.zero} under pp does not wait for; execute zero=1, or --layers-only"
        )
    return None


def executed_spec(model: ModelSpec) -> tuple[ModelSpec, list[str]]:
    """The model the executor builds — its blocks are pre-RMSNorm attention (rotary, full causal; the
    queries and keys normed per head where the model does, as Qwen3) and (gated or GeLU) MLPs with no
    biases — and what of `model` that leaves out, named. The run's prediction is made for this model,
    so that measurement and prediction describe one thing."""
    from dataclasses import replace

    dropped = []
    attn, mlp = model.attention, model.mlp
    head_norms = attn is not None and attn.qk_norm == 2 * attn.head_dim  # Qwen3's (blocks.DenseLayer)
    if attn is not None and (attn.bias or attn.qkv_bias or (mlp is not None and mlp.bias)):
        dropped.append("projection biases")
    if attn is not None and attn.qk_norm and not head_norms:
        dropped.append("query/key norms over the whole query and key widths (OLMo2's; the executor norms each head)")
    if attn is not None and attn.post_norm:
        dropped.append("post-block norms")
    if model.window_layers:
        dropped.append(
            f"the sliding window ({model.window_layers} layers of {model.attention_window} keys; "
            "run as full causal attention)"
        )
    if model.norm != "rmsnorm":
        dropped.append("LayerNorm (run as RMSNorm)")
    if model.positions == "learned":
        dropped.append("learned positions")
    if model.family in ("dense", "hybrid", "moe", "mixed") and model.rope.kind not in RopeSpec.EXECUTED:
        dropped.append(f"{model.rope.kind} rotary scaling (run with unscaled frequencies)")
    if not dropped:
        return model, []
    spec = replace(
        model,
        norm="rmsnorm",
        positions="rotary",
        max_positions=0,
        attention_window=0,
        window_layers=0,
        rope=model.rope if model.rope.kind in RopeSpec.EXECUTED else replace(model.rope, kind="default"),
    )
    if attn is not None:
        spec = replace(
            spec,
            attention=replace(
                attn, bias=False, qkv_bias=False, qk_norm=attn.qk_norm if head_norms else 0, post_norm=False
            ),
            mlp=replace(mlp, bias=False, post_norm=False) if mlp is not None else None,
        )
    return spec, dropped

"""What the executor's layout modules run, checked before anything launches: torch-free, as
meshplan.executor.support asks it for the CLI and the planner. Each check names the module whose limit
it is; a refusal is one line naming the field and what runs instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.layout import Layout
from meshplan.models import ModelSpec

if TYPE_CHECKING:
    from meshplan.costmodel.options import CostOptions


def layer_limits(layout: Layout, model: ModelSpec) -> str | None:
    """Why this rank's layers (layer.build_layer's sublayers, and the gradient sums GradientSync runs
    for them) cannot be built for `layout` on `model`; None when they can."""
    if layout.pp > 1 and layout.dp > 1 and layout.zero >= 2 and (layout.tsp > 1 or layout.tpssm > 1):
        # TSP's norm scales and TP-SSM's replicated B/C weights (their sublayers' partial_grads and
        # replicated_grad_params) are summed over the tensor axis once a step by
        # parallelize.GradientSync, while ZeRO 2-3 under pp reduce-scatter every micro-batch's gradients.
        return (
            f"layout: the executor pipelines ZeRO {layout.zero} without tsp or tpssm; execute zero=1 or "
            f"drop the tensor axis"
        )
    attn = model.attention
    if layout.pp > 1 and layout.dp > 1 and layout.zero >= 2 and layout.tp > 1 and attn is not None and attn.qk_norm:
        # dense.ParallelAttention's query/key norm scales: partial_grads over tp, as TSP's norm scales
        return (
            f"layout: the executor sums {model.name}'s query/key norm gradients over tp once a step, which "
            f"ZeRO {layout.zero} under pp does not wait for; execute zero=1, or drop pp or tp"
        )
    if layout.dp > 1 and layout.zero >= 3 and layout.tsp > 1:  # tsp.py, tsp_mamba.py
        return (
            f"layout: the executor's TSP streams its own weight shards and does not also shard them "
            f"for ZeRO 3; with tsp={layout.tsp} execute zero=2 or below"
        )
    if layout.tsp > 1 and model.mamba2 is not None:  # tsp_mamba.TSPMamba2's contiguous splits
        m = model.mamba2
        sizes = {"in_proj rows": m.in_proj_width, "conv channels": m.conv_dim, "heads": m.nheads, "d_inner": m.d_inner}
        bad = [f"{k} {v}" for k, v in sizes.items() if v % layout.tsp]
        if bad:
            return (
                f"layout: tsp={layout.tsp} must divide {model.name}'s Mamba-2 weights ({', '.join(bad)}); "
                f"pick a tsp that divides them"
            )
    if layout.tsp > 1 and model.mlp is not None and not (model.mlp.gated or model.mlp.relu2):  # tsp.TSPMLP
        return f"layout: the executor's TSP ring runs gated and squared-ReLU MLPs, not {model.name}'s; use tp or sp"
    t = layout.tensor_degree
    if model.mamba2 is not None and t > 1 and model.mamba2.ngroups % t and model.mamba2.ngroups != 1:
        return (
            f"layout: the executor splits Mamba-2's {model.mamba2.ngroups} B/C groups over the tensor axis "
            f"or replicates one group; {t} does not divide {model.mamba2.ngroups}"
        )
    return None


def vocab_limits(layout: Layout, model: ModelSpec) -> str | None:
    """Why the embedding and the head (vocab.py: vocabulary rows on a tensor axis, hidden columns under
    TSP) cannot be split for `layout` on `model`; None when they can."""
    t = layout.tensor_degree
    if t > 1 and model.vocab % t:
        return (
            f"model: vocab {model.vocab} is not divisible by the tensor axis ({t}), which the vocab-parallel "
            f"embedding splits evenly; pad vocab_size to a multiple of {t}, or run --layers-only"
        )
    if layout.tsp > 1 and model.d_model % layout.tsp:
        return (
            f"layout: tsp={layout.tsp} must divide hidden {model.d_model} (TSP splits the embedding by "
            f"columns); pick a tsp that divides it, or run --layers-only"
        )
    return None


# The layers of a mixed model the executor builds (blocks.mixed_layer): one block each, as Nemotron-H's.
MIXED_LAYERS_RUN = (
    ("mamba2",),
    ("attention",),
    ("mlp",),
    ("router", "experts"),
    ("router", "experts", "shared_expert"),
)


def mixed_limits(layout: Layout, model: ModelSpec, options: CostOptions | None = None) -> str | None:
    """Why a mixed model's layers (blocks.mixed_layer under layer.build_layer: Nemotron-H's one block a
    layer — Mamba-2, attention, a dense MLP or a mixture of experts — each its own pre-norm residual
    branch, on dp, ep, pp, tp, sp and tsp) cannot run `layout` on `model`; None when they can."""
    other = sorted(set(model.layer_blocks()) - set(MIXED_LAYERS_RUN))
    if other:
        return (
            f"model: the executor builds mixed models of one block a layer (Nemotron-H's), not {model.name}'s "
            f"layers of {', '.join('+'.join(b) for b in other)}; `meshplan memory` and `recommend` price it"
        )
    if layout.tpssm > 1:  # tpssm splits no MoE (moe_limits) nor attention beside Mamba-2 here
        return (
            f"layout: the executor runs {model.name}'s mixed layers on dp, ep, pp, tp, sp and tsp, not "
            f"tpssm={layout.tpssm}; use tp, sp or tsp"
        )
    return moe_limits(layout, model, options) if model.moe is not None else None


def moe_limits(layout: Layout, model: ModelSpec, options: CostOptions | None = None) -> str | None:
    """Why the mixture-of-experts layers (blocks.MoELayer under ep.ExpertParallelMoE: dropless top-k
    SwiGLU or squared-ReLU experts, Megatron-Core's alltoall dispatcher, E/ep experts a rank, each whole
    (etp=1) or its FFN split over etp — beside tp every tensor rank routes all its tokens, beside sp a
    rank its own; etp ranks of one tensor group all-reduce their partial outputs, an etp group over sp or
    dp ranks gathers its copies; ZeRO 1-2 of the experts over edp in parallelize.GradientSync) cannot run
    `layout` on `model`; None when they can. (etp under tsp: refused by meshplan.layout.validate_layout.)
    `options`: the cost model's MoE settings a plan was priced with (dispatcher, capacity)."""
    moe = model.moe
    if model.dense_layer_ids:
        return (
            f"model: the executor builds MoE models whose every layer is a mixture of experts; {model.name} keeps "
            f"dense MLPs on layers {list(model.dense_layer_ids)}; `meshplan memory` and `recommend` price it"
        )
    if moe.expert_bias or moe.router_bias:
        return (
            f"model: the executor builds experts without biases, not {model.name}'s expert or router biases; "
            f"`meshplan memory` and `recommend` price it"
        )
    if layout.tpssm > 1:
        return (
            f"layout: the executor runs a mixture of experts on dp, ep, etp, pp, tp, sp and tsp (issue #32), not with "
            f"tpssm={layout.tpssm}; drop tpssm or use tp"
        )
    if layout.tsp > 1 and moe.experts % layout.tsp:  # tsp.RingRowsFn: the router's rows ring in equal shards
        return (
            f"layout: tsp={layout.tsp} must divide {model.name}'s {moe.experts} experts (the router's rows go "
            f"round the tsp ring in equal shards); pick tsp from the divisors of {moe.experts}"
        )
    if layout.dp > 1 and layout.zero >= 3:
        return (
            f"layout: the executor's ZeRO 3 gathers weights over dp, not the experts over edp; with "
            f"{model.name} execute zero=2 or below"
        )
    if options is not None and options.moe_dispatcher != "alltoall":
        return (
            f"moe_dispatcher: the executor dispatches tokens with all-to-alls, not {options.moe_dispatcher}; "
            f"price it with --moe-dispatcher alltoall"
        )
    if options is not None and options.capacity_factor:
        return (
            f"capacity_factor: the executor runs dropless experts, not capacity factor {options.capacity_factor:g}; "
            f"price it with --capacity-factor 0"
        )
    return None


def hybrid_limits(layout: Layout, model: ModelSpec) -> str | None:
    """Why a Zamba2 hybrid's layers (hybrid.py: the shared blocks' sublayers built once a copy on a
    rank, each hybrid layer's linear and adapters whole, the Mamba-2 mixers as ParallelMamba2; on dp,
    with ZeRO 0-2, tp or tpssm, sp and pp=2) cannot run `layout` on `model`; None when they can."""
    if layout.tsp > 1:
        return (
            f"layout: the executor runs {model.name}'s shared blocks on dp, tp (tpssm), sp and pp, not "
            f"tsp={layout.tsp}; use tp or sp"
        )
    if layout.pp > 2:
        # hybrid.SharedBlocks: a copy held on several stages has its gradients summed over the pp axis,
        # which is the stages holding it only when there are two.
        return (
            f"layout: the executor sums {model.name}'s shared block copies over two pipeline stages, not "
            f"pp={layout.pp}; use pp=2"
        )
    if layout.pp > 1 and layout.dp > 1 and layout.zero >= 2:
        return (
            f"layout: the executor sums {model.name}'s shared block copies over the stages once a step, "
            f"which ZeRO {layout.zero} under pp does not wait for; execute zero=1"
        )
    if layout.dp > 1 and layout.zero >= 3:
        return f"layout: the executor's ZeRO 3 does not gather {model.name}'s shared blocks; execute zero=2 or below"
    if model.attention_adapters and model.attention.kv_heads != model.attention.heads:
        return (
            f"model: {model.name}'s Q/K/V adapters are attention_hidden wide, as transformers' Zamba2 builds "
            f"them, which needs num_key_value_heads = num_attention_heads"
        )
    return None

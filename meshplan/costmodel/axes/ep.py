"""The experts' own decomposition of a stage's ranks (Megatron-Core's MoE parallel folding, Liu et al.
2025, arXiv 2504.14960): attention runs on tp × sp × dp, the routed experts on etp × ep × edp of the
same ranks. Each rank holds 1/ep of every MoE layer's routed experts, each split etp ways along its FFN
width; the router, the shared experts and every other block are not split by it. The experts'
gradients are summed over the expert-data-parallel ranks (edp), where ZeRO shards their states
(meshplan.costmodel.axes.dp, memory.zero_sharded).

Tokens (Megatron-Core's token dispatchers, megatron/core/transformer/moe/token_dispatcher.py): a rank
routes the tokens it holds — its sequence shard, and under Megatron-SP its 1/tp of it, T_d tokens —
and its experts run the routed copies the etp group gathered, etp · T_d · top_k of them when routing
is even. Per MoE layer, forward:

- alltoall: the T_d · top_k copies all-to-all over ep (dispatch), all-gathered over etp; the outputs
  reduce-scattered over etp and all-to-all back (combine);
- allgather: the T_d tokens all-gathered over etp × ep (every rank picks its experts' copies), the
  outputs reduce-scattered back;
- deepep (DeepEP's kernels, Megatron's flex dispatcher): one all-to-all over etp × ep, a token sent
  once to each rank and each node holding one of its experts (DeepEP's get_dispatch_layout counts it
  once a rank over NVLink and once a node over RDMA), forwarded inside the node over NVLink; with
  node-limited routing (DeepSeek-V3 §2.1.2) a token reaches at most 4 nodes. Megatron sends bf16 (it
  does not use DeepEP's FP8 dispatch).

Backward runs each collective's gradient (four passes of the all-to-all in all); full recompute runs
the forward's again (six). Under Megatron-Core's 1F1B all-to-all overlap the dispatches hide behind
another micro-batch's expert compute and the combines behind the rest of its layer
(step._paired_exposed). Uneven routing: the busiest rank receives `CostOptions.expert_load` times
the even share, and every all-to-all waits for it.
"""

from dataclasses import replace

from meshplan.costmodel.axes.base import Sharding
from meshplan.costmodel.collectives import Comm
from meshplan.layout import Layout

# DeepSeek-V3 (arXiv 2412.19437 §2.1.2, config.json topk_group): a token's experts lie on at most 4
# nodes (its 8 experts are chosen within the 4 best of 8 expert groups, a group a node).
DEEPEP_NODE_LIMIT = 4
_GRADIENT = {
    "all_to_all": "all_to_all",
    "all_gather": "reduce_scatter",
    "reduce_scatter": "all_gather",
    "all_reduce": "all_reduce",  # the partial input gradients of the etp ranks, summed (as TP's)
}


def active(layout: Layout) -> bool:
    """The experts are laid out by their own axes: split otherwise than attention (over ep, or etp ≠ tp:
    etp = 1 under tp keeps them whole on every tensor rank), or over an expert-tensor axis."""
    return layout.expert_axes


def violation(model, layout: Layout, opts) -> str | None:
    """Megatron-Core's rule for training a mixture of experts under tensor parallelism: sequence
    parallelism on (MoELayer.forward raises "During training, performance may degrade if MoE and
    tensor parallelism are enabled without also enabling sequence parallelism") — the experts route
    each tensor rank's own sequence shard. Then the 1F1B all-to-all overlap's conditions (DeepEP's
    refusal to pad is CostOptions'). None when the plan keeps them."""
    if model.moe is None or not opts.training:
        return None
    return tensor_violation(model, layout, opts) or (_overlap_violation(layout, opts) if opts.moe_a2a_overlap else None)


def tensor_violation(model, layout: Layout, opts) -> str | None:
    """Megatron-SP under the tensor axis in training (the mesh-wide part of `violation`), where the stack
    asks it (Stack.moe_needs_tp_sequence_parallel: not meshplan's executor, whose every tensor rank routes
    all its shard's tokens, meshplan/executor/layouts/ep.py, as block_comms and expert_sharding price it)."""
    if model.moe is None or not opts.training or layout.tensor_degree == 1 or opts.tp_sequence_parallel:
        return None
    if not opts.stack_spec.moe_needs_tp_sequence_parallel:
        return None
    axis = "tpssm" if layout.tpssm > 1 else "tp"
    return (
        f"layout {layout}: a mixture of experts with tensor parallelism needs Megatron-SP (Megatron-Core "
        f"routes each tensor rank's sequence shard); add --tp-sequence-parallel or drop {axis}"
    )


def _overlap_violation(layout: Layout, opts) -> str | None:
    """--overlap-moe-expert-parallel-comm's conditions (Megatron-Core 0.14, transformer_config.py):
    ep > 1, the alltoall or flex (DeepEP) dispatcher, no full recompute, and virtual stages under a
    pipeline."""
    if not opts.stack_spec.moe_a2a_overlap:
        return f"--moe-a2a-overlap: stack {opts.stack} does not overlap the experts' all-to-all; use --stack megatron"
    if layout.ep == 1:
        return "--moe-a2a-overlap overlaps the expert-parallel all-to-all: it needs ep > 1"
    if opts.moe_dispatcher == "allgather":
        return "--moe-a2a-overlap needs the alltoall or deepep dispatcher (Megatron-Core's rule)"
    if opts.recompute == "full":
        return "--moe-a2a-overlap does not run with full recompute (Megatron-Core's rule); use selective or none"
    if opts.recomputes("moe"):  # transformer_config.py: 'disable moe in recompute_modules when enabling ...'
        return "--moe-a2a-overlap does not run with the moe recompute module (Megatron-Core's rule); drop moe"
    if layout.pp > 1 and opts.chunks == 1:
        return "--moe-a2a-overlap under a pipeline needs virtual stages (Megatron-Core's rule): --schedule interleaved"
    return None


def sharding(layout: Layout, options, kind: str | None = None) -> Sharding:
    """The expert axis composes with nothing: the experts' sharding replaces attention's
    (expert_sharding), every other kind keeps attention's."""
    return Sharding(1, 1, 1, 1, 1)


def etp_gathers(layout: Layout, base: Sharding) -> bool:
    """Whether the etp group's ranks route different tokens, so that each gathers the others' copies
    (and reduce-scatters the outputs back): under Megatron-SP (each tensor rank its 1/tp of the tokens),
    or where the group reaches past one tensor group's ranks (etp not dividing tp: etp is innermost in
    rank_order.EXPERT_ORDER, so the group then spans sp or dp ranks, which hold other tokens). Otherwise
    every etp rank holds the same tokens and their partial outputs are all-reduced."""
    etp = layout.expert_tensor_degree
    return etp > 1 and (base.hidden_div > 1 or layout.tensor_degree % etp != 0)


def expert_sharding(base: Sharding, layout: Layout) -> Sharding:
    """The routed experts' sharding given attention's `base`: weights over etp × ep; the etp group's
    dispatched tokens on each rank (a rank's own T_d = b·s / (token_div · hidden_div), etp of them, where
    the group's ranks route different tokens — or, where they route the same ones (no Megatron-SP, etp
    within the tensor ranks), those tokens once); the FFN width over etp; full-width copies not split
    further."""
    etp = layout.expert_tensor_degree
    # Where the etp ranks hold the same tokens (no Megatron-SP) the experts run them once.
    gathered = etp if etp_gathers(layout, base) else 1
    return Sharding(
        weight_div=etp * layout.ep,
        token_div=base.token_div * base.hidden_div / gathered,
        head_div=etp,
        hidden_div=1,
        vocab_div=1,
    )


def _dispatch_and_combine(a2a: Comm, opts) -> list[Comm]:
    """The all-to-all of a layer's forward, dispatch and combine. Under Megatron-Core's 1F1B all-to-all
    overlap (training) a layer's forward of one micro-batch runs beside its backward of another
    (models/common/model_chunk_schedule_plan.py): the dispatches beside the other's expert MLP
    ("block"), the combines beside its attention, the rest of the layer ("layer")."""
    paired = opts.moe_a2a_overlap and opts.training
    return [
        replace(a2a, what="dispatch tokens to experts", overlap="block" if paired else a2a.overlap),
        replace(a2a, what="combine expert outputs", overlap="layer" if paired else a2a.overlap),
    ]


def dispatched_tokens(ctx) -> float:
    """T_d: the tokens a rank routes (its sequence shard; under Megatron-SP its 1/tp of it)."""
    return ctx.tokens / ctx.sharding.hidden_div


def block_comms(ctx, kind: str):
    if kind != "experts":
        return []
    layout, opts = ctx.layout, ctx.opts
    m, e = ctx.model.moe, ctx.act_bytes
    etp, ep = layout.expert_tensor_degree, layout.ep
    load = opts.expert_load
    tokens = dispatched_tokens(ctx) * m.hidden * e  # bytes of the tokens a rank routes
    copies = tokens * m.top_k * load  # the busiest rank's routed copies
    dispatcher = opts.moe_dispatcher
    fwd: list[Comm] = []
    if dispatcher == "allgather":
        group = etp * ep
        if group > 1:
            gathered = group * tokens  # every token, whichever experts it goes to
            fwd = [
                Comm("all_gather", "etp+ep", gathered, group, block=kind, what="gather tokens to every expert rank"),
                Comm("reduce_scatter", "etp+ep", gathered, group, block=kind, what="reduce-scatter expert outputs"),
            ]
    elif dispatcher == "deepep":
        # One group, etp × ep: a token goes to every etp rank of each expert it is routed to.
        group = etp * ep
        if group > 1:
            limit = min(DEEPEP_NODE_LIMIT, m.top_k) if opts.deepep_node_limit else 0
            one = Comm("all_to_all", "etp+ep", etp * copies, group, block=kind, fanout=etp * m.top_k, node_limit=limit)
            fwd = _dispatch_and_combine(one, opts)
    else:
        a2a = _dispatch_and_combine(Comm("all_to_all", "ep", copies, ep, block=kind), opts) if ep > 1 else []
        gather = []
        if etp_gathers(layout, ctx.sharding):
            gathered = etp * copies
            gather = [
                Comm("all_gather", "etp", gathered, etp, block=kind, what="gather routed tokens over etp"),
                Comm("reduce_scatter", "etp", gathered, etp, block=kind, what="reduce-scatter expert outputs over etp"),
            ]
        elif etp > 1:  # every etp rank holds the same tokens (no Megatron-SP, etp within tp): sum the partial outputs
            gather = [Comm("all_reduce", "etp", copies, etp, block=kind, what="all-reduce expert outputs over etp")]
        fwd = a2a[:1] + gather + a2a[1:]
    if not opts.training:
        return fwd
    bwd = [replace(c, kind=_GRADIENT[c.kind], phase="bwd", what=f"{c.what}: gradient") for c in reversed(fwd)]
    if opts.recomputes("moe"):  # the recomputed forward (whole layer, or the MoE layer) routes the tokens again
        bwd = [replace(c, phase="bwd", what=f"{c.what}: recomputed") for c in fwd] + bwd
    return fwd + bwd

"""The data-parallel axis, DP ranks, with ZeRO (Rajbhandari et al. 2020) over it — and, for weights the
sequence axis replicates, over DP × Σ (meshplan.layout.grad_group). What it adds to a step's
communication: the gradient sync (an all-reduce, or ZeRO's reduce-scatter and the updated
parameters' all-gather) behind the backward but for the last-ready weights; ZeRO-3's gathers of every
layer's parameters each micro-batch; under pipeline stages ZeRO-2 reduce-scatters each micro-batch.
"""

from meshplan.costmodel.blocks import fp8_param_share
from meshplan.costmodel.collectives import Comm
from meshplan.layout import Layout, grad_group


def zero_stage(layout: Layout, stack) -> int:
    """The ZeRO stage that applies: over the data-parallel ranks, and over the sequence ranks too where
    the stack shards there (Stack.zero_over_sequence); 0 where that leaves one rank."""
    ranks = layout.dp * (layout.sp if stack is not None and stack.zero_over_sequence else 1)
    return layout.zero if ranks > 1 else 0


def expert_zero_stage(layout: Layout) -> int:
    """The ZeRO stage over the routed experts' own data-parallel ranks (edp): Megatron's distributed
    optimizer shards them there whatever dp is; 0 where edp is one rank."""
    return layout.zero if layout.expert_data_degree > 1 else 0


def comms(ctx, local_params: float, last_ready: float, experts: float = 0.0) -> tuple[list[Comm], list[Comm]]:
    """(per micro-batch, per step) of a training step or a prefill; `local_params`: a rank's parameters
    (averaged over the stages), `last_ready`: those whose gradients the backward completes last;
    `experts`: the part of `local_params` that is routed experts split by ep, whose gradients are
    summed over the expert-data-parallel ranks instead (meshplan.costmodel.axes.ep)."""
    layout: Layout = ctx.layout
    axis, group = grad_group(layout)
    if experts:
        zero = zero_stage(layout, ctx.opts.stack_spec)
        dense_mb, dense_step = _group_comms(ctx, axis, group, local_params - experts, last_ready, zero=zero)
        edp = layout.expert_data_degree
        expert_mb, expert_step = _group_comms(
            ctx, "edp", edp, experts, None, what=" (experts)", zero=expert_zero_stage(layout), experts=True
        )
        return dense_mb + expert_mb, dense_step + expert_step
    return _group_comms(ctx, axis, group, local_params, last_ready, zero=zero_stage(layout, ctx.opts.stack_spec))


def _group_comms(
    ctx,
    axis: str,
    group: int,
    local_params: float,
    last_ready: float | None,
    what: str = "",
    *,
    zero: int,
    experts: bool = False,
) -> tuple[list[Comm], list[Comm]]:
    """The gradient sync and ZeRO's collectives of `local_params` over one group of ranks (`last_ready`:
    None when no part of them is the backward's last, as the experts' are not)."""
    layout: Layout = ctx.layout
    training = ctx.opts.training
    per_mb: list[Comm] = []
    per_step: list[Comm] = []
    if group == 1 or not (training or zero == 3):
        return per_mb, per_step
    p_bytes, g_bytes = local_params * gathered_param_bytes(ctx, experts), local_params * ctx.grad_bytes
    # Under pipeline stages the micro-batches' gradients stay sharded only if each micro-batch
    # reduce-scatters its own (ZeRO 2 as ZeRO 3 always does): once per micro-batch there.
    per_mb_grads = zero == 3 or (zero == 2 and layout.pp > 1)
    if per_mb_grads and training:
        per_mb.append(
            Comm(
                "reduce_scatter",
                axis,
                g_bytes,
                group,
                phase="bwd",
                block="model",
                what=f"ZeRO-{zero} grad reduce-scatter{what}",
                overlap="backward",
            )
        )
    if zero == 3:
        per_mb.append(
            Comm("all_gather", axis, p_bytes, group, phase="fwd", block="model", what="ZeRO-3 gather params" + what)
        )
        if training:
            per_mb.append(
                Comm(
                    "all_gather",
                    axis,
                    p_bytes,
                    group,
                    phase="bwd",
                    block="model",
                    what="ZeRO-3 re-gather params" + what,
                )
            )
    elif per_mb_grads:  # ZeRO 2 under pp: its gradients went per micro-batch
        per_step.append(
            Comm(
                "all_gather", axis, p_bytes, group, phase="step", block="model", what="updated params all-gather" + what
            )
        )
    else:
        tail = min(g_bytes, last_ready * ctx.grad_bytes) if last_ready is not None else 0.0
        kind = "reduce_scatter" if zero >= 1 else "all_reduce"
        kind_what = ("grad reduce-scatter" if zero >= 1 else "grad all-reduce") + what
        per_step += [
            Comm(kind, axis, g_bytes - tail, group, phase="step", block="model", what=kind_what, overlap="backward"),
        ]
        if last_ready is not None:
            per_step.append(
                Comm(
                    kind, axis, tail, group, phase="step", block="model", what=kind_what + " of the last-ready weights"
                )
            )
        if zero >= 1:
            per_step.append(
                Comm(
                    "all_gather",
                    axis,
                    p_bytes,
                    group,
                    phase="step",
                    block="model",
                    what="updated params all-gather" + what,
                )
            )
    return per_mb, per_step


def gathered_param_bytes(ctx, experts: bool = False) -> float:
    """Bytes a parameter moves in a parameter all-gather: its dtype's; under --fp8-param-gather
    (Megatron-Core: the FP8 GEMMs' weights kept and gathered in FP8) 1 for the FP8 GEMMs' weights —
    every routed expert's (`experts`), else their share of the model's parameters (blocks.fp8_param_share)."""
    if not ctx.opts.fp8_param_gather:
        return ctx.param_bytes
    share = 1.0 if experts else fp8_param_share(ctx.model)
    return ctx.param_bytes - share * (ctx.param_bytes - 1)


def decode_comms(ctx, local_params: float) -> list[Comm]:
    """ZeRO-3 gathers every weight for every decoded token."""
    layout = ctx.layout
    axis, group = grad_group(layout)
    if not (zero_stage(layout, ctx.opts.stack_spec) == 3 and group > 1):
        return []
    p_bytes = local_params * gathered_param_bytes(ctx)
    return [Comm("all_gather", axis, p_bytes, group, block="model", what="ZeRO-3 gather params")]

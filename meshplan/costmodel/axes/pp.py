"""The pipeline axis, P ranks: the layers split into stages (meshplan.costmodel.pipeline prices the
schedule). What it adds to the step's communication: each stage's sends of a micro-batch — its
output forward, its input's gradient backward, once a model chunk under the interleaved schedule —
and, for a tied embedding, the sum of its two copies' gradients on the first and last stages.
"""

from dataclasses import replace

from meshplan.costmodel.collectives import Comm
from meshplan.layout import Layout


def active(layout: Layout) -> bool:
    return layout.pp > 1


def microbatch_comms(ctx, training: bool) -> list[Comm]:
    """A stage's sends of one micro-batch. Along a line of stages the last sends nothing forward, the
    first nothing backward. With scatter/gather (Narayanan et al. 2021 §4.1) each of the t tensor
    ranks sends 1/t of the (replicated) activation across the network and the receiving stage
    all-gathers it over NVLink; with Megatron-SP the activation is already split t ways."""
    model, layout, opts = ctx.model, ctx.layout, ctx.opts
    if layout.pp == 1:
        return []
    t = layout.tensor_degree
    act = ctx.tokens * stream_width(model) * ctx.act_bytes
    split = opts.tp_sequence_parallel and t > 1
    scatter = opts.scatter_gather and t > 1 and not split
    if split or scatter:
        act /= t
    chunks = opts.chunks
    phases = ("fwd", "bwd") if training else ("fwd",)
    out = []
    for phase in phases:
        what = "activations to next stage" if phase == "fwd" else "activation grads to previous stage"
        out.append(
            Comm("send_recv", "pp", act, layout.pp, count=chunks, phase=phase, block="model", what=what, line=True)
        )
        if scatter:
            axis = "tpssm" if layout.tpssm > 1 else "tp"
            out.append(
                Comm(
                    "all_gather",
                    axis,
                    act * t,
                    t,
                    count=chunks,
                    phase=phase,
                    block="model",
                    what="scatter/gather: re-assemble the received activations",
                )
            )
    return out


def decode_comms(ctx) -> list[Comm]:
    """A decoded token's activations, stage to stage."""
    layout = ctx.layout
    if layout.pp == 1:
        return []
    act = ctx.batch * stream_width(ctx.model) * ctx.act_bytes
    return [Comm("send_recv", "pp", act, layout.pp, block="model", what="activations to next stage", line=True)]


def end_comms(ctx, training: bool) -> list[Comm]:
    """A tied matrix's two copies, on the first and last stages, sum their gradients once a step."""
    layout, model = ctx.layout, ctx.model
    if not (training and layout.pp > 1 and model.tied_embeddings):
        return []
    return [
        Comm(
            "all_reduce",
            "pp_ends",
            model.vocab * model.d_model * ctx.grad_bytes / ctx.sharding.weight_div,
            2,
            phase="step",
            block="embedding",
            what="tied embedding grads (first and last stage)",
            ranks_share=2 / layout.pp,
        )
    ]


def stream_width(model) -> int:
    """What a stage sends of each token: its hidden state, and a Zamba2's token embeddings beside it
    (the shared blocks of later stages read them; their gradient comes back with the hidden state's)."""
    return 2 * model.d_model if model.family == "hybrid" else model.d_model


def shared_copy_holders(model, pp: int) -> tuple[int, ...]:
    """How many of `pp` even stages hold each of a Zamba2's shared block copies: those whose layers
    invoke it (the k-th hybrid layer invokes copy k mod shared_blocks); () for other models or one stage."""
    if model.family != "hybrid" or pp == 1:
        return ()
    per = model.layers // pp
    stages: dict[int, set[int]] = {}
    for k, layer in enumerate(model._hybrid_ids()):
        stages.setdefault(k % model.shared_blocks, set()).add(min(layer // per, pp - 1))
    return tuple(len(stages.get(j, ())) for j in range(model.shared_blocks))


def shared_copy_params(model, weight_div: float) -> float:
    """One shared block copy's parameters on a rank: its attention's and MLP's weights split
    `weight_div` ways, their norm scales whole."""
    from meshplan.costmodel.blocks import BLOCKS

    kinds = model.shared_block_kinds()
    norms = sum(BLOCKS[k].norm_width(model) for k in kinds)
    return (sum(BLOCKS[k].params(model) for k in kinds) - norms) / weight_div + norms


def extra_copy_params(model, pp: int, weight_div: float) -> float:
    """The shared copies the pipeline's stages hold beyond one each (summed over the stages)."""
    return sum(n - 1 for n in shared_copy_holders(model, pp)) * shared_copy_params(model, weight_div)


def step_comms(ctx, training: bool) -> list[Comm]:
    """A Zamba2's shared block copies held on several stages: their gradients summed over those stages
    once a step (the executor: parallelize.GradientSync over pp), each copy's on its holders."""
    layout, model = ctx.layout, ctx.model
    if not (training and layout.pp > 1):
        return []
    per_rank = shared_copy_params(model, ctx.sharding.weight_div) * ctx.grad_bytes
    return [
        Comm(
            "all_reduce",
            "pp",
            per_rank,
            n,
            phase="step",
            block="shared",
            what="shared block copies' grads (stages holding them)",
            ranks_share=n / layout.pp,
        )
        for n in shared_copy_holders(model, layout.pp)
        if n > 1
    ]


def on_end_stages(comms: list[Comm], layout: Layout) -> list[Comm]:
    """The embedding runs on the first stage and the head on the last: each on 1/pp of the ranks."""
    return [c if c.axis == "pp_ends" else replace(c, ranks_share=c.ranks_share / layout.pp) for c in comms]

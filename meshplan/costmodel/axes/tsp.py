"""The TSP axis, D ranks (Shyam, Golubeva, Anthony — arXiv 2604.26294): tensor and sequence folded onto
one axis.

Each rank owns 1/D of every weight matrix and 1/D of the tokens. Attention: the packed
W_Q,W_K,W_V,W_O shards are broadcast in turn and K/V are all-gathered in zigzag order; gated MLP:
the W_gate,W_up,W_down shards circulate in a ring, overlapped with the GEMMs, with the partial
outputs accumulated locally (no all-reduce). So weight memory is TP's at degree D and activation
memory is SP's at degree D; the extra is in flight: double-buffered weight shards and the gathered K/V.
"""

from meshplan.costmodel.axes import sp
from meshplan.costmodel.axes.base import Sharding
from meshplan.costmodel.blocks import streamed_block_params
from meshplan.costmodel.collectives import Comm
from meshplan.costmodel.options import MemoryOptions
from meshplan.layout import Layout


def active(layout: Layout) -> bool:
    return layout.tsp > 1


def sharding(layout: Layout, options: MemoryOptions, kind: str | None = None) -> Sharding:
    d = layout.tsp
    return Sharding(
        weight_div=d, token_div=d, head_div=1, hidden_div=1, vocab_div=1, gathers_kv=True, streams_weights=True
    )


def block_comms(ctx, kind: str):
    """Attention: D broadcasts of the packed W_Q,W_K,W_V,W_O shards (one per owner) and the zigzag
    K/V all-gather. Gated MLP (and Mamba blocks): D − 1 ring hops of the weight shard (hidden behind the
    MLP's GEMMs; a Mamba block waits for all of them). Backward
    re-streams the shards the same way, re-gathers K/V, reduce-scatters dK/dV, and reduce-scatters
    the weight gradients (every rank holds partial gradients of every shard from its own tokens).
    Mamba blocks also hand the chunk-final state along the sequence, as SP does."""
    d = ctx.layout.tsp
    if d == 1 or kind == "hybrid_proj" or not ctx.sharding_of(kind).streams_weights:
        return []  # (the routed experts under ep are split, not streamed: meshplan.costmodel.axes.ep)
    params = streamed_block_params(ctx.model, kind)
    shard = params * ctx.param_bytes / d
    grads = params * ctx.grad_bytes
    if kind == "attention":
        stream = [
            Comm(
                "broadcast",
                "tsp",
                shard,
                d,
                count=d,
                phase=phase,
                block=kind,
                what="attention weight shards",
                overlap="gemm",
            )
            for phase in ("fwd", "bwd")
        ]
    elif kind in ("mamba2", "mamba1"):
        # The executor's Mamba-2 block gathers every shard along the ring before its mixer runs, in
        # forward and again in backward (meshplan/executor/layouts/tsp_mamba.py): nothing hides it.
        stream = [
            Comm(
                "send_recv", "tsp", shard, d, count=d - 1, phase=phase, block=kind, what="weight shard ring (gathered)"
            )
            for phase in ("fwd", "bwd")
        ]
    else:
        stream = [
            Comm(
                "send_recv",
                "tsp",
                shard,
                d,
                count=d - 1,
                phase=phase,
                block=kind,
                what="weight shard ring",
                overlap="gemm",
            )
            for phase in ("fwd", "bwd")
        ]
    # Issued when the block's backward ends, and waited on (the executor does not overlap it yet).
    grad_rs = Comm("reduce_scatter", "tsp", grads, d, phase="bwd", block=kind, what="weight-grad reduce-scatter")
    return stream + [grad_rs] + sp.block_comms(ctx, kind, axis="tsp")


def end_comms(ctx, training: bool) -> list[Comm]:
    """The LM head's column shards around the ring (behind its GEMM), the embedding rows sent to the
    tokens' owners, and the head's gradient reduce-scatter."""
    d = ctx.layout.tsp
    if d == 1:
        return []
    model, e, h = ctx.model, ctx.act_bytes, ctx.model.d_model
    shard = model.vocab * h * ctx.param_bytes / d
    phases = ("fwd", "bwd") if training else ("fwd",)
    out = [
        Comm(
            "send_recv",
            "tsp",
            shard,
            d,
            count=d - 1,
            phase=p,
            block="logits",
            what="LM head shard ring",
            overlap="gemm",
        )
        for p in phases
    ]
    out += [
        Comm(
            "all_to_all",
            "tsp",
            ctx.tokens * h * e,
            d,
            phase=p,
            block="embedding",
            what="embedding rows to token owners",
        )
        for p in phases
    ]
    if training:
        out.append(
            Comm(
                "reduce_scatter",
                "tsp",
                model.vocab * h * ctx.grad_bytes,
                d,
                phase="bwd",
                block="logits",
                what="LM head grad reduce-scatter",
                # exposed: the executor waits for it before the layers' backward goes on
                # (executor/layouts/vocab.py _TSPLogits.backward → comm.ring_weight_grads)
            )
        )
    return out


def step_comms(ctx, embeddings: bool) -> list[Comm]:
    """TSP keeps the norm scales on every rank; each rank's gradient comes from its own tokens."""
    layout = ctx.layout
    if layout.tsp == 1 or not ctx.opts.training:
        return []
    norms = ctx.model.norm_params(embeddings) / layout.pp * ctx.grad_bytes
    return [
        Comm(
            "all_reduce",
            "tsp",
            norms,
            layout.tsp,
            phase="step",
            block="model",
            what="norm-scale grads",
            overlap="backward",
        )
    ]


def decode_comms(ctx, kind: str) -> list[Comm]:
    return sp.decode_comms(ctx, kind, axis="tsp")


def motion_bytes(model, kind: str, tokens: float, d: int, e: int, rows: float = 1.0) -> tuple[float, float]:
    """(forward, backward) bytes meshplan's executor moves around one TSP block's GEMMs and attention on a
    rank with `tokens` local tokens, beyond what the block's own elementwise work (its memory-bound bytes)
    and the zigzag reorder (blocks.attention.zigzag_motion_bytes) move: as benchmarks/tsp_bytes.py counts
    executor/layouts/tsp.py's ops (tests hold the two equal). W = the rank's packed weight shard
    (streamed_block_params / D, e bytes each), X = tokens · hidden · e.
    - Attention: the shard packed (torch.cat, read and written: 2W) forward and again backward; forward,
      the D shards' partial outputs summed (D − 1 adds, 3X each) and the saved q, outputs, K and V
      concatenated over the shards (2 · tokens · (2·q + 2·kv) · e; with query/key norms their inputs
      and fp32 rstd too); backward, the input gradient zero-filled (X) and each hop's three products added into it
      (9X a hop), and each hop's slice of the saved K and V made contiguous for its gather (2 · tokens ·
      kv · e over the hops, K and V), and the query/key norm scales' gradients zero-filled and summed over
      the hops. With more than one sequence row (`rows`, the batch), each hop's gathered K and V (tokens ·
      kv · e each) are concatenated out of NCCL's rank-major buffer, forward and backward (comm.all_gather_start),
      and backward their gradients laid out rank-major for the reduce-scatter, one copy (comm.reduce_scatter).
    - Gated (or squared-ReLU) MLP: 2W forward and backward; forward D − 1 adds (3X each); backward the
      zero fill (X) and one add a hop (3X).
    - An MoE block's shared expert: its ring as a gated MLP's (TSPSharedExpert), and Qwen2-MoE's gate
      (RingColumnsFn): its one-wide output zero-filled and summed over the hops, and backward the input
      gradient's columns copied into place (2X). The router (RingRowsFn): each hop's output columns copied
      into place (2 · tokens · experts · e), backward the zero fill (X) and an add a hop (3X).
    - Mamba-2: _mamba2_motion_bytes.
    Other kinds (Mamba-1, the routed experts, which ep splits and TSP does not stream): 0."""
    if d <= 1 or kind not in ("attention", "mlp", "mamba2", "router", "shared_expert"):
        return 0.0, 0.0
    if kind == "mamba2":
        return _mamba2_motion_bytes(model, tokens, d, e)
    if kind == "shared_expert" and not model.moe.shared_ffn:
        return 0.0, 0.0
    x = tokens * model.d_model * e
    if kind == "router":
        # RingRowsFn: each hop's columns of the router's output copied into place (tokens · experts · e, read
        # and written); backward the input gradient zero-filled and each hop's product added in
        return 2 * tokens * model.moe.experts * e, x + 3 * d * x
    if kind == "shared_expert":  # its _TSPMlpFn ring carries [gate; up] and down, not the shared gate's row
        m = model.moe
        shard = (m.n_input_matrices + 1) * m.hidden * m.shared_ffn / d * e
    else:
        shard = streamed_block_params(model, kind) / d * e
    fwd = bwd = 2 * shard
    if kind == "shared_expert" and model.moe.shared_gate:
        # RingColumnsFn (Qwen2-MoE's gate, one output): its output zero-filled and each hop's product added
        # in; backward each hop's input-gradient columns copied into place
        fwd += tokens * e * (1 + 3 * d)
        bwd += 2 * x
    fwd += 3 * (d - 1) * x
    bwd += x
    if kind in ("mlp", "shared_expert"):
        return fwd, bwd + 3 * d * x
    a = model.attention
    fwd += 2 * tokens * (2 * a.q_width + 2 * a.kv_width) * e
    if a.qk_norm:  # the norms' inputs and their fp32 rstd a head, concatenated over the shards
        fwd += 2 * tokens * ((a.q_width + a.kv_width) * e + (a.heads + a.kv_heads) * 4)
    bwd += 9 * d * x + 2 * tokens * 2 * a.kv_width * e
    if rows >= 2:
        gathered = tokens * a.kv_width * e  # one hop's gathered K (or V): D ranks' tokens, the shard's kv / D
        fwd += d * 2 * 2 * gathered
        bwd += d * 2 * 2 * gathered * 2
    if a.qk_norm:  # the norm scales' gradients: zero-filled, each hop's added in
        bwd += (1 + 3 * d) * a.qk_norm * e
    return fwd, bwd


def _mamba2_motion_bytes(model, tokens: float, d: int, e: int) -> tuple[float, float]:
    """A Mamba-2 block's TSP motion (executor/layouts/tsp_mamba.py), W = its whole weights but the input
    norm's scale (streamed_block_params · e), S = W / D the rank's packed shard. Forward, the whole weights
    gathered: the shard packed (torch.cat, 2S), placed into the ring's (D, S) buffer with each hop's
    arrival (2W), each weight rebuilt from the D rows (torch.cat, 2W). Backward: gathered again, the
    in_proj output's gradient cloned (2 · tokens · in_proj width · e), the whole gradients cut into the D
    shards' packing — out_proj's column chunks made contiguous (2 · out_proj), each rank's row
    concatenated (2W) and the rows stacked (2W) — for the reduce-scatter."""
    m = model.mamba2
    w = streamed_block_params(model, "mamba2") * e
    gather = 2 * w / d + 2 * w + 2 * w
    out_proj = m.d_inner * m.d_model * e
    return gather, gather + 2 * tokens * m.in_proj_width * e + 2 * out_proj + 4 * w


def head_motion_bytes(model, tokens: float, d: int, e: int) -> tuple[float, float]:
    """(forward, backward) bytes TSP's LM head moves beyond the cross-entropy over fp32 logits that
    compute.logits_compute prices (48 bytes a logit: executor/layouts/vocab.py _VocabParallelCE), as
    tsp_bytes.py counts _TSPLogits: forward, the first shard's product converted to fp32 (read e, write 4
    bytes a logit) and each later one added in (read 4 + e, write 4); backward, the logits' gradient cast to
    e (read 4, write e) and each hop's input-gradient columns copied into place (tokens · hidden · e, read
    and written). In fp32 (e = 4) the casts are no copies."""
    if d <= 1:
        return 0.0, 0.0
    logits = tokens * model.vocab
    cast = 0 if e == 4 else 4 + e  # an fp32 model's .to(fp32) is no copy
    fwd = logits * (cast + (d - 1) * (8 + e))
    bwd = logits * cast + 2 * tokens * model.d_model * e
    return fwd, bwd

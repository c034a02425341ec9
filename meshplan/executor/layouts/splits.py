"""Which slice of each reference weight a rank's module holds, written as tables: the executor's twin
of the cost model's `Sharding.weight_div` (tests/test_layout_tables.py holds the two together).

A weight is cut along `dim` into its parts — the segments of a fused matrix: [Q; K; V] rows, [gate;
up] rows, Mamba-2's [z; x; B; C; dt] rows — and each part into `degree` equal pieces, of which rank r
keeps piece r; a part marked whole is kept entire by every rank (Mamba-2's B/C group when it spans
the tensor axis). `dim` None keeps the weight whole (the norm scales, applied to a rank's own tokens).

    layout (axis)      module                    table
    tp, tp+sp          dense.ParallelAttention   attention_splits
                       dense.ParallelMLP         mlp_splits
    tsp                tsp.TSPAttention          attention_splits
                       tsp.TSPMLP                mlp_splits
    tpssm, tpssm+sp    mamba.ParallelMamba2      mamba2_splits
    tsp                tsp_mamba.TSPMamba2       contiguous_splits (one part a weight)
    tp, tpssm (Zamba2) hybrid.HybridProjection  hybrid_proj_splits (its shared blocks: attention_splits,
                                                 mlp_splits; its Mamba-2 mixers: mamba2_splits)
    tp (MoE)           ep.ExpertParallelMoE      shared_expert_splits; the routed experts over ep, then
                                                 expert_splits over etp (whole where etp = 1)
    tsp (MoE)          ep.ExpertParallelMoE      router_split, shared_expert_splits (streamed; the routed
                                                 experts: whole, over ep)
    tp / tpssm; tsp    vocab.ParallelEmbedding,  vocab_split (vocabulary rows; hidden columns)
                       vocab.ParallelHead
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Part:
    size: int  # rows (or columns) of the part in the reference weight
    split: bool = True  # cut into `degree` pieces, or kept whole by every rank


@dataclass(frozen=True)
class Split:
    dim: int | None  # the dimension cut; None: the whole weight on every rank
    parts: tuple[Part, ...] = ()

    def indices(self, degree: int, rank: int) -> torch.Tensor | None:
        """The reference rows (or columns) rank `rank` of `degree` keeps, in order; None for a whole weight."""
        if self.dim is None:
            return None
        pieces, offset = [], 0
        for part in self.parts:
            n = part.size // degree if part.split else part.size
            start = offset + (rank * n if part.split else 0)
            pieces.append(torch.arange(start, start + n))
            offset += part.size
        return torch.cat(pieces)

    def local_numel(self, shape: tuple[int, ...], degree: int) -> int:
        """Elements a rank holds of a reference weight of `shape`."""
        if self.dim is None:
            return int(torch.Size(shape).numel())
        kept = sum(p.size // degree if p.split else p.size for p in self.parts)
        return int(torch.Size(shape).numel()) // shape[self.dim] * kept


WHOLE = Split(None)


def _cut(dim: int, *sizes: int) -> Split:
    return Split(dim, tuple(Part(n) for n in sizes))


def attention_splits(q_width: int, kv_width: int, qk_norm: bool = False) -> dict[str, Split]:
    """Megatron's TP of attention (TSP folds the same split onto its one axis): Q, K and V rows
    column-parallel, part by part; W_O row-parallel (its input columns); the per-head query and key
    norms' scales (`qk_norm`: Qwen3's) whole, as every head takes the same one."""
    norms = {"q_norm.weight": WHOLE, "k_norm.weight": WHOLE} if qk_norm else {}
    return {
        "attn_norm.weight": WHOLE,
        **norms,
        "w_qkv": _cut(0, q_width, kv_width, kv_width),
        "w_o": _cut(1, q_width),
    }


def mlp_splits(ffn: int, gated: bool) -> dict[str, Split]:
    """Megatron's TP of a dense MLP: the [gate; up] rows column-parallel, part by part; W_down
    row-parallel."""
    return {
        "mlp_norm.weight": WHOLE,
        "w_in": _cut(0, ffn, ffn) if gated else _cut(0, ffn),
        "w_down": _cut(1, ffn),
    }


def hybrid_proj_splits(ffn: int, q_width: int, kv_width: int) -> dict[str, Split]:
    """A Zamba2 hybrid layer's own weights on a tensor axis (hybrid.HybridProjection): the linear after
    the shared block whole (it reads the block's summed output; every rank gets the same gradient), each
    LoRA adapter's down projection whole (it reads the replicated input; its gradient, from this rank's
    rows of the up projection, is summed over the axis once a step) and its up rows cut as the
    projection they add to — [gate; up] part by part, Q, K and V by heads."""
    return {
        "linear": WHOLE,
        "mlp_adapter_down": WHOLE,
        "mlp_adapter_up": _cut(0, ffn, ffn),
        "qkv_adapter_down": WHOLE,
        "q_adapter_up": _cut(0, q_width),
        "k_adapter_up": _cut(0, kv_width),
        "v_adapter_up": _cut(0, kv_width),
    }


def shared_expert_splits(ffn: int, gated: bool = True, hidden: int = 0, streamed: bool = False) -> dict[str, Split]:
    """An MoE's shared experts on a tensor axis, as a dense MLP (Megatron-Core's SharedExpertMLP): the
    [gate; up] rows (Nemotron-H's up alone, ungated) column-parallel, part by part; down row-parallel;
    Qwen2-MoE's sigmoid gate (a hidden → 1 projection) whole — or, `streamed` around TSP's ring, its
    `hidden` columns in contiguous pieces (tsp.RingColumnsFn)."""
    gate_up = _cut(0, ffn, ffn) if gated else _cut(0, ffn)
    gate = _cut(1, hidden) if streamed else WHOLE
    return {"w_shared_gate_up": gate_up, "w_shared_down": _cut(1, ffn), "w_shared_gate": gate}


def expert_splits(ffn: int, gated: bool = True) -> dict[str, Split]:
    """Each routed expert's FFN over an expert-tensor axis (etp), as a dense MLP's over tp, on the
    (E, rows, columns) stacks: the [gate; up] rows (the ungated up alone) column-parallel, part by
    part; down's FFN columns row-parallel. Its experts are taken over ep first (ep.ExpertParallelMoE)."""
    return {"w_gate_up": _cut(1, ffn, ffn) if gated else _cut(1, ffn), "w_down": _cut(2, ffn)}


def router_split(experts: int) -> Split:
    """TSP: an MoE router's expert rows in contiguous pieces, streamed around the ring (tsp.RingRowsFn)."""
    return _cut(0, experts)


def dense_splits(q_width: int, kv_width: int, ffn: int, gated: bool, qk_norm: bool = False) -> dict[str, Split]:
    """A dense layer's weights: its attention's and its MLP's."""
    return {**attention_splits(q_width, kv_width, qk_norm), **mlp_splits(ffn, gated)}


def mamba2_splits(d_inner: int, ngroups: int, d_state: int, nheads: int, degree: int) -> dict[str, Split]:
    """TP-SSM (Dutt et al., arXiv 2602.21144): in_proj's z, x, B, C, dt segments each split by rank,
    so that conv1d and the scan stay local; B and C split with their groups where the degree divides
    ngroups, else (one group) kept whole; the heads' dt_bias, A and D, the gated norm's scale and
    out_proj's columns split with the heads."""
    bc = Part(ngroups * d_state, split=ngroups % degree == 0)
    return {
        "norm.weight": WHOLE,
        "in_proj": Split(0, (Part(d_inner), Part(d_inner), bc, bc, Part(nheads))),
        "conv_w": Split(0, (Part(d_inner), bc, bc)),
        "conv_b": Split(0, (Part(d_inner), bc, bc)),
        "dt_bias": _cut(0, nheads),
        "a_log": _cut(0, nheads),
        "d_skip": _cut(0, nheads),
        "norm_w": _cut(0, d_inner),
        "out_proj": _cut(1, d_inner),
    }


def contiguous_splits(shapes: dict[str, tuple[int, ...]], dims: dict[str, int]) -> dict[str, Split]:
    """Each weight cut into contiguous pieces along its dimension (TSP's Mamba-2 block, whose shards
    are gathered whole before use, so no part needs to stay aligned with another)."""
    return {name: _cut(dims[name], shapes[name][dims[name]]) for name in dims}


def vocab_split(vocab: int, hidden: int, columns: bool) -> Split:
    """The vocab × hidden matrix: vocabulary rows on a tensor axis, hidden columns under TSP."""
    return _cut(1, hidden) if columns else _cut(0, vocab)

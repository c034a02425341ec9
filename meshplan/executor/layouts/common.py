"""Pieces the layout modules share: slicing reference weights into shards (remembering which slice
each local parameter is), token shards of a sequence, and causal masks for shard positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from meshplan.kernels.reference import acc


class Sharded(nn.Module):
    """A module whose parameters are slices of a reference module's parameters.

    `index[local_name] = (reference_name, dim, indices)`: the local parameter equals
    reference.index_select(dim, indices); dim None means a full copy."""

    def __init__(self):
        super().__init__()
        self.index: dict[str, tuple[str, int | None, torch.Tensor | None]] = {}

    def take(self, local: str, ref_module: nn.Module, ref_name: str, dim: int | None = None,
             idx: torch.Tensor | None = None) -> None:
        full = dict(ref_module.named_parameters())[ref_name].detach()
        value = full if dim is None else full.index_select(dim, idx)
        # Register nested names (e.g. "attn_norm.weight") on the right submodule.
        owner, _, leaf = local.rpartition(".")
        target = self.get_submodule(owner) if owner else self
        target.register_parameter(leaf, nn.Parameter(value.clone()))
        self.index[local] = (ref_name, dim, idx)


def rows(start: int, length: int) -> torch.Tensor:
    return torch.arange(start, start + length)


def contiguous_tokens(seq: int, parts: int, index: int) -> torch.Tensor:
    """Positions of shard `index` when the sequence is cut into `parts` contiguous pieces."""
    n = seq // parts
    return torch.arange(index * n, (index + 1) * n)


def zigzag_tokens(seq: int, parts: int, index: int) -> torch.Tensor:
    """TSP's causal load balance: 2·parts chunks, rank i takes chunks i and 2·parts − 1 − i."""
    c = seq // (2 * parts)
    return torch.cat([torch.arange(index * c, (index + 1) * c),
                      torch.arange((2 * parts - 1 - index) * c, (2 * parts - index) * c)])


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, device=None) -> torch.Tensor:
    """Boolean (q, k): True where the key may be attended (key position ≤ query position)."""
    out = k_pos.view(1, -1) <= q_pos.view(-1, 1)
    return out if device is None else out.to(device)


def attend_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Causal attention of `q` (b, t, a, d) — the last t of the first kv_len positions — to the
    first kv_len keys of k, v (b, S, a_kv, d), in position order. A lower-right causal bias keeps
    SDPA on its fused kernels, which skip the masked blocks."""
    qh = q.transpose(1, 2)
    kh, vh = k[:, :kv_len].transpose(1, 2), v[:, :kv_len].transpose(1, 2)
    if kh.shape[1] != qh.shape[1]:  # GQA: repeat K/V per query head (CausalBias takes no enable_gqa)
        rep = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
    bias = causal_lower_right(q.shape[1], kv_len)
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias).transpose(1, 2)


def partial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One query token (b, 1, a, d) against some keys (b, S, a_kv, d), all visible: the output and
    the fp32 log-sum-exp per head, so shards of the keys can be combined exactly."""
    rep = q.shape[2] // k.shape[2]
    kh = k.repeat_interleave(rep, 2).transpose(1, 2)  # (b, a, S, d)
    vh = v.repeat_interleave(rep, 2).transpose(1, 2)
    scores = acc(q.transpose(1, 2) @ kh.transpose(-1, -2)) / q.shape[-1] ** 0.5  # (b, a, 1, S)
    lse = torch.logsumexp(scores, dim=-1)  # (b, a, 1)
    out = (torch.softmax(scores, dim=-1).to(v.dtype) @ vh).transpose(1, 2)  # (b, 1, a, d)
    return out, lse


def combine_partials(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Softmax-weighted sum of per-shard attention outputs by their log-sum-exps."""
    lses = torch.stack([lse for _, lse in parts])  # (n, b, a, 1)
    weights = torch.softmax(lses, dim=0).transpose(-1, -2)  # (n, b, 1, a)
    return sum(w.unsqueeze(-1).to(o.dtype) * o for w, (o, _) in zip(weights, parts))

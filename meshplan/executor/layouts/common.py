"""Pieces the layout modules share: the Sharded base (slicing reference weights into shards, remembering
which slice each local parameter is, and saying which gradients stay partial sums) and the Sublayer
base (one pre-norm residual branch of a layer), token shards of a sequence, and causal attention of
shard positions (meshplan.executor.attention's blocks)."""

from __future__ import annotations

import torch
from torch import nn

from meshplan.executor import attention
from meshplan.executor.attention import shard_attention, zigzag_attention
from meshplan.executor.blocks import RMSNorm
from meshplan.kernels.reference import acc


def select(t: torch.Tensor, dim, idx) -> torch.Tensor:
    """t.index_select(dim, idx); dim None: t whole; dims and indices as tuples: each selection in turn
    (an expert weight split over ep and etp: its experts along dim 0, then its FFN slice)."""
    if dim is None:
        return t
    if isinstance(dim, tuple):
        for d, i in zip(dim, idx):
            t = t.index_select(d, i)
        return t
    return t.index_select(dim, idx)


class Sharded(nn.Module):
    """A module whose parameters are slices of a reference module's parameters.

    `index[local_name] = (reference_name, dim, indices)`: the local parameter equals
    select(reference, dim, indices) — reference.index_select(dim, indices), or for a tuple of dims
    each in turn; dim None means a full copy."""

    def __init__(self):
        super().__init__()
        self.index: dict[str, tuple[str, int | tuple | None, torch.Tensor | tuple | None]] = {}

    def take(self, local: str, ref_module: nn.Module, ref_name: str, dim=None, idx=None) -> None:
        full = dict(ref_module.named_parameters())[ref_name].detach()
        value = select(full, dim, idx)
        # Register nested names (e.g. "attn_norm.weight") on the right submodule.
        owner, _, leaf = local.rpartition(".")
        target = self.get_submodule(owner) if owner else self
        target.register_parameter(leaf, nn.Parameter(value.clone()))
        self.index[local] = (ref_name, dim, idx)

    def take_splits(
        self, ref_module: nn.Module, table: dict, degree: int, rank: int, local: dict[str, str] | None = None
    ) -> None:
        """Every weight of a splits table (meshplan.executor.layouts.splits): rank `rank` of `degree`
        takes its slice; a whole dotted entry ("attn_norm.weight") is a norm module, copied whole.
        `local` renames a reference module or weight here ({"attn_norm": "norm"}); `index` keeps the
        reference's name."""
        local = local or {}
        for name, split in table.items():
            owner = name.rpartition(".")[0]
            if split.dim is None and owner:
                self.take_norm(owner, ref_module, local.get(owner, owner))
            else:
                self.take(local.get(name, name), ref_module, name, split.dim, split.indices(degree, rank))

    def take_norm(self, name: str, ref_module: nn.Module, local: str | None = None) -> None:
        """A copy of the reference's RMSNorm `name` (its epsilon and whole scale), as submodule `local`
        (`name` by default)."""
        local = local or name
        src = ref_module.get_submodule(name)
        norm = RMSNorm(src.weight.numel(), src.eps)
        del norm.weight
        setattr(self, local, norm)
        self.take(f"{local}.weight", ref_module, f"{name}.weight")

    # -- gradients that are partial sums after the backward (meshplan.executor.parallelize.GradientSync)
    def partial_grads(self) -> dict[str, list[nn.Parameter]]:
        """Whole weights whose gradients are partial sums over an axis once the backward is done (each
        rank's from its own tokens, as TSP's norm scales), by axis: GradientSync sums each axis's in one
        all-reduce after the backward, and ZeRO reduces them over the gradient group only after that."""
        return {}

    def expert_params(self) -> list[nn.Parameter]:
        """Weights split over an expert-parallel axis, whose gradients GradientSync sums over the
        expert-data-parallel ranks (edp) rather than the gradient group (none by default)."""
        return []

    def replicated_grad_params(self) -> list[nn.Parameter]:
        """Weights some of whose rows are partial sums until sync_replicated_grads (TP-SSM's replicated
        B/C rows); held back from ZeRO's reductions as partial_grads are."""
        return []

    def sync_replicated_grads(self) -> None:
        """Sum the rows replicated_grad_params names over their axis (nothing by default)."""


class Sublayer(Sharded):
    """One pre-norm residual branch of a layer — attention, a dense MLP, a Mamba-2 mixer — sharded for a
    layout: `forward(x)` applies the branch's own norm to the layer's input x and returns what the layer
    adds to x (meshplan.executor.layouts.layer.Layer); `decode(x)` does the same for one new token per
    sequence. `keep_cache` (prefill): keep what decode continues from."""

    keep_cache = False

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def drop_cache(self) -> None:
        """Forget the previous prefill's cache (nothing by default)."""

    def share_final_state(self) -> None:
        """After a prefill, give every rank the state decode continues from (nothing by default)."""


def token_sum(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out (m, n) = Σ over the batch and tokens of a (…, m) ⊗ b (…, n) — a weight's gradient from this
    rank's tokens — written into `out` (a row of the gradients to reduce-scatter: no copy of it made)."""
    torch.mm(a.reshape(-1, a.shape[-1]).t(), b.reshape(-1, b.shape[-1]), out=out)


def contiguous_tokens(seq: int, parts: int, index: int) -> torch.Tensor:
    """Positions of shard `index` when the sequence is cut into `parts` contiguous pieces."""
    n = seq // parts
    return torch.arange(index * n, (index + 1) * n)


def zigzag_tokens(seq: int, parts: int, index: int) -> torch.Tensor:
    """TSP's causal load balance: 2·parts chunks, rank i takes chunks i and 2·parts − 1 − i."""
    c = seq // (2 * parts)
    return torch.cat(
        [torch.arange(index * c, (index + 1) * c), torch.arange((2 * parts - 1 - index) * c, (2 * parts - index) * c)]
    )


class ZigzagKeys:
    """For rank `index` of a zigzag split: the order that puts all-gathered keys (rank-major, each
    rank's two chunks) in position order, its inverse, and the key counts the rank's two query chunks
    see. The index tensors follow the keys to their device on first use."""

    def __init__(self, seq: int, parts: int, index: int):
        gathered = torch.cat([zigzag_tokens(seq, parts, i) for i in range(parts)])  # positions in all-gather order
        self.parts, self.index = parts, index
        self.order = torch.argsort(gathered)
        self.inverse = torch.argsort(self.order)
        c = seq // (2 * parts)
        self.ends = ((index + 1) * c, (2 * parts - index) * c)

    def on(self, device) -> "ZigzagKeys":
        if self.order.device != device:
            self.order, self.inverse = self.order.to(device), self.inverse.to(device)
        return self


class _Reorder(torch.autograd.Function):
    """t.index_select(1, order), whose backward gathers with the inverse order: an index's own backward
    scatters with accumulation, over the whole sequence's K and V."""

    @staticmethod
    def forward(ctx, t, order, inverse):
        ctx.save_for_backward(inverse)
        return t.index_select(1, order)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(1, inverse), None, None


def attend_zigzag(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: ZigzagKeys) -> torch.Tensor:
    """Zigzag causal attention of the rank's two query chunks over K/V in all-gather order: the runs of
    keys each chunk sees, taken where they arrived (meshplan.executor.attention.zigzag_attention); where no
    fused kernel takes those, K/V put in position order and the rank's first query chunk attending keys
    [0, keys.ends[0]), its second [0, keys.ends[1])."""
    out = zigzag_attention(q, k, v, keys.parts, keys.index) if attention.ZIGZAG_RUNS else None
    if out is not None:
        return out
    keys = keys.on(k.device)
    k, v = _Reorder.apply(k, keys.order, keys.inverse), _Reorder.apply(v, keys.order, keys.inverse)
    c = q.shape[1] // 2
    first = attend_prefix(q[:, :c], k, v, keys.ends[0])
    second = attend_prefix(q[:, c:], k, v, keys.ends[1])
    return torch.cat([first, second], dim=1)


def attend_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Causal attention of `q` (b, t, a, d) — the last t of the first kv_len positions — to the
    first kv_len keys of k, v (b, S, a_kv, d), in position order: the keys before the shard's own and
    its causal diagonal as two fused blocks merged by their log-sum-exps (meshplan.executor.attention),
    GQA's K/V not repeated."""
    qh = q.transpose(1, 2)
    kh, vh = k[:, :kv_len].transpose(1, 2), v[:, :kv_len].transpose(1, 2)
    return shard_attention(qh, kh, vh).transpose(1, 2)


DECODE_HEADROOM = 64  # tokens of room a prefilled KV cache keeps for decoding (≤ 0.4% of a 16K cache)


class KVCache:
    """K and V of one layer on one rank, head-major (b, a_kv, capacity, d): decode appends in place
    and attends over a prefix view, so no step copies the cache."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, headroom: int = DECODE_HEADROOM):
        b, t, a, d = k.shape
        self.k = k.new_empty(b, a, t + headroom, d)
        self.v = v.new_empty(b, a, t + headroom, d)
        self.k[:, :, :t] = k.transpose(1, 2)
        self.v[:, :, :t] = v.transpose(1, 2)
        self.length = t

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v (b, 1, a_kv, d)."""
        if self.length == self.k.shape[2]:
            raise RuntimeError("KV cache is full: raise DECODE_HEADROOM")
        self.k[:, :, self.length] = k[:, 0]
        self.v[:, :, self.length] = v[:, 0]
        self.length += 1

    def write_next(self, k: torch.Tensor, v: torch.Tensor, start: int, stop: int) -> None:
        """Put heads [start, stop) of the next token (b, 1, n, d) in place, before it is counted."""
        if self.length == self.k.shape[2]:
            raise RuntimeError("KV cache is full: raise DECODE_HEADROOM")
        self.k[:, start:stop, self.length] = k[:, 0]
        self.v[:, start:stop, self.length] = v[:, 0]

    def heads(self, start: int, stop: int, pending: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of heads [start, stop), including `pending` tokens written but not yet counted."""
        n = self.length + pending
        return self.k[:, start:stop, :n], self.v[:, start:stop, :n]


def partial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One query token (b, 1, a, d) against visible keys k, v (b, a_kv, S, d): the output (b, 1, a, d)
    and the log-sum-exp per head (b, a, 1), so shards of the keys can be combined exactly. Query
    heads are grouped onto their KV head (GQA) without copying K or V."""
    b, _, a, d = q.shape
    a_kv = k.shape[1]
    qg = q.view(b, a_kv, a // a_kv, d)
    scores = acc(qg @ k.transpose(-1, -2)) / d**0.5  # (b, a_kv, rep, S)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1).to(v.dtype) @ v  # (b, a_kv, rep, d)
    return out.reshape(b, 1, a, d), lse.reshape(b, a, 1)


def combine_partials(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Softmax-weighted sum of per-shard attention outputs by their log-sum-exps."""
    lses = torch.stack([lse for _, lse in parts])  # (n, b, a, 1)
    weights = torch.softmax(lses, dim=0).transpose(-1, -2)  # (n, b, 1, a)
    return sum(w.unsqueeze(-1).to(o.dtype) * o for w, (o, _) in zip(weights, parts))

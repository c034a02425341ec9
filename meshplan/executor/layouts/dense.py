"""A dense decoder layer's sublayers — attention and the MLP — on a tensor axis (Megatron TP), a sequence
axis (SP), or both (TP+SP); meshplan.executor.layouts.layer.Layer puts them in order.

TP: QKV and [gate; up] column-parallel (heads / FFN columns split), W_O and W_down row-parallel;
the input is "copied" onto the axis (all-reduce of its gradient) and the output all-reduced.
SP: each rank holds s/Σ tokens — in zigzag (chunks i and 2Σ−1−i of 2Σ, the same causal work on every
rank) where the stack is attention-only and 2Σ divides s, else contiguous (meshplan.layout.sp_zigzag);
K/V of the whole sequence are all-gathered for attention inside a checkpointed region, so only the
local q, k, v are saved and the backward re-gathers K/V and reduce-scatters dK/dV. Weight gradients
are all-reduced over Σ by the train step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from meshplan.executor.attention import causal_attention
from meshplan.executor.blocks import DenseLayer, adapter_delta, mlp_activation, qk_norms_of, qkv_heads
from meshplan.executor.comm import (
    CopyToAxis,
    GatherFromAxis,
    Mesh,
    ReduceFromAxis,
    all_gather,
)
from meshplan.executor.layouts.common import (
    KVCache,
    Sublayer,
    ZigzagKeys,
    attend_prefix,
    attend_zigzag,
    combine_partials,
    partial_attention,
)
from meshplan.executor.layouts.splits import attention_splits, mlp_splits


def _enter(x: torch.Tensor, mesh: Mesh, tensor_axis: str | None) -> torch.Tensor:
    """A sublayer's input onto the tensor axis: identity forward, its gradient all-reduced (TP's "f")."""
    return CopyToAxis.apply(x, mesh, tensor_axis) if tensor_axis else x


def _leave(y: torch.Tensor, mesh: Mesh, tensor_axis: str | None) -> torch.Tensor:
    """A sublayer's partial output summed over the tensor axis (TP's "g")."""
    return ReduceFromAxis.apply(y, mesh, tensor_axis) if tensor_axis else y


class ParallelAttention(Sublayer):
    """RMSNorm → this rank's heads of QKV → (per-head q, k norms) → rotary q, k → causal attention (K/V
    gathered over the sequence axis) → W_O's rows of those heads, summed over the tensor axis. The
    query/key norms' scales (Qwen3's) are whole on every rank; on a tensor axis each rank's gradient of
    them comes from its own heads, summed over the axis after the backward (partial_grads)."""

    def __init__(
        self,
        ref: DenseLayer,
        mesh: Mesh,
        tensor_axis: str | None,
        seq_axis: str | None,
        q_positions: torch.Tensor,
        seq: int,
        zigzag: bool = False,
    ):
        super().__init__()
        self.mesh, self.tensor_axis, self.seq_axis = mesh, tensor_axis, seq_axis
        t = mesh.axis(tensor_axis).size if tensor_axis else 1
        r = mesh.axis(tensor_axis).rank if tensor_axis else 0
        self.heads, self.kv_heads, self.head_dim = ref.heads // t, ref.kv_heads // t, ref.head_dim
        q_w, kv_w = ref.heads * ref.head_dim, ref.kv_heads * ref.head_dim
        self.take_splits(ref, attention_splits(q_w, kv_w, ref.qk_norms is not None), t, r, local={"attn_norm": "norm"})
        self.q_positions = q_positions
        self.rotary, self.seq = ref.rotary, seq
        self.q_scale = ref.q_scale  # Zamba2's shared attention: (head_dim / 2)^-½ scores (blocks.SharedBlock)
        self.next_position = seq  # decode's next token (prefill resets it)
        # The keys this rank's queries see, as Python ints, read once here: q_positions sits on the
        # GPU, and reading it in every attention call made the host wait for the GPU to drain there.
        self.kv_len = int(q_positions[-1]) + 1
        self.zigzag = zigzag
        if zigzag:
            sp = mesh.axis(seq_axis)
            self.keys = ZigzagKeys(seq, sp.size, sp.rank)
        self.keep_cache, self.kv_cache = False, None

    def _qkv(self, xn, positions, adapter=None):
        """This rank's heads of q, k, v (b, t, heads, d) for tokens at `positions`: q and k normed (where
        the model norms them) and turned by the rotary. `adapter`: a Zamba2 invocation's LoRA adapter on
        QKV (blocks.adapter_delta's weights, its up rows this rank's heads)."""
        qkv = F.linear(xn, self.w_qkv)
        if adapter is not None:
            qkv = qkv + adapter_delta(xn, *adapter)
        return qkv_heads(
            qkv, self.rotary, positions, self.heads, self.kv_heads, self.head_dim, self.qk_norms, self.q_scale
        )

    @property
    def qk_norms(self):
        return qk_norms_of(self)

    def partial_grads(self) -> dict:
        """On a tensor axis: the query/key norms' scales, each rank's gradient from its own heads."""
        if self.tensor_axis is None or self.qk_norms is None:
            return {}
        return {self.tensor_axis: [self.q_norm.weight, self.k_norm.weight]}

    def _attend(self, q, k, v):
        """q (b, t, a, d); k, v local (b, t, a_kv, d): gather K/V over the sequence axis, attend causally."""
        b, t, a, d = q.shape
        if self.seq_axis:
            k = GatherFromAxis.apply(k, self.mesh, self.seq_axis, 1)
            v = GatherFromAxis.apply(v, self.mesh, self.seq_axis, 1)
            if self.zigzag:
                return attend_zigzag(q, k, v, self.keys).reshape(b, t, a * d)
            # Contiguous shards: this rank's queries see every key up to the end of its own shard.
            return attend_prefix(q, k, v, self.kv_len).reshape(b, t, a * d)
        else:
            out = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2).reshape(b, t, a * d)

    def forward(self, x, adapter=None):
        q, k, v = self._qkv(_enter(self.norm(x), self.mesh, self.tensor_axis), self.q_positions, adapter)
        if self.keep_cache:  # prefill: this rank's share of the KV cache outlives the step
            self.kv_cache = KVCache(k, v)
            self.next_position = self.seq
        if self.seq_axis and torch.is_grad_enabled():
            # Keep only the local q, k, v for backward: the gathered K/V are re-gathered there.
            out = checkpoint(self._attend, q, k, v, use_reentrant=True)
        else:
            out = self._attend(q, k, v)
        return _leave(F.linear(out, self.w_o), self.mesh, self.tensor_axis)

    def drop_cache(self) -> None:
        self.kv_cache = None

    @torch.no_grad()
    def decode(self, x, adapter=None):
        """One new token per sequence (b, 1, h) against the cache prefill left: on SP, each rank
        attends over its shard of the cache (the last rank also holds the new tokens), and the
        partial outputs are gathered and combined."""
        b = x.shape[0]
        q, k, v = self._qkv(self.norm(x), self.q_positions.new_full((1,), self.next_position), adapter)
        self.next_position += 1
        owner = not self.seq_axis or self.mesh.axis(self.seq_axis).rank == self.mesh.axis(self.seq_axis).size - 1
        if owner:
            self.kv_cache.append(k, v)
        out, lse = partial_attention(q, *self.kv_cache.heads(0, self.kv_heads))
        if self.seq_axis:
            outs = all_gather(self.mesh, out.contiguous(), self.seq_axis, 0).chunk(self.mesh.axis(self.seq_axis).size)
            lses = all_gather(self.mesh, lse.contiguous(), self.seq_axis, 0).chunk(len(outs))
            out = combine_partials(list(zip(outs, lses)))
        return _leave(F.linear(out.reshape(b, 1, -1), self.w_o), self.mesh, self.tensor_axis)


class ParallelMLP(Sublayer):
    """RMSNorm → this rank's columns of [gate; up] → SwiGLU (GeLU, Nemotron-H's squared ReLU) → W_down's
    rows of those columns, summed over the tensor axis. Every rank of a sequence axis runs its own tokens;
    decode is the forward."""

    def __init__(self, ref: DenseLayer, mesh: Mesh, tensor_axis: str | None):
        super().__init__()
        self.mesh, self.tensor_axis = mesh, tensor_axis
        t = mesh.axis(tensor_axis).size if tensor_axis else 1
        r = mesh.axis(tensor_axis).rank if tensor_axis else 0
        self.gated, self.relu2, self.geglu = ref.gated, ref.relu2, ref.geglu
        self.take_splits(ref, mlp_splits(ref.w_down.shape[1], ref.gated), t, r, local={"mlp_norm": "norm"})

    def forward(self, x, adapter=None):
        """`adapter`: a Zamba2 invocation's LoRA adapter on [gate; up] (its up rows this rank's columns)."""
        xn = _enter(self.norm(x), self.mesh, self.tensor_axis)
        h = F.linear(xn, self.w_in)
        if adapter is not None:
            h = h + adapter_delta(xn, *adapter)
        return _leave(F.linear(mlp_activation(self, h), self.w_down), self.mesh, self.tensor_axis)

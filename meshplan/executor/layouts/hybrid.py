"""Zamba2's layers (blocks.SharedBlock, blocks.HybridLayer) sharded for a layout: the shared blocks' sublayers
built once a copy (SharedBlocks, one module of the model's list, after the embedding) and invoked by the
hybrid layers that use that copy, so that each copy's weights are one Parameter on a rank and autograd sums
their gradients over the invocations, as the single-process model's; each hybrid layer's own linear and
adapters (HybridProjection) and its Mamba-2 mixer (mamba.ParallelMamba2).

    block           module                       dp, tp / tpssm, sp (tokens: contiguous shards), tp+sp
    shared block    SharedBlocks: attention       dense.ParallelAttention (heads over tp, K/V gathered over sp)
                    SharedBlocks: mlp             dense.ParallelMLP
    hybrid_proj     HybridProjection              splits.hybrid_proj_splits (the linear whole)
    Mamba-2         ParallelHybridLayer.mixer     mamba.ParallelMamba2 (TP-SSM heads over tp)

The hybrid layers read the token embeddings beside the stream: SharedBlocks keeps its input (the
embedding's output, this rank's tokens) for the step, and passes the stream on unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.executor.blocks import HybridLayer
from meshplan.executor.comm import Mesh
from meshplan.executor.layouts.common import Sharded
from meshplan.executor.layouts.dense import ParallelAttention, ParallelMLP
from meshplan.executor.layouts.layer import Layer
from meshplan.executor.layouts.mamba import ParallelMamba2
from meshplan.executor.layouts.splits import hybrid_proj_splits


class SharedBlocks(nn.Module):
    """Every shared block copy's attention and MLP sublayers on this rank (`copies[j].attention`,
    `.mlp`), whose weights are the reference's `stack.shared` (origin); forward keeps x — the token
    embeddings, as it runs right after the embedding — for the hybrid layers and returns it."""

    def __init__(
        self,
        shared: nn.ModuleList,
        mesh: Mesh,
        tensor_axis: str | None,
        seq_axis: str | None,
        positions: torch.Tensor,
        seq: int,
    ):
        super().__init__()
        copies = []
        for block in shared:
            attention = ParallelAttention(block, mesh, tensor_axis, seq_axis, positions, seq, zigzag=False)
            copies.append(nn.ModuleDict(dict(attention=attention, mlp=ParallelMLP(block, mesh, tensor_axis))))
        self.copies = nn.ModuleList(copies)
        self.emb = None

    @property
    def index(self) -> dict:
        """Each local weight's reference slice, named within stack.shared."""
        return {
            f"copies.{j}.{slot}.{local}": (f"{j}.{ref}", dim, idx)
            for j, copy in enumerate(self.copies)
            for slot, sub in copy.items()
            for local, (ref, dim, idx) in sub.index.items()
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.emb = x
        return x

    decode = forward  # a decoded token's embeddings

    def block(self, copy: int, x: torch.Tensor, proj: HybridProjection, decode: bool = False) -> torch.Tensor:
        """Shared copy `copy` on x and the kept embeddings, with `proj`'s adapters: attention over
        concat(x, embeddings), then the MLP, no residual (blocks.SharedBlock.forward); `decode`: one new
        token against the attention's KV cache (the invoking layer's: ParallelHybridLayer.invoke)."""
        subs = self.copies[copy]
        attention = subs["attention"].decode if decode else subs["attention"]
        a = attention(torch.cat([x, self.emb], dim=-1), adapter=proj.qkv_adapter)
        return subs["mlp"](a, adapter=proj.mlp_adapter)


class HybridProjection(Sharded):
    """A hybrid layer's own linear (the shared block's output back to d_model) and its LoRA adapters:
    whole without a tensor axis; on one, the up projections' rows cut as the projections they add to
    (splits.hybrid_proj_splits), the down projections' gradients partial sums over the axis."""

    def __init__(self, ref: HybridLayer, mesh: Mesh, tensor_axis: str | None):
        super().__init__()
        self.tensor_axis = tensor_axis
        t = mesh.axis(tensor_axis).size if tensor_axis else 1
        r = mesh.axis(tensor_axis).rank if tensor_axis else 0
        block = ref.block
        q_w, kv_w = block.heads * block.head_dim, block.kv_heads * block.head_dim
        table = hybrid_proj_splits(block.w_down.shape[1], q_w, kv_w)
        self.take_splits(ref, {name: split for name, split in table.items() if hasattr(ref, name)}, t, r)

    def partial_grads(self) -> dict:
        """On a tensor axis: the adapters' down projections, each rank's gradient from its own up rows."""
        downs = [getattr(self, n) for n in ("mlp_adapter_down", "qkv_adapter_down") if hasattr(self, n)]
        return {self.tensor_axis: downs} if self.tensor_axis and downs else {}

    @property
    def mlp_adapter(self):
        return (self.mlp_adapter_down, self.mlp_adapter_up) if hasattr(self, "mlp_adapter_down") else None

    @property
    def qkv_adapter(self):
        if not hasattr(self, "qkv_adapter_down"):
            return None
        return (self.qkv_adapter_down, self.q_adapter_up, self.k_adapter_up, self.v_adapter_up)


class ParallelHybridLayer(Layer):
    """A Zamba2 hybrid layer on this rank: x + mixer(x + linear(shared block(x, embeddings))), its
    sublayers the projection and the Mamba-2 mixer (a Sublayer: its own norm, then the mixer); the
    shared block is SharedBlocks', referenced, not registered."""

    def __init__(self, ref: HybridLayer, shared: SharedBlocks, proj: HybridProjection, mixer: ParallelMamba2):
        super().__init__(proj=proj, mixer=mixer)
        self.__dict__["shared"] = shared
        self.copy = ref.copy
        self.kv_state = (None, 0)  # this invocation's KV cache and next position (invoke)

    def invoke(self, x: torch.Tensor, decode: bool = False) -> torch.Tensor:
        """The shared block's output through the layer's linear. Its attention is shared by every layer
        invoking the copy, each with a KV cache of its own: the layer's is lent to it for the call."""
        attention = self.shared.copies[self.copy]["attention"]
        attention.kv_cache, attention.next_position = self.kv_state
        try:
            out = self.shared.block(self.copy, x, self.proj, decode)
        finally:
            self.kv_state = (attention.kv_cache, attention.next_position)
            attention.kv_cache = None
        return F.linear(out, self.proj.linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(x + self.invoke(x))

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer.decode(x + self.invoke(x, decode=True))


def hybrid_layers(stack, mesh: Mesh, seq: int, positions: torch.Tensor, int8_allreduce: bool = False) -> list:
    """A Zamba2 stack on this rank: [SharedBlocks, each layer — a Mamba-2 Layer or a ParallelHybridLayer]
    (dp, tp or tpssm, sp: limits.hybrid_limits)."""
    layout = mesh.layout
    tensor_axis = layout.weight_axis if layout.tensor_degree > 1 else None
    seq_axis = "sp" if layout.sp > 1 else None
    shared = SharedBlocks(stack.shared, mesh, tensor_axis, seq_axis, positions, seq)
    out: list[nn.Module] = [shared]
    for ref in stack.layers:
        mixer = ParallelMamba2(ref, mesh, tensor_axis, seq_axis, int8_allreduce)
        if isinstance(ref, HybridLayer):
            out.append(ParallelHybridLayer(ref, shared, HybridProjection(ref, mesh, tensor_axis), mixer))
        else:
            out.append(Layer(mixer=mixer))
    return out

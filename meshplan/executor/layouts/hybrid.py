"""Zamba2's layers (blocks.SharedBlock, blocks.HybridLayer) sharded for a layout: the shared blocks' sublayers
built once a copy a stage (SharedBlocks, one module of the model's list, after the embedding) and invoked by
the hybrid layers that use that copy, so that each copy's weights are one Parameter on a rank and autograd
sums their gradients over the invocations, as the single-process model's; each hybrid layer's own linear
and adapters (HybridProjection) and its Mamba-2 mixer (mamba.ParallelMamba2).

    block           module                        dp, tp / tpssm, sp (contiguous token shards), pp=2
    shared block    SharedBlocks: attention       dense.ParallelAttention (heads over tp, K/V gathered over sp)
                    SharedBlocks: mlp             dense.ParallelMLP
    hybrid_proj     HybridProjection              splits.hybrid_proj_splits (the linear whole)
    Mamba-2         ParallelHybridLayer.mixer     mamba.ParallelMamba2 (TP-SSM heads over tp)
    (stage end)     StreamOut                     hidden states and embeddings side by side to the next stage

The hybrid layers read the token embeddings beside the stream: SharedBlocks keeps them (the embedding's
output, this rank's tokens, or the second half of what the previous stage sent) for the step. A copy held
on both pipeline stages has its gradients summed over pp once a step (parallelize.GradientSync).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.executor.blocks import Adapters, HybridLayer
from meshplan.executor.comm import Mesh
from meshplan.executor.layouts.common import Sharded
from meshplan.executor.layouts.dense import ParallelAttention, ParallelMLP
from meshplan.executor.layouts.layer import Layer
from meshplan.executor.layouts.mamba import ParallelMamba2
from meshplan.executor.layouts.splits import hybrid_proj_splits
from meshplan.executor.pipeline import stage_slice


class SharedBlocks(nn.Module):
    """The attention and MLP sublayers of each shared block copy this rank's stage invokes (`held`:
    `copies["j"].attention`, `.mlp`), whose weights are the reference's `stack.shared` (origin);
    `summed`: the copies another stage holds too. Forward keeps the token embeddings for the hybrid
    layers — its input on the first stage, right after the embedding; on a later stage the second half
    of what the previous one sent (`unpack`) — and returns the hidden states."""

    def __init__(
        self,
        shared: nn.ModuleList,
        mesh: Mesh,
        tensor_axis: str | None,
        seq_axis: str | None,
        positions: torch.Tensor,
        seq: int,
        held: tuple[int, ...],
        summed: tuple[int, ...] = (),
        unpack: bool = False,
    ):
        super().__init__()
        copies = {}
        for j in held:
            block = shared[j]
            attention = ParallelAttention(block, mesh, tensor_axis, seq_axis, positions, seq, zigzag=False)
            copies[str(j)] = nn.ModuleDict(dict(attention=attention, mlp=ParallelMLP(block, mesh, tensor_axis)))
        self.copies = nn.ModuleDict(copies)
        self.summed, self.unpack = summed, unpack
        self.emb = None

    def stage_summed_params(self) -> list[nn.Parameter]:
        """The weights of the copies another pipeline stage holds too: their gradients are summed over
        the stages once a step (parallelize.GradientSync)."""
        return [p for j in self.summed for p in self.copies[str(j)].parameters()]

    @property
    def index(self) -> dict:
        """Each local weight's reference slice, named within stack.shared."""
        return {
            f"copies.{j}.{slot}.{local}": (f"{j}.{ref}", dim, idx)
            for j, copy in self.copies.items()
            for slot, sub in copy.items()
            for local, (ref, dim, idx) in sub.index.items()
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: the embeddings (the first stage), or what the previous stage sent — the hidden states and
        the embeddings side by side (StreamOut)."""
        if self.unpack:
            x, self.emb = x.chunk(2, dim=-1)
        else:
            self.emb = x
        return x

    decode = forward  # a decoded token's embeddings

    def block(self, copy: int, x: torch.Tensor, proj: HybridProjection, decode: bool = False) -> torch.Tensor:
        """Shared copy `copy` on x and the kept embeddings, with `proj`'s adapters: attention over
        concat(x, embeddings), then the MLP, no residual (blocks.SharedBlock.forward); `decode`: one new
        token against the attention's KV cache (the invoking layer's: ParallelHybridLayer.invoke)."""
        subs = self.copies[str(copy)]
        attention = subs["attention"].decode if decode else subs["attention"]
        a = attention(torch.cat([x, self.emb], dim=-1), adapter=proj.qkv_adapter)
        return subs["mlp"](a, adapter=proj.mlp_adapter)


class HybridProjection(Adapters, Sharded):
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
        attention = self.shared.copies[str(self.copy)]["attention"]
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


class StreamOut(nn.Module):
    """The last module of a pipeline stage before another: the hidden states and the kept embeddings
    side by side, what the next stage's SharedBlocks takes apart."""

    def __init__(self, shared: SharedBlocks):
        super().__init__()
        self.__dict__["shared"] = shared

    @property
    def index(self) -> dict:
        return {}  # no weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.shared.emb], dim=-1)

    decode = forward


def stage_copies(stack, pp: int) -> list[set[int]]:
    """The shared copies each of `pp` stages invokes."""
    layers = list(stack.layers)
    return [
        {ref.copy for ref in layers[stage_slice(len(layers), pp, s)] if isinstance(ref, HybridLayer)} for s in range(pp)
    ]


def hybrid_layers(stack, mesh: Mesh, seq: int, positions: torch.Tensor, int8_allreduce: bool = False) -> list:
    """A Zamba2 stack's stage on this rank: [SharedBlocks (the copies the stage invokes), each layer — a
    Mamba-2 Layer or a ParallelHybridLayer —, and StreamOut before a later stage] (dp, tp or tpssm, sp,
    pp=2: limits.hybrid_limits). Module origins: checkpoint.load_into."""
    layout = mesh.layout
    tensor_axis = layout.weight_axis if layout.tensor_degree > 1 else None
    seq_axis = "sp" if layout.sp > 1 else None
    pp, stage = layout.pp, mesh.axis("pp").rank if layout.pp > 1 else 0
    copies = stage_copies(stack, pp)
    held = tuple(sorted(copies[stage]))
    summed = tuple(j for j in held if sum(j in c for c in copies) > 1)
    shared = SharedBlocks(stack.shared, mesh, tensor_axis, seq_axis, positions, seq, held, summed, unpack=stage > 0)
    shared.origin = "stack.shared"
    out: list[nn.Module] = [shared]
    for ref in list(stack.layers)[stage_slice(len(stack.layers), pp, stage)]:
        mixer = ParallelMamba2(ref, mesh, tensor_axis, seq_axis, int8_allreduce)
        if isinstance(ref, HybridLayer):
            out.append(ParallelHybridLayer(ref, shared, HybridProjection(ref, mesh, tensor_axis), mixer))
        else:
            out.append(Layer(mixer=mixer))
    if stage < pp - 1:
        out.append(StreamOut(shared))
        out[-1].origin = "stack"
    return out

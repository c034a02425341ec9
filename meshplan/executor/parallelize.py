"""Turn a plain Stack into its sharded form for a layout (parallelize from the outside): each layer a
Layer of sharded sublayers (meshplan.executor.layouts.layer); say which tokens each rank holds; and run
a training step's gradient reductions (GradientSync)."""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch import nn

from meshplan.executor.blocks import DenseLayer, Stack
from meshplan.executor.comm import Mesh, all_reduce, all_reduce_start, reduce_scatter_start
from meshplan.executor.layouts.common import Sublayer
from meshplan.executor.layouts.hybrid import hybrid_layers
from meshplan.executor.layouts.layer import build_layer, sharded_modules, tokens_held
from meshplan.executor.layouts.vocab import ParallelEmbedding, ParallelHead
from meshplan.executor.model import CausalLM
from meshplan.executor.pipeline import stage_slice
from meshplan.executor.zero3 import ShardedWeights
from meshplan.layout import grad_group


def token_positions(mesh: Mesh, seq: int, stack: Stack | None = None, index: int | None = None) -> torch.Tensor:
    """The positions this rank (or rank `index` of the token axis) holds (layouts.layer.tokens_held):
    zigzag under TSP for attention-only stacks (None: any), and under SP where the stack is
    attention-only and 2Σ divides seq (meshplan.layout.sp_zigzag); contiguous otherwise."""
    axis = mesh.layout.sequence_axis
    if index is None:
        index = mesh.axis(axis).rank if axis else 0
    return tokens_held(mesh.layout, seq, index, None if stack is None else attention_only(stack))


def all_token_positions(mesh: Mesh, seq: int, stack: Stack) -> tuple[list[torch.Tensor], int]:
    """Every rank's positions along the token axis (one entry without a token split), and this rank's index."""
    axis = mesh.layout.sequence_axis
    if axis is None:
        return [torch.arange(seq)], 0
    ax = mesh.axis(axis)
    return [token_positions(mesh, seq, stack, i) for i in range(ax.size)], ax.rank


def attention_only(stack: Stack) -> bool:
    return all(isinstance(layer, DenseLayer) for layer in stack.layers)


def parallelize(stack: Stack, mesh: Mesh, seq: int, int8_allreduce: bool = False) -> nn.ModuleList:
    """Each reference layer as this rank's Layer of sharded sublayers (layouts.layer.build_layer)."""
    positions = token_positions(mesh, seq, stack)
    only = attention_only(stack)
    return nn.ModuleList(build_layer(layer, mesh, seq, positions, only, int8_allreduce) for layer in stack.layers)


def tensor_axis_of(mesh: Mesh) -> str | None:
    """The axis that splits heads and channels (tp or tpssm); None under SP or TSP alone."""
    layout = mesh.layout
    return layout.weight_axis if layout.tensor_degree > 1 else None


def parallelize_model(ref: CausalLM, mesh: Mesh, seq: int, int8_allreduce: bool = False) -> nn.ModuleList:
    """The whole model's modules this rank runs, each mapping one tensor to the next: the embedding
    (first pipeline stage: token ids in), the stage's layers, the head (last stage: the loss, or the
    next token's log-probabilities, out). A tied matrix stays one Parameter where both ends are on one
    stage; across stages each end keeps a copy and GradientSync sums their gradients."""
    pp = mesh.layout.pp
    stage = mesh.axis("pp").rank if pp > 1 else 0
    positions, index = all_token_positions(mesh, seq, ref.stack)
    tensor_axis = tensor_axis_of(mesh)
    first = stage_slice(len(ref.stack.layers), pp, stage).start if pp > 1 else 0
    if hasattr(ref.stack, "shared"):  # Zamba2: the stage's shared block copies first (layouts.hybrid)
        modules = hybrid_layers(ref.stack, mesh, seq, positions[index], int8_allreduce)
    else:
        modules = list(parallelize(stage_of(ref.stack, mesh), mesh, seq, int8_allreduce))
    layers = [m for m in modules if not hasattr(m, "origin")]
    for i, module in enumerate(layers):  # the reference layer each came from (checkpoint.load_into)
        module.origin = f"stack.layers.{first + i}"
    if stage == 0:
        modules.insert(0, ParallelEmbedding(ref.embed, mesh, tensor_axis, positions, index))
        modules[0].origin = "embed"
    if stage == pp - 1:
        head = ParallelHead(ref.head, mesh, tensor_axis, positions[index], seq)
        head.origin = "head"
        if pp == 1 and ref.head.weight is ref.embed.weight:
            head.tie(modules[0])
        modules.append(head)
    return nn.ModuleList(modules)


def set_documents(layers, documents: torch.Tensor | None) -> None:
    """Hand the whole sequence's document ids (b, s) — packed documents, or None — to the sublayers that
    keep documents apart (the Mamba-2 mixers: each takes its shard's ids)."""
    for module in sharded_modules(layers):
        if hasattr(module, "packed"):
            module.packed = documents


def keep_caches(layers, keep: bool) -> None:
    """Whether the next forwards (a prefill) keep what decode continues from (KV caches, SSM states)."""
    for module in sharded_modules(layers):
        if isinstance(module, Sublayer):
            module.keep_cache = keep


def drop_caches(layers) -> None:
    """Forget the previous prefill's caches (and the KV caches Zamba2's hybrid layers lend their shared
    attention: layouts/hybrid.ParallelHybridLayer.kv_state)."""
    for module in sharded_modules(layers):
        if isinstance(module, Sublayer):
            module.drop_cache()
    for layer in layers:
        for module in layer.modules():
            if hasattr(module, "kv_state"):
                module.kv_state = (None, 0)


def share_final_states(layers) -> None:
    """After a prefill, give every rank the state decode continues from (an SP or TSP Mamba-2 mixer's)."""
    for module in sharded_modules(layers):
        if isinstance(module, Sublayer):
            module.share_final_state()


def unique_params(layers) -> list:
    """The parameters of `layers` in order, a tied one once."""
    return list({id(p): p for layer in layers for p in layer.parameters()}.values())


class GradientSync:
    """The gradient reductions of a training step, as DDP overlaps them with the backward.

    Weights replicated along the cost model's gradient group (meshplan.layout.grad_group: dp, sp,
    or the two merged) have their gradients summed over it, one collective a weight, started as soon
    as autograd has accumulated the gradient (a post-accumulate-grad hook): they run behind the rest
    of the backward. ZeRO 0 all-reduces each gradient in place. ZeRO 1 and 2 reduce-scatter it, so
    that each rank gets the sum of its 1/n of the weight (`shard`), which its optimizer updates
    (optim.ZeroAdam): ZeRO 1 in place, keeping the whole gradient as the memory model does; ZeRO 2
    and 3 into a buffer of their own, dropping the whole gradient at once (ZeRO 3's weights:
    `weights`, meshplan.executor.zero3).

    The ranks of a group must issue their collectives in one order, so each starts once its gradient
    and those of every weight before it in a fixed order are ready. That order is the layers' weights
    in reverse for the first step; after it, the order in which the first step's gradients became ready
    on the group's first rank, broadcast once (as DDP rebuilds its buckets after its first step), so
    that a layer's late weights — its input norm and attention — do not hold back those ready before.

    `finish()`, after the backward, starts any left and waits for all, then divides by the dp replicas
    (their mean, as DDP takes). The experts etp × ep split (Sharded.expert_params) are summed over
    the expert-data-parallel ranks (edp) instead, then divided by dp alike; under ZeRO they are
    reduce-scattered there, each rank keeping its 1/edp (group_of names each weight's group). It sums
    TP-SSM's replicated B/C gradients over the tensor axis and TSP's norm scales over tsp; under ZeRO
    those weights' reductions over the group wait for these sums (a shard of a partial sum cannot be
    completed afterwards)."""

    def __init__(self, layers: nn.ModuleList, mesh: Mesh, weights: ShardedWeights | None = None, tied: bool = False):
        self.layers, self.mesh, self.weights = layers, mesh, weights
        layout = mesh.layout
        self.axis, size = grad_group(layout)
        self.zero = layout.zero if layout.dp > 1 else 0
        # Experts laid out by their own axes (etp × ep, layouts/ep.py): summed over edp in finish(), not
        # over the group. Otherwise every rank holds every expert whole: the group's like any other weight.
        self.experts = [p for m in sharded_modules(layers) for p in m.expert_params()] if layout.expert_axes else []
        self.expert_ids = {id(p) for p in self.experts}
        params = [p for p in unique_params(reversed(layers)) if id(p) not in self.expert_ids] if size > 1 else []
        # A tied matrix split over the first and last pipeline stages: the two copies' gradients summed.
        self.tied = (
            [
                p
                for layer in layers
                if isinstance(layer, (ParallelEmbedding, ParallelHead))
                for n, p in layer.named_parameters()
                if n == "weight"
            ]
            if mesh.layout.pp > 1 and tied
            else []
        )
        # A Zamba2's shared block copies held on several pipeline stages (layouts.hybrid.SharedBlocks):
        # their gradients summed over the stages once a step.
        copies = [layer.stage_summed_params() for layer in layers if hasattr(layer, "stage_summed_params")]
        self.copies = [p for params in copies for p in params]
        held = {id(p) for p in self._summed_first()} if self.zero else set()
        self.order = [p for p in params if id(p) not in held]
        self.held = [p for p in params if id(p) in held]
        self.shards: dict[int, torch.Tensor] = {}  # ZeRO: this rank's slice of each summed gradient
        self.seen: list[torch.Tensor] | None = []  # the first step's ready order; None once adopted
        self.ready: set[int] = set()
        self.started = 0  # the reductions begun this step: a prefix of self.order
        self.pending: list = []
        # False while a pipeline's earlier micro-batches accumulate gradients: the group's reductions
        # start in the last one's backward (meshplan.executor.pipeline).
        self.armed = True
        # The hooks hold this object weakly: a parameter's hooks live in C++, out of the garbage
        # collector's sight, so a strong reference would keep the layers and their gradients alive
        # after the run (measured: each later run's peak rose by the earlier runs' gradients).
        ref = weakref.ref(self)
        for p in self.order:
            p.register_post_accumulate_grad_hook(lambda p: (s := ref()) is not None and s._ready(p))

    def _summed_first(self) -> list:
        """Weights whose gradients are partial sums until finish(): TP-SSM's replicated B/C projections,
        TSP's norm scales (each sharded module's replicated_grad_params and partial_grads)."""
        modules = sharded_modules(self.layers)
        out = [p for m in modules for p in m.replicated_grad_params()]
        out += [p for params in _partial_grads(modules).values() for p in params]
        return out + self.tied + self.copies

    def _ready(self, p: torch.Tensor) -> None:
        if not self.armed:
            return
        self.ready.add(id(p))
        if self.seen is not None:
            self.seen.append(p)
        while self.started < len(self.order) and id(self.order[self.started]) in self.ready:
            self._start(self.order[self.started])

    def _start(self, p: torch.Tensor) -> None:
        self.started += 1
        self._reduce(p)

    def _reduce(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        if not self.zero:
            self.pending.append(all_reduce_start(self.mesh, p.grad, self.axis))
            return
        shard, wait = reduce_scatter_start(self.mesh, p.grad.view(-1), self.axis, in_place=self.zero == 1)
        total = self.shards.get(id(p))
        if total is None:
            self.shards[id(p)] = shard
            self.pending.append(wait)
        else:  # a later micro-batch's (ZeRO 2, 3 under pp): summed into the step's shard
            self.pending.append(lambda: total.add_(wait()))
        if self.zero >= 2:
            p.grad = None  # the collective holds it until done

    def fold(self) -> None:
        """Start what is left of this backward's reductions and wait for them: between the
        micro-batches of a pipeline step under ZeRO 2 and 3 (whose gradients stay sharded), so that
        their shards are summed into the step's before the next backward; and first in finish()."""
        while self.started < len(self.order):
            self._start(self.order[self.started])
        self._wait()
        self.ready.clear()
        self.started = 0

    def _wait(self) -> None:
        for wait in self.pending:
            wait()
        self.pending = []

    def shard(self, p: torch.Tensor) -> torch.Tensor | None:
        """ZeRO: this rank's slice of p's summed gradient (p flattened, zero-padded to a multiple of
        the group), after finish()."""
        return self.shards.get(id(p))

    def finish(self) -> None:
        self.fold()
        modules = sharded_modules(self.layers)
        for m in modules:
            m.sync_replicated_grads()
        for axis, params in _partial_grads(modules).items():  # TSP keeps the norm scales on every rank
            _all_reduce_grads(params, self.mesh, axis)
        if self.tied and self.mesh.axis("pp_ends") is not None:
            _all_reduce_grads(self.tied, self.mesh, "pp_ends")
        if self.copies:  # pp=2 (limits.hybrid_limits): the two stages are the pp axis
            _all_reduce_grads(self.copies, self.mesh, "pp")
        for p in self.held:
            self._reduce(p)
        self._wait()
        dp = self.mesh.layout.dp
        self._reduce_experts()
        summed = list(self.shards.values()) if self.zero else [p.grad for p in self.order if p.grad is not None]
        if not self.zero:
            summed += [p.grad for p in self.experts if p.grad is not None]
        if dp > 1 and summed:
            torch._foreach_mul_(summed, 1.0 / dp)
        self.armed = True
        if self.weights is not None:
            self.weights.free_all()
        if self.seen and self.mesh.enabled:
            self._adopt_ready_order()

    def group_of(self, p: torch.Tensor) -> tuple[str, int, int]:
        """(axis, ranks, this rank's place) of the group that sums p's gradient and, under ZeRO, shards
        its optimizer states: the expert-data-parallel ranks for the experts etp × ep split, the
        gradient group for every other weight."""
        axis = "edp" if id(p) in self.expert_ids else self.axis
        ax = self.mesh.axes.get(axis)
        return (axis, ax.size, ax.rank) if ax is not None else (axis, 1, 0)

    def _reduce_experts(self) -> None:
        """The experts' gradients summed over edp (their ep ranks' tokens are already in them): one
        all-reduce, or under ZeRO a reduce-scatter each, this rank keeping its 1/edp (the whole gradient
        where edp is one rank), as the cost model's expert ZeRO (costmodel/axes/dp.py) prices it."""
        grads = [p for p in self.experts if p.grad is not None]
        if not grads:
            return
        axis, n, _ = self.group_of(grads[0])
        if not self.zero:
            if n > 1:
                _all_reduce_grads(grads, self.mesh, axis)
            return
        for p in grads:
            if n > 1:
                shard, wait = reduce_scatter_start(self.mesh, p.grad.view(-1), axis, in_place=self.zero == 1)
                self.pending.append(wait)
            else:
                shard = p.grad.view(-1)
            self.shards[id(p)] = shard
            if self.zero >= 2:
                p.grad = None  # the shard (or the collective) holds what is needed
        self._wait()

    def clear(self) -> None:
        """Drop the step's gradient shards (the optimizer has used them)."""
        self.shards.clear()

    def _adopt_ready_order(self) -> None:
        """The first step's ready order (weights never ready last), the group's first rank's for all:
        a one-off broadcast of the weights' indices, not counted with the step's traffic."""
        index = {id(p): i for i, p in enumerate(self.order)}
        first = list(dict.fromkeys(index[id(p)] for p in self.seen))
        rest = sorted(set(range(len(self.order))) - set(first))
        ax = self.mesh.axis(self.axis)
        order = torch.tensor(first + rest, dtype=torch.int64, device=self.order[0].device)
        dist.broadcast(order, src=ax.ranks[0], group=ax.group)
        self.order = [self.order[i] for i in order.tolist()]
        self.seen = None


def stage_of(stack: Stack, mesh: Mesh) -> Stack:
    """The stack cut down to this rank's pipeline stage (all of it without pp)."""
    pp = mesh.layout.pp
    if pp > 1:
        stack.layers = nn.ModuleList(list(stack.layers)[stage_slice(len(stack.layers), pp, mesh.axis("pp").rank)])
    return stack


def shard_weights(layers: nn.ModuleList, mesh: Mesh) -> ShardedWeights | None:
    """ZeRO 3's sharded weights (meshplan.executor.zero3) where the layout asks for them."""
    layout = mesh.layout
    return ShardedWeights(layers, mesh) if layout.dp > 1 and layout.zero >= 3 else None


def _partial_grads(modules) -> dict[str, list]:
    """The modules' partial_grads, merged by axis, in module order."""
    out: dict[str, list] = {}
    for m in modules:
        for axis, params in m.partial_grads().items():
            out.setdefault(axis, []).extend(params)
    return out


def _all_reduce_grads(params: list, mesh: Mesh, axis: str) -> None:
    """One all-reduce of the listed gradients, flattened into one buffer."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = all_reduce(mesh, torch.cat([g.flatten() for g in grads]), axis)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def run_layers(layers: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    return x

"""Every collective the executor runs goes through here, and is counted here.

Counts are message bytes by "kind/axis", with the cost model's convention (collectives.py): the
all-reduced tensor, the all-gather output, the reduce-scatter input, the broadcast tensor, one
send/recv hop's tensor. Small autograd functions name the collective of each direction.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from meshplan import rank_order
from meshplan.layout import Layout


@dataclass
class Axis:
    name: str
    size: int
    rank: int  # this process's index along the axis
    group: object | None  # ProcessGroup (None when size == 1)
    ranks: list[int]  # global ranks of this process's group, in axis order


@dataclass
class Mesh:
    layout: Layout
    rank: int
    world: int
    axes: dict[str, Axis]
    counts: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    enabled: bool = True  # False: skip the transfers (for measuring exposed communication), keep counting
    nccl: bool = False

    def axis(self, name: str) -> Axis:
        return self.axes[name]

    def line_up(self) -> None:
        """Every rank of the layout waits for every other: a barrier over each attention axis in turn
        (the tensor, sequence, data and pipeline axes span the layout's ranks as a grid, so after the
        last every rank has entered the first). Only the layout's ranks take part."""
        for name in rank_order.ATTENTION_ORDER:
            ax = self.axes.get(name)
            if ax is not None and ax.size > 1:
                dist.barrier(group=ax.group)

    def record(self, kind: str, axis: str, nbytes: float) -> None:
        key = f"{kind}/{axis}"
        self.counts[key] += nbytes
        self.calls[key] += 1

    def reset_counts(self) -> None:
        self.counts.clear()
        self.calls.clear()


def rank_groups(
    layout: Layout, varying: tuple[str, ...], order: tuple[str, ...] = rank_order.ATTENTION_ORDER
) -> list[list[int]]:
    """Every group of mesh ranks that differ only along the `varying` axes (named as in
    meshplan.rank_order: tensor, sp, dp, pp, or in the experts' `order` etp, ep, edp, pp; consecutive
    there, innermost first), each in axis order, in the order build_mesh creates them: the other axes'
    combinations with the innermost fastest."""
    sizes, strides = rank_order.axis_sizes(layout), rank_order.strides(layout, order)
    others = [n for n in order if n not in varying]
    outer = list(reversed(varying))
    out = []
    for combo in itertools.product(*(range(sizes[n]) for n in others)):
        base = sum(c * strides[n] for n, c in zip(others, combo))
        out.append(
            [
                base + sum(c * strides[n] for n, c in zip(outer, inner))
                for inner in itertools.product(*(range(sizes[n]) for n in outer))
            ]
        )
    return out


def build_mesh(layout: Layout, members: list[int] | None = None) -> Mesh | None:
    """Process groups for every axis, placed by meshplan.rank_order (rank = t + T·(σ + Σ·(d + dp·p)),
    the tensor axis — tp, tpssm or tsp — innermost). Every process creates every group, in the same
    order. `members`: run the layout on these global ranks only (the others get None)."""
    members = list(range(dist.get_world_size())) if members is None else list(members)
    me, world = dist.get_rank(), len(members)
    if world != layout.world_size:
        raise RuntimeError(f"layout {layout} needs {layout.world_size} processes, got {world}")
    rank = members.index(me) if me in members else -1
    sizes = rank_order.axis_sizes(layout)

    def groups(
        varying: tuple[str, ...], name: str, pick=lambda ranks: ranks, order=rank_order.ATTENTION_ORDER
    ) -> Axis | None:
        """Every group of rank_groups(layout, varying, order) (`pick` keeps some of its ranks), created
        here; this process's, as an Axis."""
        mine = None
        for group_ranks in rank_groups(layout, varying, order):
            ranks = pick([members[r] for r in group_ranks])
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if me in ranks:
                mine = Axis(name, len(ranks), ranks.index(me), group, ranks)
        return mine

    axes: dict[str, Axis] = {name: groups((name,), name) for name in rank_order.ATTENTION_ORDER}
    if sizes["sp"] > 1 and sizes["dp"] > 1:
        # The merged gradient group of weights SP replicates (the cost model's "dp+sp",
        # meshplan.layout.grad_group).
        axes["dp+sp"] = groups(("sp", "dp"), "dp+sp")
    if sizes["pp"] > 1:
        # The first and last pipeline stages, which hold the two ends of a tied embedding.
        axes["pp_ends"] = groups(("pp",), "pp_ends", lambda ranks: [ranks[0], ranks[-1]])
    if layout.expert_axes:
        # The experts' decomposition (Megatron-Core's MoE parallel folding): etp splits each expert's
        # FFN, ep holds 1/ep of the experts each, edp sums the experts' gradients.
        for name in ("etp", "ep", "edp"):
            axes[name] = groups((name,), name, order=rank_order.EXPERT_ORDER)
    if rank < 0:
        return None
    axes[layout.weight_axis] = axes["tensor"]
    backend = dist.get_backend()
    return Mesh(layout, rank, world, axes, nccl=backend == "nccl")


# -- raw collectives (counted) ------------------------------------------------------------------------


def all_reduce(mesh: Mesh, t: torch.Tensor, axis: str, op: str = "sum") -> torch.Tensor:
    return all_reduce_start(mesh, t, axis, op)()


REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def all_reduce_start(mesh: Mesh, t: torch.Tensor, axis: str, op: str = "sum"):
    """Begin reducing `t` over the axis (`op`: sum or max), in place; returns a function that waits for
    the result and returns `t` (so the caller can compute meanwhile)."""
    ax = mesh.axis(axis)
    if ax.size == 1:
        return lambda: t
    mesh.record("all_reduce", axis, t.numel() * t.element_size())
    work = dist.all_reduce(t, op=REDUCE_OPS[op], group=ax.group, async_op=True) if mesh.enabled else None

    def finish() -> torch.Tensor:
        if work is not None:
            work.wait()
        return t

    return finish


def all_gather(mesh: Mesh, t: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
    return all_gather_start(mesh, t, axis, dim)()


def all_gather_start(mesh: Mesh, t: torch.Tensor, axis: str, dim: int):
    """Begin gathering `t` along `dim` over the axis; returns a function that waits for the gather and
    returns the gathered tensor (so the caller can compute meanwhile)."""
    ax = mesh.axis(axis)
    if ax.size == 1:
        return lambda: t
    t = t.contiguous()
    mesh.record("all_gather", axis, t.numel() * t.element_size() * ax.size)
    if not mesh.enabled:
        out = torch.cat([t] * ax.size, dim=dim)
        return lambda: out
    # Gathered straight into one rank-major buffer: when every dimension before `dim` has size 1 that
    # buffer already is the concatenation (no second copy of the gathered tensor, as a list of parts
    # and torch.cat would make).
    n = ax.size
    buf = torch.empty((n * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    work = dist.all_gather_into_tensor(buf, t, group=ax.group, async_op=True)

    def finish() -> torch.Tensor:
        work.wait()
        if all(size == 1 for size in t.shape[:dim]):
            return buf.view(*t.shape[:dim], n * t.shape[dim], *t.shape[dim + 1 :])
        return torch.cat(buf.chunk(n, 0), dim=dim)

    return finish


def reduce_scatter(mesh: Mesh, t: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
    """Sum over the axis, keep this rank's slice along `dim` (which must split into equal chunks)."""
    ax = mesh.axis(axis)
    if ax.size == 1:
        return t
    n, dim = ax.size, dim % t.dim()
    if t.shape[dim] % n:
        raise ValueError(f"reduce_scatter: dim {dim} of {tuple(t.shape)} does not split into {n} equal chunks")
    t = t.contiguous()
    mesh.record("reduce_scatter", axis, t.numel() * t.element_size())
    shape = (*t.shape[:dim], t.shape[dim] // n, *t.shape[dim + 1 :])
    if all(size == 1 for size in t.shape[:dim]):
        # The rank chunks lie end to end: NCCL reads the tensor where it is, where the list form has torch
        # copy the chunks into a buffer of its own first (benchmarks/results/s24-h200x2-reduce-scatter/)
        chunks = t.view(n, *shape)
    else:
        # Rank-major in one copy (a batch's rows put each rank's chunk in pieces): the list form copied each
        # chunk to make it contiguous and c10d then copied them all again into its own flat buffer
        chunks = t.unflatten(dim, (n, -1)).movedim(dim, 0).contiguous()
    if not mesh.enabled:
        return chunks[ax.rank]
    if mesh.nccl:
        out = t.new_empty(shape)
        dist.reduce_scatter_tensor(out, chunks, group=ax.group)
        return out
    # gloo has no reduce-scatter: all-reduce and slice (counted as the reduce-scatter it stands for).
    dist.all_reduce(t, group=ax.group)
    return t.chunk(n, dim=dim)[ax.rank].contiguous()


def exchange(
    mesh: Mesh,
    axis: str,
    send: torch.Tensor | None,
    dst: int | None,
    recv_like: torch.Tensor | None,
    src: int | None,
    tag: int,
) -> torch.Tensor | None:
    """Send to `dst` and/or receive from `src` (indices along the axis; None: not that way), counted,
    both in one batch so that neighbours doing the mirror image never deadlock. Returns what was
    received (zeros when the transfers are skipped)."""
    ax = mesh.axis(axis)
    ops, received = [], None
    if send is not None and dst is not None:
        send = send.contiguous()
        mesh.record("send_recv", axis, send.numel() * send.element_size())
        ops.append(dist.P2POp(dist.isend, send, ax.ranks[dst], group=ax.group, tag=tag))
    if recv_like is not None and src is not None:
        # Contiguous, as the sender's: a receive buffer shaped like a transposed view would keep its
        # strides and take the bytes in the wrong order (NCCL only warns; gloo refuses)
        received = torch.empty_like(recv_like, memory_format=torch.contiguous_format)
        ops.append(dist.P2POp(dist.irecv, received, ax.ranks[src], group=ax.group, tag=tag))
    if ops and mesh.enabled:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    elif received is not None:
        received.zero_()
    return received


def shard_len(numel: int, n: int) -> int:
    """Elements in each of n equal shards of `numel` elements zero-padded to a multiple of n."""
    return -(-numel // n)


def shard_of(t: torch.Tensor, n: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s 1/n of `t` flattened and zero-padded to a multiple of n (a view where no padding
    is needed): how ZeRO cuts a weight or its gradient (reduce_scatter_start, optim.ZeroAdam, zero3)."""
    flat, s = t.reshape(-1), shard_len(t.numel(), n)
    if s * n != flat.numel():
        flat = torch.nn.functional.pad(flat, (0, s * n - flat.numel()))
    return flat[rank * s : (rank + 1) * s]


def reduce_scatter_start(mesh: Mesh, flat: torch.Tensor, axis: str, in_place: bool):
    """Begin summing the 1-D `flat` over the axis, keeping this rank's 1/n of it (`flat` zero-padded to
    a multiple of n); returns (the slice, a function that waits for it). `in_place`: the slice is a
    view of `flat` (NCCL's in-place form: no second buffer) where no padding is needed; otherwise it
    is a buffer of its own, and the caller may drop `flat` at once (the collective keeps it alive)."""
    ax = mesh.axis(axis)
    n = ax.size
    pad = -flat.numel() % n
    if pad:
        flat, in_place = torch.nn.functional.pad(flat, (0, pad)), False
    s = flat.numel() // n
    mine = flat[ax.rank * s : (ax.rank + 1) * s]
    mesh.record("reduce_scatter", axis, flat.numel() * flat.element_size())
    out = mine if in_place else torch.empty_like(mine)
    if not mesh.enabled:
        if not in_place:
            out.copy_(mine)
        return out, lambda: out
    if mesh.nccl:
        work = dist.reduce_scatter_tensor(out, flat, group=ax.group, async_op=True)
    else:  # gloo has no reduce-scatter: all-reduce, then this rank's slice (counted as what it stands for)
        work = dist.all_reduce(flat, group=ax.group, async_op=True)

    def finish() -> torch.Tensor:
        work.wait()
        if not mesh.nccl and not in_place:
            out.copy_(mine)
        return out

    return out, finish


def all_gather_into_start(mesh: Mesh, out: torch.Tensor, shard: torch.Tensor, axis: str):
    """Begin gathering every rank's 1-D `shard` (rank order) into the 1-D `out` of n times its length;
    returns a function that waits for it."""
    ax = mesh.axis(axis)
    mesh.record("all_gather", axis, shard.numel() * shard.element_size() * ax.size)
    if not mesh.enabled:
        out[ax.rank * shard.numel() : (ax.rank + 1) * shard.numel()].copy_(shard)
        return lambda: out
    if mesh.nccl:
        work = dist.all_gather_into_tensor(out, shard, group=ax.group, async_op=True)
    else:
        work = dist.all_gather(list(out.chunk(ax.size)), shard, group=ax.group, async_op=True)
    return work.wait


def all_to_all(mesh: Mesh, t: torch.Tensor, axis: str) -> torch.Tensor:
    """t (n, ...): row j goes to rank j; returns the rows every rank sent to this one, in rank order."""
    ax = mesh.axis(axis)
    if ax.size == 1:
        return t
    t = t.contiguous()
    mesh.record("all_to_all", axis, t.numel() * t.element_size())
    if not mesh.enabled:
        return t.clone()
    out = torch.empty_like(t)
    dist.all_to_all_single(out, t, group=ax.group)
    return out


def all_to_all_splits(mesh: Mesh, t: torch.Tensor, axis: str, send: list[int], recv: list[int]) -> torch.Tensor:
    """t (Σ send, ...): its first send[0] rows go to rank 0 of the axis, the next send[1] to rank 1, …;
    returns the rows every rank sent here (recv[j] from rank j), in rank order. Counted as the rows
    this rank sends (the cost model's all-to-all message: the T_d·top_k·h routed copies)."""
    ax = mesh.axis(axis)
    if ax.size == 1:
        return t
    t = t.contiguous()
    mesh.record("all_to_all", axis, t.numel() * t.element_size())
    out = t.new_empty((sum(recv), *t.shape[1:]))
    if not mesh.enabled:
        return out.zero_()
    dist.all_to_all_single(out, t, output_split_sizes=recv, input_split_sizes=send, group=ax.group)
    return out


def exchange_counts(mesh: Mesh, counts: torch.Tensor, axis: str) -> torch.Tensor:
    """counts (n·c,) integers, c for each rank of the axis: returns the c every rank sent here
    (rank-major). The routing's split sizes, exchanged before the tokens; not counted with the step's
    traffic (the cost model prices the tokens, not these n·c integers)."""
    ax = mesh.axis(axis)
    if ax.size == 1 or not mesh.enabled:
        return counts
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts.contiguous(), group=ax.group)
    return out


def gather_counts(mesh: Mesh, counts: torch.Tensor, axis: str) -> torch.Tensor:
    """counts (c,) integers from every rank of the axis, rank-major (n·c,): the row counts an uneven
    all-gather (all_gather_rows) needs; not counted with the step's traffic, as exchange_counts."""
    ax = mesh.axis(axis)
    if ax.size == 1 or not mesh.enabled:
        return counts.repeat(ax.size)
    out = counts.new_empty(ax.size * counts.numel())
    dist.all_gather_into_tensor(out, counts.contiguous(), group=ax.group)
    return out


def all_gather_rows(mesh: Mesh, t: torch.Tensor, axis: str, rows: list[int]) -> torch.Tensor:
    """Every rank's rows, rank-major, where rank j holds rows[j] of them (t: this rank's): an all-gather
    of uneven row counts, sent as an all-to-all of this rank's rows to each rank (gloo's all-gather takes
    equal sizes only). Counted as the all-gather it is: its output."""
    ax = mesh.axis(axis)
    if ax.size == 1:
        return t
    t = t.contiguous()
    out = t.new_empty((sum(rows), *t.shape[1:]))
    mesh.record("all_gather", axis, out.numel() * out.element_size())
    if not mesh.enabled:
        return out.zero_()
    sent = t.repeat(ax.size, *([1] * (t.dim() - 1)))
    dist.all_to_all_single(out, sent, output_split_sizes=rows, input_split_sizes=[t.shape[0]] * ax.size, group=ax.group)
    return out


def reduce_scatter_rows(mesh: Mesh, t: torch.Tensor, axis: str, rows: list[int]) -> torch.Tensor:
    """t (Σ rows, ...) on every rank of the axis: the sum over the ranks of rank j's rows[j] rows, kept
    by rank j (all_gather_rows' reverse), sent as an all-to-all of each rank's part to its owner and
    summed there. Counted as the reduce-scatter it is: its input."""
    ax = mesh.axis(axis)
    if ax.size == 1:
        return t
    t = t.contiguous()
    mesh.record("reduce_scatter", axis, t.numel() * t.element_size())
    mine = rows[ax.rank]
    got = t.new_empty((ax.size * mine, *t.shape[1:]))
    if not mesh.enabled:
        return got[:mine].zero_()
    dist.all_to_all_single(got, t, output_split_sizes=[mine] * ax.size, input_split_sizes=rows, group=ax.group)
    return got.view(ax.size, mine, *t.shape[1:]).sum(0)


INT8_TRANSPORTS = ("auto", "nccl", "peer")


def quantized_all_reduce(
    mesh: Mesh, x: torch.Tensor, axis: str, group: int = 128, transport: str = "auto"
) -> torch.Tensor:
    """Sum of x over the axis through int8 (meshplan/kernels/quant.py), per group of `group` elements
    (values, then fp32 scales, packed in one byte row per destination). Two ranks: quantize, all-gather
    the packed tensors, dequantize and sum (each rank sends its tensor once: as many bytes as the path
    below, with one collective and one kernel fewer and no second rounding). More ranks: quantize into
    one row per rank, all-to-all the rows, dequantize-sum-requantize this rank's slice, all-gather the
    packed slices, dequantize. Triton kernels on the GPU, the torch references on the CPU.

    transport "peer": the two-rank path's bytes read straight from the peer's mapped memory
    (meshplan.executor.peer), no NCCL call; "auto" takes it where peer.wanted says so."""
    from meshplan.kernels import quant, reference

    if transport not in INT8_TRANSPORTS:
        raise ValueError(f"quantized_all_reduce: transport {transport!r}; choose one of {', '.join(INT8_TRANSPORTS)}")
    ax = mesh.axis(axis)
    if ax.size == 1:
        return x
    on_gpu = x.is_cuda
    n = ax.size
    flat = x.reshape(-1)
    pad = (-flat.numel()) % (n * group)
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    if on_gpu and mesh.enabled and mesh.nccl and transport != "nccl":
        from meshplan.executor import peer

        if transport == "peer" or peer.wanted(ax.group, ax.ranks):
            out = peer.quantized_all_reduce_peer(flat, ax.group, group, x.dtype)
            if out is not None:
                mesh.record("all_gather", axis, reference.packed_chunk_bytes(flat.numel(), group) * n)
                return out[: x.numel()].view_as(x)
    if n == 2:
        packed = (
            quant.quantize_int8_packed(flat, 1, group) if on_gpu else reference.quantize_int8_packed_ref(flat, 1, group)
        )
        rows = all_gather(mesh, packed, axis, 0)
        out = quant.dequant_sum(rows, group, x.dtype) if on_gpu else reference.dequant_sum_ref(rows, group, x.dtype)
        return out[: x.numel()].view_as(x)
    packed = (
        quant.quantize_int8_packed(flat, n, group) if on_gpu else reference.quantize_int8_packed_ref(flat, n, group)
    )
    got = all_to_all(mesh, packed, axis)  # row j: rank j's copy of this rank's slice
    mine = quant.dequant_sum_requant(got, group) if on_gpu else reference.dequant_sum_requant_ref(got, group)
    rows = all_gather(mesh, mine.unsqueeze(0), axis, 0)
    out = (
        quant.dequantize_packed(rows, group, x.dtype)
        if on_gpu
        else reference.dequantize_packed_ref(rows, group, x.dtype)
    )
    return out[: x.numel()].view_as(x)


class QuantizedReduceFromAxis(torch.autograd.Function):
    """int8 all-reduce forward (TP-SSM's block output); identity backward."""

    @staticmethod
    def forward(ctx, x, mesh, axis):
        return quantized_all_reduce(mesh, x, axis)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def broadcast(mesh: Mesh, t: torch.Tensor, axis: str, src_index: int, async_op: bool = False):
    """In place; with async_op, returns the work handle to wait on (None when nothing was sent)."""
    ax = mesh.axis(axis)
    if ax.size == 1:
        return None if async_op else t
    mesh.record("broadcast", axis, t.numel() * t.element_size())
    work = dist.broadcast(t, src=ax.ranks[src_index], group=ax.group, async_op=async_op) if mesh.enabled else None
    return work if async_op else t


def ring_shift(mesh: Mesh, t: torch.Tensor, axis: str) -> tuple[torch.Tensor, list]:
    """Start sending `t` to the next rank on the axis and receiving the previous rank's; returns the
    receive buffer and the requests to wait on (so the caller can compute meanwhile)."""
    ax = mesh.axis(axis)
    t = t.contiguous()
    mesh.record("send_recv", axis, t.numel() * t.element_size())
    recv = torch.empty_like(t)
    if not mesh.enabled:
        return t.clone(), []
    nxt, prv = ax.ranks[(ax.rank + 1) % ax.size], ax.ranks[(ax.rank - 1) % ax.size]
    ops = [dist.P2POp(dist.isend, t, nxt, group=ax.group), dist.P2POp(dist.irecv, recv, prv, group=ax.group)]
    return recv, dist.batch_isend_irecv(ops)


def ring_shards(mesh: Mesh, own: torch.Tensor, each, axis: str = "tsp") -> None:
    """Pass this rank's shard `own` round the ring of `axis`: `each(j, shard)` runs on shard j (at hop k
    this rank holds rank − k's) while the next one is in flight."""
    ax = mesh.axis(axis)
    cur = own.detach()
    for hop in range(ax.size):
        pending = ring_shift(mesh, cur, axis) if hop < ax.size - 1 else None
        each((ax.rank - hop) % ax.size, cur)
        if pending is not None:
            received, requests = pending
            for req in requests:
                req.wait()
            cur = received


def ring_weight_grads(mesh: Mesh, own: torch.Tensor, each, axis: str = "tsp") -> torch.Tensor:
    """The backward of a weight whose shards go round the ring (ring_shards): `each(j, shard, out)` writes
    shard j's gradient from this rank's tokens into `out` (shaped as `own`: a row of the buffer to be
    reduce-scattered, every row written once) and may add to the input's gradient meanwhile; the shards'
    gradients are reduce-scattered onto their owners: this rank's own shard's, shaped as `own`."""
    grads = torch.empty(mesh.axis(axis).size, own.numel(), dtype=own.dtype, device=own.device)

    def fill(j, shard):
        each(j, shard, grads[j].view_as(own))

    ring_shards(mesh, own, fill, axis)
    return reduce_scatter(mesh, grads.flatten(), axis, 0).view_as(own)


# -- autograd functions ----------------------------------------------------------------------------


class CopyToAxis(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (TP's "f")."""

    @staticmethod
    def forward(ctx, x, mesh, axis):
        ctx.mesh, ctx.axis = mesh, axis
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(ctx.mesh, grad.contiguous().clone(), ctx.axis), None, None


class ReduceFromAxis(torch.autograd.Function):
    """All-reduce forward, in place on the partial output; identity backward (TP's "g")."""

    @staticmethod
    def forward(ctx, x, mesh, axis):
        if not x.is_contiguous() or x._base is not None:
            x = x.contiguous().clone()  # a view (or strided) output cannot be reduced in place
        else:
            ctx.mark_dirty(x)
        return all_reduce(mesh, x, axis)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class GatherFromAxis(torch.autograd.Function):
    """All-gather along `dim` forward; reduce-scatter of the gradient backward."""

    @staticmethod
    def forward(ctx, x, mesh, axis, dim):
        ctx.mesh, ctx.axis, ctx.dim = mesh, axis, dim
        return all_gather(mesh, x, axis, dim)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(ctx.mesh, grad, ctx.axis, ctx.dim), None, None, None


class AllToAll(torch.autograd.Function):
    """all_to_all forward (row j to rank j), and the same backward (each gradient row back to where its
    row came from)."""

    @staticmethod
    def forward(ctx, x, mesh, axis):
        ctx.mesh, ctx.axis = mesh, axis
        return all_to_all(mesh, x, axis)

    @staticmethod
    def backward(ctx, grad):
        return all_to_all(ctx.mesh, grad, ctx.axis), None, None


class AllToAllSplits(torch.autograd.Function):
    """all_to_all_splits forward (send[j] rows to rank j, recv[j] from it), and backward the reverse
    (each gradient row back to the rank its row came from: recv[j] rows to rank j)."""

    @staticmethod
    def forward(ctx, x, mesh, axis, send, recv):
        ctx.mesh, ctx.axis, ctx.send, ctx.recv = mesh, axis, send, recv
        return all_to_all_splits(mesh, x, axis, send, recv)

    @staticmethod
    def backward(ctx, grad):
        return all_to_all_splits(ctx.mesh, grad, ctx.axis, ctx.recv, ctx.send), None, None, None, None


class GatherRows(torch.autograd.Function):
    """all_gather_rows forward (every rank's rows, rank j's rows[j]); reduce_scatter_rows of the gradient
    backward (each rank's rows' gradients summed over the axis, back to it)."""

    @staticmethod
    def forward(ctx, x, mesh, axis, rows):
        ctx.mesh, ctx.axis, ctx.rows = mesh, axis, rows
        return all_gather_rows(mesh, x, axis, rows)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_rows(ctx.mesh, grad, ctx.axis, ctx.rows), None, None, None


class ScatterRows(torch.autograd.Function):
    """reduce_scatter_rows forward (rank j keeps the sum of its rows[j] rows); all_gather_rows of the
    gradient backward."""

    @staticmethod
    def forward(ctx, x, mesh, axis, rows):
        ctx.mesh, ctx.axis, ctx.rows = mesh, axis, rows
        return reduce_scatter_rows(mesh, x, axis, rows)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_rows(ctx.mesh, grad, ctx.axis, ctx.rows), None, None, None


class AllReduceBoth(torch.autograd.Function):
    """All-reduce forward and backward (a sum whose every rank uses the result)."""

    @staticmethod
    def forward(ctx, x, mesh, axis):
        ctx.mesh, ctx.axis = mesh, axis
        return all_reduce(mesh, x.contiguous().clone(), axis)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(ctx.mesh, grad.contiguous().clone(), ctx.axis), None, None

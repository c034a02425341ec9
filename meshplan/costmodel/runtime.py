"""What a rank holds outside PyTorch's caching allocator: the CUDA context with the libraries' loaded
kernels, and NCCL's buffers, one set per communicator the step uses. memory_per_gpu prices what the
allocator holds (what torch.cuda.max_memory_allocated measures); a plan fits when both together do.

Every figure is a measurement of `benchmarks/probe_runtime_memory.py` (what the driver reports used,
less what the allocator reserved, after each step of a fresh process), NVLink multicast off as on the
device machines (NCCL_NVLS_ENABLE=0: with it on, NCCL holds more, so these are floors). A
communicator's bytes are the buffers of the connections its collectives make: the ring collectives
connect each rank to its ring neighbours, whatever the group's size; an all-to-all connects every
peer, a send/recv the next and previous rank (_neighbour_links). Point-to-point links to other nodes' ranks go through
the NIC's transport, whose buffers no probe here measured: they count nothing (a floor), and a ring
across nodes is priced as on NVLink.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.schedule import step_schedule
from meshplan.costmodel.step import group_placements
from meshplan.layout import Layout
from meshplan.models import ModelSpec

MIB = 2**20

# benchmarks/results/s22-h200x4/runtime-memory-h200x4.json (4 × H200, torch 2.11, NCCL 2.28.9,
# NVLS off) and the executor's own runs beside it (validation-*-s22.json, outside_allocator_bytes: each
# layout's new communicators — docs/design.md §3 and tests/test_runtime_memory.py compare them).
# The CUDA context after a bf16 GEMM and SDPA's flash and cuDNN attention ran (cuBLAS's and cuDNN's
# kernels loaded; cuBLAS's workspace lies in the allocator: memory's blas_workspace). 701 MiB on 2 × H200
# (runtime-memory-h200x2.json), 703 on 4.
CONTEXT_BYTES = 703 * MIB
# Once a process, with its first communicator: the probe's default group grew 842 MiB with its ring
# collectives, less one communicator's own and its ring buffers below.
NCCL_PROCESS_BYTES = 358 * MIB
# Each communicator, once made (the executor's layouts: a pipeline pair's grew 580 MiB = this + one
# send/recv pair; a ring-only group's 484-490 = this + RING_BYTES).
COMMUNICATOR_BYTES = 196 * MIB
# A communicator's ring collectives (all-reduce, all-gather, reduce-scatter; small and large messages):
# 288 MiB for a group of 2 and of 4 alike — a rank connects to its ring neighbours only. A broadcast,
# not probed, is taken to ride the same ring (the executor's TSP broadcasts held no more: tsp=2, 868).
RING_BYTES = 288 * MIB
# Point-to-point buffers for each peer a rank sends to, and each it receives from: an all-to-all over 4
# ranks grew 1,152 MiB (six links), over 2 ranks 384 after the ring collectives (446 alone); a send to the
# next rank and a receive from the previous one 384 (two) for 2 and 4 ranks alike; a pipeline pair's
# 580 (above).
P2P_LINK_BYTES = 192 * MIB

RING_KINDS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast"})


@dataclass(frozen=True)
class Communicator:
    axis: str  # the mesh axis (group) it serves, as meshplan.costmodel.collectives.Comm names it
    ranks: int
    ring: bool  # runs ring collectives
    # point-to-point links a rank opens, a peer and a direction each: an all-to-all sends to and
    # receives from every other rank; a ring sends to the next and receives from the previous; a line (a
    # pipeline) the same forward and, in training, the other way back
    p2p_links: int

    @property
    def buffer_bytes(self) -> int:
        return COMMUNICATOR_BYTES + (RING_BYTES if self.ring else 0) + self.p2p_links * P2P_LINK_BYTES


@dataclass(frozen=True)
class OutsideAllocator:
    context_bytes: int
    communicators: tuple[Communicator, ...]

    @property
    def communicator_bytes(self) -> int:
        if not self.communicators:
            return 0
        return NCCL_PROCESS_BYTES + sum(c.buffer_bytes for c in self.communicators)

    @property
    def total_bytes(self) -> int:
        return self.context_bytes + self.communicator_bytes

    def as_dict(self) -> dict:
        return {
            "cuda_context": self.context_bytes,
            "nccl_communicators": self.communicator_bytes,
            "communicators": [f"{c.axis}:{c.ranks}" for c in self.communicators],
        }


@functools.lru_cache(maxsize=4096)
def communicators(
    model: ModelSpec, layout: Layout, seq: int, opts: CostOptions, gpus_per_node: int, embeddings: bool = True
) -> tuple[Communicator, ...]:
    """One communicator per group the step's collectives run over (step_schedule's axes), and the
    default group over every rank where the stack runs collectives on it (Stack.default_group_nccl).
    Point-to-point links to ranks on other nodes are not counted (module docstring: NIC buffers are
    unmeasured). `embeddings=False`: the executor's bare layer stack."""
    if layout.world_size == 1:
        return ()
    placed = group_placements(layout, gpus_per_node)
    groups: dict[str, dict] = {}
    if opts.stack_spec.default_group_nccl:
        groups["world"] = {"ranks": layout.world_size, "ring": True, "links": set()}
    for comm, _ in step_schedule(model, layout, seq, 1, opts, embeddings=embeddings).all_comms():
        n = comm.group_size
        if n <= 1:
            continue
        g = groups.setdefault(comm.axis, {"ranks": n, "ring": False, "links": set()})
        local = placed[comm.axis].per_node  # the group's ranks on one node (every Comm.axis is placed)
        if comm.kind in RING_KINDS:
            g["ring"] = True
        elif comm.kind == "all_to_all":
            g["links"] |= {(way, peer) for peer in range(1, local) for way in ("send", "recv")}
        elif comm.kind == "send_recv":
            g["links"] |= _neighbour_links(n, local, comm.line, comm.phase)
    return tuple(Communicator(axis, g["ranks"], g["ring"], len(g["links"])) for axis, g in groups.items())


def _neighbour_links(n: int, local: int, line: bool, phase: str) -> set:
    """(direction, peer offset) links a rank opens on its node for one send/recv. A ring sends to the
    next rank and receives from the previous (a pair's two ranks: one link each way). A pipeline pair
    sends forward and receives the gradients back: two links. A longer line is counted as its forward
    alone, two links: on 4 × H200 the fullest rank of a Mamba-2 conv-tail line of 4 (sp=4, forward
    and back) held two links' worth, 874 MiB where four would be 1,252 (s22-h200x4/validation-mamba2-h200x4-s22.json;
    unexplained, so the backward's are not counted: a floor). With two of the group's ranks on a node,
    one neighbour is on it: one link."""
    if local <= 1:
        return set()
    if line and n == 2:
        return {("recv", 1)} if phase == "bwd" else {("send", 1)}
    if line and phase == "bwd":
        return set()
    if local == 2 and n > 2:
        return {("send", 1)}
    return {("send", 1), ("recv", n - 1)}


def outside_allocator(
    model: ModelSpec, layout: Layout, seq: int, opts: CostOptions, gpus_per_node: int, embeddings: bool = True
) -> OutsideAllocator:
    """Bytes a rank of this plan holds beyond the allocator's (module docstring); `gpus_per_node`: the
    cluster's (a plan on one machine: its world size or more)."""
    context = opts.stack_spec.cuda_context_bytes or CONTEXT_BYTES
    return OutsideAllocator(context, communicators(model, layout, seq, opts, gpus_per_node, embeddings))


def fits_device(allocator_bytes: float, outside: OutsideAllocator, gpu_memory_bytes: int) -> bool:
    """The allocator's peak and what lies beside it fit the GPU's memory."""
    return allocator_bytes + outside.total_bytes <= gpu_memory_bytes

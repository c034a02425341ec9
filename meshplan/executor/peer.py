"""The int8 all-reduce over peer-mapped memory: the GPUs of one host read each other's buffers.

Each rank quantizes its tensor into one slot of a double buffer that every rank of the group has
mapped (torch's symmetric memory); a second kernel tells the peers the row is there, waits for theirs
and sums every rank's int8 copy in rank order (meshplan.kernels.quant.dequant_sum_peers). Two kernel
launches, no NCCL call and no separate barrier: the NCCL path (comm.quantized_all_reduce) pays a
collective's launch and three calls' host time, more than NVLink's time for the bytes at 16 MiB.

Ordering: call k (epoch k) uses slot k mod 2. A rank's sum of call k starts by storing k in each peer's
slot (release) and waits until each peer has stored k in its own (acquire), so it reads only rows the
peers have finished. A rank quantizes into its slot at call k + 2 only after its sum of call k + 1 has
seen every peer's k + 1, which each peer sent after its sum of call k — the last reads of that slot.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist


class PeerBuffer:
    """Two slots of `capacity` bytes each, mapped on every rank of `group`, and every rank's view of them."""

    def __init__(self, group, capacity: int, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        from meshplan.kernels.launch import PEER_HEADER

        self.capacity = capacity  # bytes of a slot: the signal words, then the packed row
        self.group = group
        self.local = symm_mem.empty(2 * capacity, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.local, group)
        self.rank = dist.get_rank(group)
        full = [self.handle.get_buffer(r, (2 * capacity,), torch.uint8) for r in range(self.handle.world_size)]
        self.slots = [[v[s * capacity : (s + 1) * capacity] for v in full] for s in (0, 1)]
        self.mine = [self.local[s * capacity + PEER_HEADER : (s + 1) * capacity] for s in (0, 1)]
        for s in (0, 1):  # no peer may signal before every rank's words are zero
            self.local[s * capacity : s * capacity + PEER_HEADER].zero_()
        torch.cuda.synchronize(device)
        dist.barrier(group=group)
        self.epoch = 0
        self.plans: dict[tuple, list] = {}  # compiled launchers by tensor kind (quantized_all_reduce_peer)

    def row(self, slot: int, nbytes: int) -> torch.Tensor:
        """This rank's packed row in a slot."""
        return self.mine[slot][:nbytes]


_BUFFERS: dict[int, PeerBuffer] = {}
_UNAVAILABLE: dict[int, str] = {}
# The one-shot sum's tile: groups of 128 a program and warps. 16 and 4 ran fastest of 12 at 16 MiB on
# 2 × H200, back to back (45.5 us against 45.7-61.5; the host's 33 us a call is close to that, so the
# spread is mostly noise: benchmarks/results/quant-allreduce-peer-h200x2.json, `--peer-tiles`).
PEER_GROUPS_PER_PROGRAM = 16
PEER_WARPS = 4
# Programs of the sum per SM: all of them fit on the GPU at once (4 warps each, few registers), so the
# ones waiting for the peers never keep the signalling program 0 off the GPU.
PEER_PROGRAMS_PER_SM = 4


def configure(groups_per_program: int, warps: int) -> None:
    """Set the sum's tile (for a sweep); launchers compiled for another tile are dropped."""
    global PEER_GROUPS_PER_PROGRAM, PEER_WARPS
    PEER_GROUPS_PER_PROGRAM, PEER_WARPS = groups_per_program, warps
    for pb in _BUFFERS.values():
        pb.plans.clear()


def peer_access_allowed() -> bool:
    """False where NCCL_P2P_DISABLE is set: it stands for a host without NVLink or peer access."""
    return os.environ.get("NCCL_P2P_DISABLE", "0") in ("", "0")


def wanted(group, ranks: list[int]) -> bool:
    """Whether the auto transport takes the peer path for this group (global `ranks`): two ranks (the
    only size measured, benchmarks/results/quant-allreduce-peer-h200x2.json) on one host (torchrun's
    ranks fill a host before the next: LOCAL_WORLD_SIZE of them), peer access not switched off
    (NCCL_P2P_DISABLE stands for a host without NVLink), and symmetric memory working here."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or torch.cuda.device_count() or 1
    return (
        len(ranks) == 2
        and len({r // local for r in ranks}) == 1
        and peer_access_allowed()
        and id(group) not in _UNAVAILABLE
    )


def _buffer(group, elements: int, group_size: int, device: torch.device) -> PeerBuffer:
    from meshplan.kernels.launch import peer_slot_bytes

    pb = _BUFFERS.get(id(group))
    capacity = peer_slot_bytes(elements, group_size)
    if pb is not None and pb.capacity >= capacity:
        return pb
    # A peer may still be reading the old buffer: every rank drains its GPU before the rendezvous (a
    # collective), so after it no kernel of the old buffer runs anywhere and it can be dropped.
    torch.cuda.synchronize(device)
    _BUFFERS[id(group)] = PeerBuffer(group, capacity, device)
    return _BUFFERS[id(group)]


def quantized_all_reduce_peer(flat: torch.Tensor, group, group_size: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Sum of `flat` (contiguous, numel a multiple of `group_size`, the elements per fp32 scale) over the
    process group `group`, through int8 in peer-mapped memory, in `dtype`; None where this host cannot
    map its peers' memory (the caller falls back to NCCL)."""
    pb = _BUFFERS.get(id(group))
    key = (flat.numel(), flat.dtype, flat.data_ptr() % 16 == 0, group_size, dtype)
    plan = pb.plans.get(key) if pb is not None else None
    if plan is None:
        try:
            plan = _plan(flat, group, group_size, dtype, key)
        except (RuntimeError, ImportError, AttributeError) as exc:  # no symmetric memory on this build/host
            _UNAVAILABLE[id(group)] = str(exc)
            warnings.warn(f"int8 all-reduce: peer-mapped memory unavailable ({exc}); using NCCL", stacklevel=3)
            return None
        pb = _BUFFERS[id(group)]
    pb.epoch += 1
    quantize, total = plan[pb.epoch % 2]
    quantize(flat)
    return total(torch.empty(flat.numel(), dtype=dtype, device=flat.device), pb.epoch)


def _plan(flat: torch.Tensor, group, group_size: int, dtype: torch.dtype, key: tuple):
    """For each slot: the quantize into this rank's row and the signalled sum of every rank's row,
    compiled for tensors like `flat` (kept on the buffer: launched straight on later calls)."""
    from meshplan.kernels import quant
    from meshplan.kernels.reference import packed_chunk_bytes

    nbytes = packed_chunk_bytes(flat.numel(), group_size)
    pb = _buffer(group, flat.numel(), group_size, flat.device)
    programs = PEER_PROGRAMS_PER_SM * torch.cuda.get_device_properties(flat.device).multi_processor_count
    plan = [
        (
            quant.quantize_packed_launcher(flat, pb.row(s, nbytes), group_size),
            quant.peer_sum_launcher(
                pb.slots[s],
                flat.numel(),
                group_size,
                dtype,
                PEER_GROUPS_PER_PROGRAM,
                PEER_WARPS,
                rank=pb.rank,
                sync=True,
                programs=programs,
            ),
        )
        for s in (0, 1)
    ]
    pb.plans[key] = plan
    return plan


def buffer_bytes() -> int:
    """Device bytes this process holds in peer buffers (outside torch's caching allocator, so not in
    torch.cuda.max_memory_allocated; the executor adds them to its measured peak)."""
    return sum(pb.local.numel() for pb in _BUFFERS.values())


def release(groups: list | None = None) -> None:
    """Drop the peer buffers of these process groups (all of them by default) once every rank of each
    has drained its GPU and met the others at a barrier, so no peer still reads them. Every rank of a
    named group must call this."""
    for group in list(_BUFFERS) if groups is None else [id(g) for g in groups]:
        pb = _BUFFERS.get(group)
        if pb is None:
            continue
        torch.cuda.synchronize(pb.local.device)
        dist.barrier(group=pb.group)
        del _BUFFERS[group]

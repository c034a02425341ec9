"""int8 quantize / dequantize with per-group fp32 scales (Triton), and a quantized all-reduce.

The all-reduce (for TP-SSM's one all-reduce per block): quantize, all-to-all the int8 chunks (each
rank receives every rank's copy of its own 1/n), dequantize and sum them in fp32, quantize that sum,
all-gather the int8 chunks, dequantize. Bytes on the wire per rank: 2·(n−1)/n of the int8 message
(with its scales) — half of a bf16 all-reduce's. The wire format packs each destination's int8
values and fp32 scales into one byte row, so the all-reduce is 2 collectives and 3 kernels (the
middle one dequantizes, sums and re-quantizes in one pass). References: meshplan/kernels/reference.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from meshplan.kernels.fastlaunch import bind
from meshplan.kernels.launch import PEER_HEADER

GROUP = 128  # elements per fp32 scale (the cost model's INT8_GROUP)


@triton.jit
def _group_tile(n_groups, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr):
    """This program's groups: their indices, element offsets, and the mask of groups that exist."""
    rows = tl.program_id(0) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
    offs = rows[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    return rows, offs, rows[:, None] < n_groups


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, scale_ptr, n_groups, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr):
    rows, offs, mask = _group_tile(n_groups, GROUP, GROUPS_PER_PROGRAM)
    q, scale = _quantize_rows(tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32))
    tl.store(q_ptr + offs, q, mask=mask)
    tl.store(scale_ptr + rows, scale, mask=rows < n_groups)


@triton.jit
def _quantize_rows(x):
    """(groups, GROUP) fp32 → int8 values and one fp32 scale per group: scale = max|x| / 127 (1 for an
    all-zero group), values rounded half away from zero."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, amax / 127.0, 1.0)
    q = x / scale[:, None]
    q = tl.where(q >= 0, tl.floor(q + 0.5), tl.ceil(q - 0.5))
    return tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int8), scale


@triton.jit
def _dequantize_kernel(q_ptr, scale_ptr, out_ptr, n_groups, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr):
    rows, offs, mask = _group_tile(n_groups, GROUP, GROUPS_PER_PROGRAM)
    q = tl.load(q_ptr + offs, mask=mask, other=0).to(tl.float32)
    scale = tl.load(scale_ptr + rows, mask=rows < n_groups, other=1.0)
    tl.store(out_ptr + offs, (q * scale[:, None]).to(out_ptr.dtype.element_ty), mask=mask)


def quantize_int8(x: torch.Tensor, group: int = GROUP, groups_per_program: int = 16):
    """x (numel a multiple of `group`) → (int8 values, fp32 scale per group)."""
    x = x.contiguous().reshape(-1)
    if x.numel() % group:
        raise ValueError(f"quantize_int8: {x.numel()} elements is not a multiple of the group size {group}")
    n_groups = x.numel() // group
    q = torch.empty(x.numel(), dtype=torch.int8, device=x.device)
    scale = torch.empty(n_groups, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n_groups, groups_per_program),)
    _quantize_kernel[grid](x, q, scale, n_groups, GROUP=group, GROUPS_PER_PROGRAM=groups_per_program)
    return q, scale


def dequantize_int8(
    q: torch.Tensor, scale: torch.Tensor, group: int = GROUP, dtype=torch.float32, groups_per_program: int = 16
) -> torch.Tensor:
    n_groups = scale.numel()
    out = torch.empty(q.numel(), dtype=dtype, device=q.device)
    grid = (triton.cdiv(n_groups, groups_per_program),)
    _dequantize_kernel[grid](q, scale, out, n_groups, GROUP=group, GROUPS_PER_PROGRAM=groups_per_program)
    return out


@triton.jit
def _packed_tile(row, n_groups_row, chunk_bytes, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr):
    """Within packed byte row `row`: the offsets of this program's groups' values, of their fp32
    scales (in fp32 units), of the same elements in the unpacked tensor, and the mask of groups that
    exist. The groups' block is the grid's first axis (up to 2^31 − 1 blocks; the second stops at
    65,535, which a 256 MiB tensor in one row would pass)."""
    return _packed_tile_at(tl.program_id(0), row, n_groups_row, chunk_bytes, GROUP, GROUPS_PER_PROGRAM)


@triton.jit
def _packed_tile_at(tile, row, n_groups_row, chunk_bytes, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr):
    """_packed_tile for block `tile` of groups."""
    g = tile * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
    ok = g < n_groups_row
    vals = row * chunk_bytes + g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    scales = (row * chunk_bytes + n_groups_row * GROUP) // 4 + g
    flat = (row * n_groups_row + g[:, None]) * GROUP + tl.arange(0, GROUP)[None, :]
    return vals, scales, flat, ok


@triton.jit
def _quantize_packed_kernel(
    x_ptr, buf_ptr, n_groups_row, chunk_bytes, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr
):
    vals, scales, flat, ok = _packed_tile(tl.program_id(1), n_groups_row, chunk_bytes, GROUP, GROUPS_PER_PROGRAM)
    _store_packed(buf_ptr, tl.load(x_ptr + flat, mask=ok[:, None], other=0.0).to(tl.float32), vals, scales, ok)


@triton.jit
def _store_packed(buf_ptr, x, vals, scales, ok):
    q, scale = _quantize_rows(x)
    tl.store(buf_ptr + vals, q.to(tl.uint8, bitcast=True), mask=ok[:, None])
    tl.store(buf_ptr.to(tl.pointer_type(tl.float32)) + scales, scale, mask=ok)


@triton.jit
def _load_packed(buf_ptr, vals, scales, ok):
    q = tl.load(buf_ptr + vals, mask=ok[:, None], other=0).to(tl.int8, bitcast=True).to(tl.float32)
    return q * tl.load(buf_ptr.to(tl.pointer_type(tl.float32)) + scales, mask=ok, other=1.0)[:, None]


@triton.jit
def _dequant_sum_kernel(
    buf_ptr,
    out_ptr,
    n_rows,
    n_groups_row,
    chunk_bytes,
    GROUP: tl.constexpr,
    GROUPS_PER_PROGRAM: tl.constexpr,
    REQUANT: tl.constexpr,
):
    """The fp32 sum of n_rows packed copies of one slice: re-quantized into one packed row (REQUANT),
    or stored unpacked in out_ptr's dtype."""
    vals, scales, flat, ok = _packed_tile(0, n_groups_row, chunk_bytes, GROUP, GROUPS_PER_PROGRAM)
    total = tl.zeros((GROUPS_PER_PROGRAM, GROUP), dtype=tl.float32)
    for r in range(n_rows):
        total += _load_packed(buf_ptr, vals + r * chunk_bytes, scales + r * chunk_bytes // 4, ok)
    if REQUANT:
        _store_packed(out_ptr, total, vals, scales, ok)
    else:
        tl.store(out_ptr + flat, total.to(out_ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _dequantize_packed_kernel(
    buf_ptr, out_ptr, n_groups_row, chunk_bytes, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr
):
    vals, scales, flat, ok = _packed_tile(tl.program_id(1), n_groups_row, chunk_bytes, GROUP, GROUPS_PER_PROGRAM)
    tl.store(out_ptr + flat, _load_packed(buf_ptr, vals, scales, ok).to(out_ptr.dtype.element_ty), mask=ok[:, None])


def quantize_int8_packed(
    x: torch.Tensor, parts: int, group: int = GROUP, groups_per_program: int = 16, out: torch.Tensor | None = None
):
    """Same contract as reference.quantize_int8_packed_ref: (parts, chunk bytes) uint8, written into
    `out` (contiguous uint8 of that shape, e.g. a slot of a buffer the peers read) when given."""
    from meshplan.kernels.reference import packed_chunk_bytes

    x = x.contiguous().reshape(-1)
    if x.numel() % (parts * group):
        raise ValueError(f"quantize_int8_packed: {x.numel()} elements is not a multiple of {parts} × {group}")
    chunk = x.numel() // parts
    nbytes = packed_chunk_bytes(chunk, group)
    buf = torch.empty(parts, nbytes, dtype=torch.uint8, device=x.device) if out is None else out.view(parts, nbytes)
    grid = (triton.cdiv(chunk // group, groups_per_program), parts)
    _quantize_packed_kernel[grid](x, buf, chunk // group, nbytes, GROUP=group, GROUPS_PER_PROGRAM=groups_per_program)
    return buf


def dequant_sum_requant(buf: torch.Tensor, group: int = GROUP, groups_per_program: int = 16) -> torch.Tensor:
    """Same contract as reference.dequant_sum_requant_ref: (n, chunk bytes) → (chunk bytes,)."""
    out = torch.empty(buf.shape[1], dtype=torch.uint8, device=buf.device)
    return _sum_rows(buf, out, group, groups_per_program, requant=True)


def dequant_sum(
    buf: torch.Tensor, group: int = GROUP, dtype=torch.float32, groups_per_program: int = 16
) -> torch.Tensor:
    """Same contract as reference.dequant_sum_ref: (n, chunk bytes) → (chunk,) in `dtype`."""
    out = torch.empty(buf.shape[1] // (group + 4) * group, dtype=dtype, device=buf.device)
    return _sum_rows(buf, out, group, groups_per_program, requant=False)


def _sum_rows(buf: torch.Tensor, out: torch.Tensor, group: int, groups_per_program: int, requant: bool) -> torch.Tensor:
    n, nbytes = buf.shape
    n_groups = nbytes // (group + 4)
    grid = (triton.cdiv(n_groups, groups_per_program), 1)
    _dequant_sum_kernel[grid](
        buf.contiguous(), out, n, n_groups, nbytes, GROUP=group, GROUPS_PER_PROGRAM=groups_per_program, REQUANT=requant
    )
    return out


def dequantize_packed(
    buf: torch.Tensor, group: int = GROUP, dtype=torch.float32, groups_per_program: int = 16
) -> torch.Tensor:
    """Same contract as reference.dequantize_packed_ref."""
    rows, nbytes = buf.shape
    n_groups = nbytes // (group + 4)
    out = torch.empty(rows * n_groups * group, dtype=dtype, device=buf.device)
    grid = (triton.cdiv(n_groups, groups_per_program), rows)
    _dequantize_packed_kernel[grid](
        buf.contiguous(), out, n_groups, nbytes, GROUP=group, GROUPS_PER_PROGRAM=groups_per_program
    )
    return out


MAX_PEERS = 8  # slots the one-shot sum takes (one GPU host's ranks)
# PEER_HEADER: bytes before a slot's packed row, MAX_PEERS int32 signal words padded to 128
# (meshplan.kernels.launch, where the memory model reads it).


@triton.jit
def _nth(i: tl.constexpr, b0, b1, b2, b3, b4, b5, b6, b7):
    """The i-th of eight pointers, chosen at compile time."""
    if i == 0:
        return b0
    elif i == 1:
        return b1
    elif i == 2:
        return b2
    elif i == 3:
        return b3
    elif i == 4:
        return b4
    elif i == 5:
        return b5
    elif i == 6:
        return b6
    else:
        return b7


@triton.jit(do_not_specialize=["epoch"])
def _dequant_sum_peers_kernel(
    b0,
    b1,
    b2,
    b3,
    b4,
    b5,
    b6,
    b7,
    out_ptr,
    n_groups,
    chunk_bytes,
    n_tiles,
    epoch,
    GROUP: tl.constexpr,
    GROUPS_PER_PROGRAM: tl.constexpr,
    WORLD: tl.constexpr,
    RANK: tl.constexpr,
    SYNC: tl.constexpr,
    HEADER: tl.constexpr,
):
    """out = Σ_r dequantize(slot r's packed row), r = 0 … WORLD−1 in that order on every rank (so every
    rank's sum is bit-identical). Slot r (pointer b_r, perhaps another GPU's memory mapped here) holds
    one int32 word per rank, then at HEADER bytes the packed row. SYNC: first tell every peer that
    this rank's row is written (program 0 stores `epoch` in word RANK of the peer's slot, a system-scope
    release: the row's kernel has finished before this one starts), then wait until each peer has
    said the same in this rank's slot (acquire). Programs loop over the tiles, so the grid is no larger
    than the GPU holds at once and every waiting program's peer-signalling program 0 is running."""
    if SYNC:
        if tl.program_id(0) == 0:
            for r in tl.static_range(WORLD):
                if r != RANK:
                    tl.atomic_xchg(
                        _nth(r, b0, b1, b2, b3, b4, b5, b6, b7).to(tl.pointer_type(tl.int32)) + RANK,
                        epoch,
                        sem="release",
                        scope="sys",
                    )
        mine = _nth(RANK, b0, b1, b2, b3, b4, b5, b6, b7).to(tl.pointer_type(tl.int32))
        for r in tl.static_range(WORLD):
            if r != RANK:
                while tl.atomic_add(mine + r, 0, sem="acquire", scope="sys") < epoch:
                    pass
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        vals, scales, flat, ok = _packed_tile_at(tile, 0, n_groups, chunk_bytes, GROUP, GROUPS_PER_PROGRAM)
        total = tl.zeros((GROUPS_PER_PROGRAM, GROUP), dtype=tl.float32)
        for r in tl.static_range(WORLD):
            total += _load_packed(_nth(r, b0, b1, b2, b3, b4, b5, b6, b7) + HEADER, vals, scales, ok)
        tl.store(out_ptr + flat, total.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def peer_sum_launcher(
    slots: list[torch.Tensor],
    numel: int,
    group: int = GROUP,
    dtype=torch.float32,
    groups_per_program: int = 16,
    num_warps: int = 4,
    rank: int = 0,
    sync: bool = False,
    programs: int | None = None,
):
    """A function (out, epoch) → out that writes into `out` (numel values of `dtype`) the fp32 sum of
    len(slots) packed rows of `numel` values, read where they lie: the one-shot reduce of a quantized
    all-reduce whose slots are other GPUs' memory mapped into this one. Each slot (1-D uint8) holds
    PEER_HEADER bytes of signal words, then the row laid out as reference.quantize_int8_packed_ref(x,
    1)[0]. `sync`: signal the peers and wait for their `epoch` first (this is slot `rank`); `programs`:
    at most this many programs, looping over the tiles. Compiled here, launched by each call."""
    from meshplan.kernels.reference import packed_chunk_bytes

    if not 1 <= len(slots) <= MAX_PEERS:
        raise ValueError(f"dequant_sum_peers: {len(slots)} slots; between 1 and {MAX_PEERS} are supported")
    if numel % group:
        raise ValueError(f"dequant_sum_peers: {numel} elements is not a multiple of the group size {group}")
    n_groups = numel // group
    nbytes = packed_chunk_bytes(numel, group)
    if any(b.numel() < PEER_HEADER + nbytes for b in slots):
        raise ValueError(f"dequant_sum_peers: every slot must hold {PEER_HEADER} + {nbytes} bytes")
    padded = tuple(slots) + (slots[0],) * (MAX_PEERS - len(slots))
    tiles = triton.cdiv(n_groups, groups_per_program)
    grid = (min(tiles, programs) if programs else tiles,)
    example = torch.empty(numel, dtype=dtype, device=slots[0].device)
    launch = bind(
        _dequant_sum_peers_kernel,
        grid,
        *padded,
        example,
        n_groups,
        nbytes,
        tiles,
        2,
        GROUP=group,
        GROUPS_PER_PROGRAM=groups_per_program,
        WORLD=len(slots),
        RANK=rank,
        SYNC=sync,
        HEADER=PEER_HEADER,
        num_warps=num_warps,
    )

    def run(out: torch.Tensor, epoch: int) -> torch.Tensor:
        launch(*padded, out, n_groups, nbytes, tiles, epoch)
        return out

    return run


def dequant_sum_peers(
    slots: list[torch.Tensor],
    numel: int,
    group: int = GROUP,
    dtype=torch.float32,
    groups_per_program: int = 16,
    num_warps: int = 4,
    rank: int = 0,
    epoch: int = 0,
    sync: bool = False,
    programs: int | None = None,
) -> torch.Tensor:
    """peer_sum_launcher's sum, once, into a new tensor."""
    run = peer_sum_launcher(slots, numel, group, dtype, groups_per_program, num_warps, rank, sync, programs)
    return run(torch.empty(numel, dtype=dtype, device=slots[0].device), epoch)


def quantize_packed_launcher(x: torch.Tensor, out: torch.Tensor, group: int = GROUP, groups_per_program: int = 16):
    """A function t → None that quantizes t (contiguous, of x's numel, dtype and 16-byte alignment) into
    `out` as one packed row (quantize_int8_packed(t, 1, out=out)); compiled here, launched by each call."""
    from meshplan.kernels.reference import packed_chunk_bytes

    if x.numel() % group:
        raise ValueError(f"quantize_packed_launcher: {x.numel()} elements is not a multiple of {group}")
    n_groups = x.numel() // group
    nbytes = packed_chunk_bytes(x.numel(), group)
    if out.numel() != nbytes:
        raise ValueError(f"quantize_packed_launcher: out holds {out.numel()} bytes; the row takes {nbytes}")
    grid = (triton.cdiv(n_groups, groups_per_program), 1)
    launch = bind(
        _quantize_packed_kernel, grid, x, out, n_groups, nbytes, GROUP=group, GROUPS_PER_PROGRAM=groups_per_program
    )
    return lambda t: launch(t, out, n_groups, nbytes)

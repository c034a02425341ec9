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


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, group: int = GROUP, dtype=torch.float32,
                    groups_per_program: int = 16) -> torch.Tensor:
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
    g = tl.program_id(0) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
    ok = g < n_groups_row
    vals = row * chunk_bytes + g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    scales = (row * chunk_bytes + n_groups_row * GROUP) // 4 + g
    flat = (row * n_groups_row + g[:, None]) * GROUP + tl.arange(0, GROUP)[None, :]
    return vals, scales, flat, ok


@triton.jit
def _quantize_packed_kernel(x_ptr, buf_ptr, n_groups_row, chunk_bytes, GROUP: tl.constexpr,
                            GROUPS_PER_PROGRAM: tl.constexpr):
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
def _dequant_sum_kernel(buf_ptr, out_ptr, n_rows, n_groups_row, chunk_bytes, GROUP: tl.constexpr,
                        GROUPS_PER_PROGRAM: tl.constexpr, REQUANT: tl.constexpr):
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
def _dequantize_packed_kernel(buf_ptr, out_ptr, n_groups_row, chunk_bytes, GROUP: tl.constexpr,
                              GROUPS_PER_PROGRAM: tl.constexpr):
    vals, scales, flat, ok = _packed_tile(tl.program_id(1), n_groups_row, chunk_bytes, GROUP, GROUPS_PER_PROGRAM)
    tl.store(out_ptr + flat, _load_packed(buf_ptr, vals, scales, ok).to(out_ptr.dtype.element_ty), mask=ok[:, None])


def quantize_int8_packed(x: torch.Tensor, parts: int, group: int = GROUP, groups_per_program: int = 16):
    """Same contract as reference.quantize_int8_packed_ref: (parts, chunk bytes) uint8."""
    from meshplan.kernels.reference import packed_chunk_bytes

    x = x.contiguous().reshape(-1)
    if x.numel() % (parts * group):
        raise ValueError(f"quantize_int8_packed: {x.numel()} elements is not a multiple of {parts} × {group}")
    chunk = x.numel() // parts
    nbytes = packed_chunk_bytes(chunk, group)
    buf = torch.empty(parts, nbytes, dtype=torch.uint8, device=x.device)
    grid = (triton.cdiv(chunk // group, groups_per_program), parts)
    _quantize_packed_kernel[grid](x, buf, chunk // group, nbytes, GROUP=group, GROUPS_PER_PROGRAM=groups_per_program)
    return buf


def dequant_sum_requant(buf: torch.Tensor, group: int = GROUP, groups_per_program: int = 16) -> torch.Tensor:
    """Same contract as reference.dequant_sum_requant_ref: (n, chunk bytes) → (chunk bytes,)."""
    out = torch.empty(buf.shape[1], dtype=torch.uint8, device=buf.device)
    return _sum_rows(buf, out, group, groups_per_program, requant=True)


def dequant_sum(buf: torch.Tensor, group: int = GROUP, dtype=torch.float32, groups_per_program: int = 16) -> torch.Tensor:
    """Same contract as reference.dequant_sum_ref: (n, chunk bytes) → (chunk,) in `dtype`."""
    out = torch.empty(buf.shape[1] // (group + 4) * group, dtype=dtype, device=buf.device)
    return _sum_rows(buf, out, group, groups_per_program, requant=False)


def _sum_rows(buf: torch.Tensor, out: torch.Tensor, group: int, groups_per_program: int, requant: bool) -> torch.Tensor:
    n, nbytes = buf.shape
    n_groups = nbytes // (group + 4)
    grid = (triton.cdiv(n_groups, groups_per_program), 1)
    _dequant_sum_kernel[grid](buf.contiguous(), out, n, n_groups, nbytes, GROUP=group,
                              GROUPS_PER_PROGRAM=groups_per_program, REQUANT=requant)
    return out


def dequantize_packed(buf: torch.Tensor, group: int = GROUP, dtype=torch.float32,
                      groups_per_program: int = 16) -> torch.Tensor:
    """Same contract as reference.dequantize_packed_ref."""
    rows, nbytes = buf.shape
    n_groups = nbytes // (group + 4)
    out = torch.empty(rows * n_groups * group, dtype=dtype, device=buf.device)
    grid = (triton.cdiv(n_groups, groups_per_program), rows)
    _dequantize_packed_kernel[grid](buf.contiguous(), out, n_groups, nbytes, GROUP=group,
                                    GROUPS_PER_PROGRAM=groups_per_program)
    return out

"""int8 quantize / dequantize with per-group fp32 scales (Triton), and a quantized all-reduce.

The all-reduce (for TP-SSM's one all-reduce per block): quantize, all-to-all the int8 chunks (each
rank receives every rank's copy of its own 1/n), dequantize and sum them in fp32, quantize that sum,
all-gather the int8 chunks, dequantize. Bytes on the wire per rank: 2·(n−1)/n of the int8 message
(with its scales) — half of a bf16 all-reduce's. References: meshplan/kernels/reference.py.
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
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, amax / 127.0, 1.0)
    q = x / scale[:, None]
    q = tl.where(q >= 0, tl.floor(q + 0.5), tl.ceil(q - 0.5))  # round half away from zero
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    tl.store(q_ptr + offs, q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=rows < n_groups)


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

"""The executor's cross-entropy over a rank's vocabulary slice in three Triton passes, each reading the logits
(or the saved exponentials) once, in place of the torch path's eight (executor/layouts/vocab.py
_VocabParallelCE): for logits (n, V) in e bytes,

    stats     per row: the max m, Σ exp(l − m), and the label's logit where the label is in the slice
              reads e a logit
    exps      z = exp(l − M) in fp32, M the rows' max over the vocabulary axis            reads e, writes 4
    grad      dl = (z / S − [j = label]) · g, in e                                           reads 4, writes e

14 bytes a logit in bf16 (the torch path 52), 20 in fp32 (48); between stats and exps the caller all-reduces
the maxima over the vocabulary axis and rescales the sums. It saves what the torch path saves (the fp32
exponentials, their sums, the label's column and whether it lies in the slice), so the memory model's
logits phase holds either. Reference: the torch path itself (tests/test_cross_entropy.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Columns a program takes at a time (stats walks its row in blocks of this; exps and grad tile rows and
# columns); 4 warps. Not tuned.
BLOCK = 4096
WARPS = 4


@triton.jit
def _stats(l_ptr, labels_ptr, m_ptr, s_ptr, t_ptr, V, LT, start, BV: tl.constexpr):
    """Grid (rows,): the row's max, its sum of exponentials relative to it, and its label's logit (0 outside
    the slice), by an online pass over column blocks."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BV)
    m = tl.full((BV,), float("-inf"), tl.float32)
    s = tl.zeros((BV,), tl.float32)
    for c0 in range(0, V, BV):
        mask = c0 + cols < V
        x = tl.load(l_ptr + row * LT + c0 + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.where(mask, tl.exp(x - m_new), 0.0)
        s = tl.where(m_new == float("-inf"), 0.0, s)
        m = m_new
    top = tl.max(m, 0)
    total = tl.sum(s * tl.exp(m - top), 0)
    label = tl.load(labels_ptr + row) - start
    inside = (label >= 0) & (label < V)
    t = tl.load(l_ptr + row * LT + tl.where(inside, label, 0)).to(tl.float32)
    tl.store(m_ptr + row, top)
    tl.store(s_ptr + row, total)
    tl.store(t_ptr + row, tl.where(inside, t, 0.0))


@triton.jit
def _exps(l_ptr, m_ptr, z_ptr, V, LT, BV: tl.constexpr):
    """Grid (rows, column blocks): z = exp(l − M) in fp32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BV + tl.arange(0, BV)
    mask = cols < V
    x = tl.load(l_ptr + row * LT + cols, mask=mask, other=0.0).to(tl.float32)
    top = tl.load(m_ptr + row)
    tl.store(z_ptr + row * V + cols, tl.exp(x - top), mask=mask)


@triton.jit
def _grad(z_ptr, sums_ptr, idx_ptr, inside_ptr, g_ptr, out_ptr, V, BV: tl.constexpr):
    """Grid (rows, column blocks): the logits' gradient (z / S − [j = label]) · g in the logits' dtype."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BV + tl.arange(0, BV)
    mask = cols < V
    z = tl.load(z_ptr + row * V + cols, mask=mask, other=0.0)
    total = tl.load(sums_ptr + row)
    g = tl.load(g_ptr + row).to(tl.float32)
    hit = (cols == tl.load(idx_ptr + row)) & (tl.load(inside_ptr + row) != 0)
    d = (z / total - tl.where(hit, 1.0, 0.0)) * g
    tl.store(out_ptr + row * V + cols, d.to(out_ptr.dtype.element_ty), mask=mask)


def row_stats(logits: torch.Tensor, labels: torch.Tensor, start: int):
    """(max, sum of exp(l − max), the label's logit or 0) a row of logits (n, V), fp32 each."""
    n, v = logits.shape
    m, s, t = (torch.empty(n, device=logits.device, dtype=torch.float32) for _ in range(3))
    if n:
        _stats[(n,)](logits, labels, m, s, t, v, logits.stride(0), start, BV=min(BLOCK, triton.next_power_of_2(v)),
                     num_warps=WARPS)  # fmt: skip
    return m, s, t


def exponentials(logits: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """exp(logits − top[:, None]) in fp32."""
    n, v = logits.shape
    z = torch.empty(n, v, device=logits.device, dtype=torch.float32)
    bv = min(BLOCK, triton.next_power_of_2(v))
    if n:
        _exps[(n, triton.cdiv(v, bv))](logits, top, z, v, logits.stride(0), BV=bv, num_warps=WARPS)
    return z


def logits_grad(z, sums, idx, inside, grad, dtype) -> torch.Tensor:
    """(z / sums − one-hot of idx where inside) · grad, a row each, in `dtype`."""
    n, v = z.shape
    out = torch.empty(n, v, device=z.device, dtype=dtype)
    bv = min(BLOCK, triton.next_power_of_2(v))
    if n:
        _grad[(n, triton.cdiv(v, bv))](z, sums, idx, inside.to(torch.int8), grad.contiguous(), out, v, BV=bv,
                                       num_warps=WARPS)  # fmt: skip
    return out

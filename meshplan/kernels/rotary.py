"""The rotary position embedding in Triton, one pass: each element of the turned heads read and written
once, cos and sin made in the kernel — nothing of the tensor's size (and no table) in memory.

For t (b, s, heads, d) and a token at position p, pair i of a turned head (x1 = t[..., i],
x2 = t[..., d/2 + i]) becomes

    (x1·cos − x2·sin, x2·cos + x1·sin),   angle = p · inv_freq[i]   (sin negated for the inverse)

as meshplan.executor.rotary.Rotary.apply computes it, with transformers' tables: the angle a product
of fp32 position and fp32 frequency, cos and sin rounded to the tensor's dtype before they multiply.
On the GPU cos and sin are libdevice's cosf / sinf, named so (CUDA's precise math library, which torch's
cos and sin kernels call too; not the approximate cos.approx / sin.approx); under TRITON_INTERPRET,
which has no libdevice, numpy's through tl.cos / tl.sin (within an fp32 ulp of torch's). The products
are taken in fp32 and rounded once, where the torch ops round each product to a bf16 tensor's dtype:
a bf16 result may differ from theirs by an ulp; the rounded cos and sin do not.

`out` is where the result goes: t itself in place (the forward, in the QKV projection's output), or
another tensor of the same shape (the backward: the gradient rotated into a fresh tensor, autograd's
incoming gradient left alone), and then heads past `turned` are copied as they are (the value heads
of a QKV gradient), so that one pass writes the whole of it.
Reference: meshplan.executor.rotary.Rotary.apply (torch ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# A program's tile: up to TOKENS tokens × heads × d/2 pairs, TILE pairs in all (the heads share each
# token's cos and sin); WARPS warps. Compiled offline for sm_90 (Triton 3.9, bf16, d = 128), 8 tokens ×
# 8 heads on 8 warps takes 117 registers a thread and no stack, where 4 warps took 145 and 32 bytes of
# stack. Timed, not tuned, on an H100: benchmarks/results/elementwise-h100.json
# (`python benchmarks/bench_elementwise.py`; `--tune` sweeps them).
TILE = 4096
TOKENS = 8
WARPS = 8


@triton.jit
def _bf16_nearest(x):
    """fp32 x with its low 16 bits rounded off to nearest even: what a cast to bf16 keeps. Triton's
    interpreter casts to bf16 by truncation; rounding the bits first makes its cast the GPU's."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _rotate(
    src_ptr,
    dst_ptr,
    pos_ptr,
    freq_ptr,
    S,
    HEADS,
    TURNED,
    HALF,
    SB,
    ST,
    SH,
    DB,
    DT,
    DH,
    SIGN,
    INTERPRETED: tl.constexpr,
    ROUND_BF16: tl.constexpr,
    BT: tl.constexpr,
    BH: tl.constexpr,
    BD: tl.constexpr,
):
    """Grid (token blocks, head blocks, batch): heads below TURNED rotated, the others copied."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    j = tl.arange(0, BD)
    b = tl.program_id(2).to(tl.int64)
    pos = tl.load(pos_ptr + t, mask=t < S, other=0).to(tl.float32)  # exact below 2^24, as positions.float()
    freq = tl.load(freq_ptr + j, mask=j < HALF, other=0.0)
    angle = pos[:, None] * freq[None, :]
    if INTERPRETED:
        cos, sin = tl.cos(angle), tl.sin(angle)
    else:
        cos, sin = libdevice.cos(angle), libdevice.sin(angle)
    if ROUND_BF16:
        cos, sin = _bf16_nearest(cos), _bf16_nearest(sin)
    cos = cos.to(dst_ptr.dtype.element_ty).to(tl.float32)[:, None, :]
    sin = (sin.to(dst_ptr.dtype.element_ty).to(tl.float32) * SIGN)[:, None, :]
    mask = (t < S)[:, None, None] & (h < HEADS)[None, :, None] & (j < HALF)[None, None, :]
    t64 = t.to(tl.int64)[:, None, None]  # tokens × row stride passes 2^31 at long context
    src = src_ptr + b * SB + t64 * ST + h[None, :, None] * SH + j[None, None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    turn = (h < TURNED)[None, :, None]
    y1 = tl.where(turn, x1 * cos - x2 * sin, x1)
    y2 = tl.where(turn, x2 * cos + x1 * sin, x2)
    dst = dst_ptr + b * DB + t64 * DT + h[None, :, None] * DH + j[None, None, :]
    if ROUND_BF16:
        y1, y2 = _bf16_nearest(y1), _bf16_nearest(y2)
    tl.store(dst, y1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, y2.to(dst_ptr.dtype.element_ty), mask=mask)


def rotate(
    t: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    inverse: bool = False,
    out: torch.Tensor | None = None,
    turned: int | None = None,
    tile: int = TILE,
    tokens: int = TOKENS,
    warps: int = WARPS,
) -> torch.Tensor:
    """t (b, s, heads, d), its last dimension contiguous, turned by `positions` (s,) at `inv_freq`
    (d/2,) fp32 — backwards where `inverse` — into `out` (t itself by default: in place). Only the
    first `turned` heads (all by default) turn; with an `out` apart from t the others are copied."""
    b, s, heads, d = t.shape
    out = t if out is None else out
    assert t.stride(-1) == 1 and out.stride(-1) == 1 and out.shape == t.shape, (t.stride(), out.shape)
    if t.numel() == 0:
        return out
    half = d // 2
    bd = triton.next_power_of_2(half)
    bt = min(tokens, triton.next_power_of_2(s))
    bh = max(1, min(triton.next_power_of_2(heads), tile // (bt * bd)))
    # In place only the turned heads need touching; into another tensor every head is written.
    touched = heads if out is not t or turned is None else turned
    _rotate[(triton.cdiv(s, bt), triton.cdiv(touched, bh), b)](
        t,
        out,
        positions.to(device=t.device).contiguous(),
        inv_freq.to(device=t.device, dtype=torch.float32).contiguous(),
        s,
        touched,
        heads if turned is None else turned,
        half,
        t.stride(0),
        t.stride(1),
        t.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        -1.0 if inverse else 1.0,
        INTERPRETED=not t.is_cuda,
        ROUND_BF16=not t.is_cuda and t.dtype == torch.bfloat16,
        BT=bt,
        BH=bh,
        BD=bd,
        num_warps=warps,
    )
    return out

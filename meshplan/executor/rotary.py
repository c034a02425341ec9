"""Rotary position embedding (Su et al. 2021, arXiv 2104.09864) as transformers' Llama applies it:
each head's first and second halves are the two coordinates of d/2 rotations, q_i and k_i turned by
position · inv_freq_i (the "rotate_half" convention HF checkpoints are stored in).

Nothing is kept for backward: a rotation's gradient is the inverse rotation of the output's gradient,
and cos / sin are recomputed from the positions. Rotating in place inside the QKV projection's output
keeps the saved activations what meshplan.costmodel.activations counts (q, k, v as one tensor); an
out-of-place q and k would keep a second copy alive through v's view of the projection.
"""

from __future__ import annotations

import math

import torch

from meshplan.models import RopeSpec


def inv_freq(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """(head_dim / 2,) fp32 angular frequencies, computed as transformers does; "linear" divides them by the factor,
    "llama3" by
    the factor below its low-frequency wavelength, not at all above the high one, and blends between
    (transformers' _compute_llama3_parameters). Other kinds fall back to the default frequencies
    (executor.support.executed_spec names them as not executed)."""
    freq = 1.0 / rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if rope.kind == "linear":
        return freq / rope.factor
    if rope.kind == "llama3":
        low_wavelen = rope.original_max_positions / rope.low_freq_factor
        high_wavelen = rope.original_max_positions / rope.high_freq_factor
        wavelen = 2 * math.pi / freq
        smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        blended = (1 - smooth) * freq / rope.factor + smooth * freq
        out = torch.where(wavelen > low_wavelen, freq / rope.factor, freq)
        middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(middle, blended, out)
    return freq


class Rotary:
    """The rotation of one head width: `apply(t, positions)` turns t (b, s, n, d) in place."""

    def __init__(self, rope: RopeSpec, head_dim: int):
        self.freq = inv_freq(rope, head_dim)
        self.half = head_dim // 2

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (s, 1, d/2) in the rotated tensor's dtype, from fp32 angles as transformers takes
        them (positions are exact in fp32 up to 2^24), whatever that dtype."""
        angles = positions.float()[:, None] * self.freq.to(positions.device)[None, :]
        return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]

    def apply(self, t: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """t (b, s, n, d), rotated in place by each row's position (backwards when `inverse`)."""
        cos, sin = self._tables(positions, t.dtype)
        if inverse:
            sin = -sin
        x1, x2 = t[..., : self.half], t[..., self.half :]
        first = x1 * cos - x2 * sin
        x2.mul_(cos).addcmul_(x1, sin)
        x1.copy_(first)
        return t


class _RotateQK(torch.autograd.Function):
    """The query and key heads of a (b, s, q + k + v) projection output, rotated in place."""

    @staticmethod
    def forward(ctx, qkv, rotary, positions, q_width, kv_width, head_dim):
        ctx.args = (rotary, positions, q_width, kv_width, head_dim)
        _turn(qkv, *ctx.args)
        ctx.mark_dirty(qkv)
        return qkv

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        _turn(grad, *ctx.args, inverse=True)
        return grad, None, None, None, None, None


def _turn(qkv, rotary, positions, q_width, kv_width, head_dim, inverse=False):
    b, s, _ = qkv.shape
    qk = qkv[..., : q_width + kv_width]
    # Queries and keys are both whole heads of head_dim: one (b, s, heads + kv heads, d) view.
    rotary.apply(qk.unflatten(-1, ((q_width + kv_width) // head_dim, head_dim)), positions, inverse)


def rotate_qk(
    qkv: torch.Tensor, rotary: Rotary | None, positions: torch.Tensor, q_width: int, kv_width: int, head_dim: int
) -> torch.Tensor:
    """qkv with its query and key heads rotated by `positions` (s,), in place; unchanged without a rotary."""
    if rotary is None:
        return qkv
    if torch.is_grad_enabled() and qkv.requires_grad:
        return _RotateQK.apply(qkv, rotary, positions, q_width, kv_width, head_dim)
    _turn(qkv, rotary, positions, q_width, kv_width, head_dim)
    return qkv

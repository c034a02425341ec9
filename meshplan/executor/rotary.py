"""Rotary position embedding (Su et al. 2021, arXiv 2104.09864) as transformers' Llama applies it:
each head's first and second halves are the two coordinates of d/2 rotations, q_i and k_i turned by
position · inv_freq_i (the "rotate_half" convention HF checkpoints are stored in).

Nothing is kept for backward: a rotation's gradient is the inverse rotation of the output's gradient,
and cos / sin are recomputed from the positions. On the GPU one Triton pass each way
(meshplan.kernels.rotary: cos and sin made in the kernel, the backward's gradient written whole into a
fresh tensor); elsewhere the torch ops below. Rotating in place inside the QKV projection's output
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


def _kernel(t: torch.Tensor) -> bool:
    """Whether the Triton rotation (meshplan.kernels.rotary) turns t: a CUDA tensor it computes in fp32
    (not float64) whose head dimension is contiguous."""
    return t.is_cuda and t.dtype in (torch.bfloat16, torch.float16, torch.float32) and t.stride(-1) == 1


class Rotary:
    """The rotation of one head width: `apply(t, positions)` turns t (b, s, n, d) in place."""

    def __init__(self, rope: RopeSpec, head_dim: int):
        self.freq = inv_freq(rope, head_dim)
        self.half = head_dim // 2
        self._freq_on: dict[torch.device, torch.Tensor] = {}  # the frequencies on each GPU the kernel runs

    def freq_on(self, device: torch.device) -> torch.Tensor:
        """The fp32 frequencies on `device`, copied there once."""
        if device not in self._freq_on:
            self._freq_on[device] = self.freq.to(device)
        return self._freq_on[device]

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (s, 1, d/2) in the rotated tensor's dtype, from fp32 angles as transformers takes
        them (positions are exact in fp32 up to 2^24), whatever that dtype."""
        angles = positions.float()[:, None] * self.freq.to(positions.device)[None, :]
        return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]

    def apply(self, t: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """t (b, s, n, d), rotated in place by each row's position (backwards when `inverse`): one Triton
        pass on the GPU, torch ops elsewhere."""
        if _kernel(t):
            from meshplan.kernels.rotary import rotate

            return rotate(t, positions, self.freq_on(t.device), inverse)
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
        rotary, positions, q_width, kv_width, head_dim = ctx.args
        if _kernel(grad) and grad.shape[-1] % head_dim == 0:
            # One pass into a fresh tensor (autograd's gradient may be shared): q and k turned back, v copied.
            from meshplan.kernels.rotary import rotate

            heads = grad.unflatten(-1, (grad.shape[-1] // head_dim, head_dim))
            out = torch.empty(heads.shape, dtype=grad.dtype, device=grad.device)
            rotate(heads, positions, rotary.freq_on(grad.device), True, out, (q_width + kv_width) // head_dim)
            return out.flatten(-2), None, None, None, None, None
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

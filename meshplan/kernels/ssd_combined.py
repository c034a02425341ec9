"""The Triton SSD scan under autograd: the forward of meshplan.kernels.ssd and the backward of
meshplan.kernels.ssd_bwd joined (as mamba_ssm's ssd_combined joins its chunk kernels), so that
neither of those imports the other's user."""

from __future__ import annotations

import torch

from meshplan.kernels.ssd import ssd_forward
from meshplan.kernels.ssd_bwd import ssd_backward


class SSDChunkedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, initial_state, seq_idx, chunk, bp):
        y, final = ssd_forward(x, dt, A, B, C, D, initial_state, chunk, bp, seq_idx)
        ctx.save_for_backward(x, dt, A, B, C, D, initial_state, seq_idx)
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, dt, A, B, C, D, initial_state, seq_idx = ctx.saved_tensors
        if dy is None:  # only the final state was used (a sequence shard's summary)
            dy = torch.zeros_like(x)
        grads = ssd_backward(dy, dfinal, x, dt, A, B, C, D, initial_state, seq_idx, ctx.chunk)
        return (*grads, None, None, None)


def ssd_chunked(x, dt, A, B, C, D=None, initial_state=None, chunk: int = 64, bp: int | None = None, seq_idx=None):
    """The chunked scan; differentiable (Triton backward) when any input requires grad."""
    return SSDChunkedFn.apply(x, dt, A, B, C, D, initial_state, seq_idx, chunk, bp)

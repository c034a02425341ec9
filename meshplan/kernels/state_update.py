"""Selective state update for decode (Triton): one token per sequence, the SSM state updated in place.
Reference: meshplan.kernels.reference.selective_state_update_ref."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _state_update_kernel(
    state_ptr,
    x_ptr,
    dt_ptr,
    a_ptr,
    b_ptr,
    c_ptr,
    d_ptr,
    y_ptr,
    H,
    G,
    P,
    N,
    HAS_D: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
):
    pid_b, pid_h, pid_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g = pid_h // (H // G)
    p = pid_p * BP + tl.arange(0, BP)
    n = tl.arange(0, BN)
    pm, nm = p < P, n < N
    s_offs = ((pid_b * H + pid_h) * P + p[:, None]) * N + n[None, :]
    mask = pm[:, None] & nm[None, :]
    s = tl.load(state_ptr + s_offs, mask=mask, other=0.0)
    x = tl.load(x_ptr + (pid_b * H + pid_h) * P + p, mask=pm, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + pid_b * H + pid_h).to(tl.float32)
    a = tl.load(a_ptr + pid_h).to(tl.float32)
    bv = tl.load(b_ptr + (pid_b * G + g) * N + n, mask=nm, other=0.0).to(tl.float32)
    cv = tl.load(c_ptr + (pid_b * G + g) * N + n, mask=nm, other=0.0).to(tl.float32)
    s = s * tl.exp(dt * a) + (dt * x)[:, None] * bv[None, :]
    tl.store(state_ptr + s_offs, s, mask=mask)
    y = tl.sum(s * cv[None, :], axis=1)
    if HAS_D:
        y += tl.load(d_ptr + pid_h).to(tl.float32) * x
    tl.store(y_ptr + (pid_b * H + pid_h) * P + p, y.to(y_ptr.dtype.element_ty), mask=pm)


def selective_state_update(state, x, dt, A, B, C, D=None, bp: int = 16):
    """Same contract as the reference: state (b, h, p, n) fp32 contiguous, updated in place."""
    b, h, p = x.shape
    g, n = B.shape[1], B.shape[2]
    y = torch.empty_like(x)
    grid = (b, h, triton.cdiv(p, bp))
    _state_update_kernel[grid](
        state,
        x.contiguous(),
        dt.contiguous(),
        A.contiguous(),
        B.contiguous(),
        C.contiguous(),
        D if D is not None else A,
        y,
        h,
        g,
        p,
        n,
        HAS_D=D is not None,
        BP=bp,
        BN=triton.next_power_of_2(n),
    )
    return y

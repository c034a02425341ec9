"""The Triton SwiGLU and rotary kernels (interpreted without a GPU) against their torch references:
SwiGLU forward and backward on odd shapes (rows past a block, f not a power of two, rows a stride
apart) in fp32 and bf16 against autograd through the float64 reference; the rotation against
Rotary.apply forward and inverse, at positions offset as decode's are; and a dense layer run with both
kernels dispatched on the CPU: the same output, gradients and saved bytes as the torch path."""

import pytest
import torch

from meshplan.executor import experts, rotary
from meshplan.executor.blocks import DenseLayer
from meshplan.executor.experts import SwiGLUFn
from meshplan.executor.rotary import Rotary
from meshplan.executor.saved import count_saved_bytes
from meshplan.kernels.reference import swiglu_ref
from meshplan.kernels.rotary import rotate
from meshplan.kernels.swiglu import swiglu_bwd, swiglu_fwd
from meshplan.models import RopeSpec, dense

# Outputs come from torch.empty poisoned with NaN: an element a kernel leaves unwritten fails.
pytestmark = pytest.mark.usefixtures("poison_empty")

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _h(rows, f, dtype, pad, seed=0):
    """h (rows, 2f); with `pad`, the middle columns of a wider tensor (rows 2f + pad apart)."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(rows, 2 * f + pad, generator=gen).to(dtype)
    return wide[:, pad // 2 : pad // 2 + 2 * f], torch.randn(rows, f, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, f, pad, tiles", [(5, 24, 0, {}), (37, 40, 6, dict(tile=64, block_max=16))])
def test_swiglu_matches_autograd_through_the_reference(rows, f, pad, tiles, dtype):
    """`tiles`: small programs, so that a row spans several column blocks and the last is ragged."""
    h, g = _h(rows, f, dtype, pad, seed=rows)
    assert h.stride(0) == 2 * f + pad
    ref = h.double().requires_grad_()
    want = swiglu_ref(ref)
    out = swiglu_fwd(h, **tiles)
    assert out.dtype == dtype and out.shape == (rows, f)
    torch.testing.assert_close(out.double(), want, **TOL[dtype])
    want.backward(g.double())
    dh = swiglu_bwd(h, g, **tiles)
    assert dh.dtype == dtype and dh.shape == (rows, 2 * f) and dh.is_contiguous()
    torch.testing.assert_close(dh.double(), ref.grad, **TOL[dtype])


def test_swiglu_takes_batched_rows_and_a_strided_gradient():
    """h (b, s, 2f) and the output's gradient a column slice: read where they lie."""
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(2, 3, 2 * 10, generator=gen)
    g = torch.randn(2, 3, 15, generator=gen)[..., 2:12]
    ref = h.double().requires_grad_()
    want = swiglu_ref(ref)
    torch.testing.assert_close(swiglu_fwd(h).double(), want, **TOL[torch.float32])
    want.backward(g.double())
    torch.testing.assert_close(swiglu_bwd(h, g).double(), ref.grad, **TOL[torch.float32])


def test_swiglu_function_saves_only_its_input():
    """SwiGLUFn keeps h = [gate; up] and nothing else (autograd through silu and a product keeps
    silu(gate) beside it); its gradient is autograd's."""
    h = torch.randn(4, 2 * 12, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 12, dtype=torch.float64)
    with count_saved_bytes() as saved:
        out = SwiGLUFn.apply(h)
    assert saved == {"bytes": h.numel() * 8, "tensors": 1}
    (grad,) = torch.autograd.grad(out, h, g)
    leaf = h.detach().requires_grad_()
    want = swiglu_ref(leaf)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    want.backward(g)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-14, atol=1e-14)


def _qkv(b, s, heads, kv_heads, d, dtype, seed):
    """A (b, s, (heads + 2·kv_heads)·d) projection output whose rows lie 5 elements apart more than its
    width (a column slice), as the kernel may meet it."""
    width = (heads + 2 * kv_heads) * d
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, s, width + 5, generator=gen).to(dtype)[..., :width]


ROTARY_CASES = [
    # (b, s, heads, kv heads, head_dim, first position, rope)
    (2, 5, 4, 2, 16, 0, RopeSpec()),
    (1, 19, 3, 1, 12, 37, RopeSpec(theta=500000.0)),  # d/2 = 6: not a power of two; positions offset
    (2, 1, 4, 4, 8, 1000, RopeSpec(kind="linear", factor=4.0)),  # one decoded token
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, s, heads, kv_heads, d, start, rope", ROTARY_CASES)
@pytest.mark.parametrize("inverse", [False, True])
def test_rotation_matches_rotary_apply(b, s, heads, kv_heads, d, start, rope, dtype, inverse):
    """In place on the q and k heads of a QKV output: Rotary.apply's result (to an fp32 ulp of cos /
    sin, numpy's against torch's; a bf16 ulp where torch rounds each product), v untouched."""
    rot = Rotary(rope, d)
    qkv = _qkv(b, s, heads, kv_heads, d, dtype, seed=s)
    positions = torch.arange(start, start + s)
    turned = heads + kv_heads
    want = qkv.clone()
    rot.apply(want[..., : turned * d].unflatten(-1, (turned, d)), positions, inverse)
    got = qkv.clone()
    rotate(got[..., : turned * d].unflatten(-1, (turned, d)), positions, rot.freq, inverse)
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert torch.equal(got[..., turned * d :], qkv[..., turned * d :])
    # bf16: the tables are rounded to bf16 as Rotary's; the products then rounded once (within an ulp)
    if dtype == torch.bfloat16:
        cos, sin = rot._tables(positions, dtype)
        sin = -sin if inverse else sin
        x = qkv[..., : turned * d].unflatten(-1, (turned, d)).double()
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        c, s_ = cos.double(), sin.double()
        exact = torch.cat([x1 * c - x2 * s_, x2 * c + x1 * s_], -1).to(dtype)
        diff = got[..., : turned * d].unflatten(-1, (turned, d)).double() - exact.double()
        assert diff.abs().max() <= exact.double().abs().max() * 2**-8


def test_rotation_into_a_fresh_tensor_copies_the_unturned_heads():
    """The backward's form: the gradient left as it was, the result whole in `out` — q and k turned
    back, v copied — equal to the torch path's clone and inverse."""
    rot = Rotary(RopeSpec(), 8)
    grad = _qkv(2, 7, 4, 2, 8, torch.float32, seed=1)
    before = grad.clone()
    heads = grad.unflatten(-1, (8, 8))
    out = torch.empty(heads.shape)
    rotate(heads, torch.arange(3, 10), rot.freq, True, out, 6)
    assert torch.equal(grad, before)
    want = grad.clone()
    rotary._turn(want, rot, torch.arange(3, 10), 32, 16, 8, inverse=True)
    torch.testing.assert_close(out.flatten(-2), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(out.flatten(-2)[..., 48:], grad[..., 48:])


def test_dense_layer_through_the_kernels_is_the_torch_path(monkeypatch):
    """A dense layer (GQA, SwiGLU MLP) with both kernels dispatched as on a GPU (interpreted here):
    the torch path's output and gradients, and the same bytes saved for backward."""
    model = dense("tiny", 32, 1, 4, 2, 48, 100)
    torch.manual_seed(0)
    layer = DenseLayer(model)
    x = torch.randn(2, 6, 32)

    def run():
        xs = x.clone().requires_grad_()
        with count_saved_bytes(list(layer.parameters())) as saved:
            y = layer(xs)
        y.square().sum().backward()
        grads = [xs.grad] + [p.grad.clone() for p in layer.parameters()]
        layer.zero_grad()
        return y.detach(), grads, saved["bytes"]

    y, grads, saved = run()
    monkeypatch.setattr(experts, "_swiglu_kernel", lambda t: t.dtype == torch.float32)
    monkeypatch.setattr(rotary, "_kernel", lambda t: t.dtype == torch.float32 and t.stride(-1) == 1)
    y_k, grads_k, saved_k = run()
    torch.testing.assert_close(y_k, y, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_k, grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert saved_k == saved

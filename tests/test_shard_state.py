"""Triton correction of a sequence shard's scan for its entering state (interpreted without a GPU),
forward and backward, against autograd through the float64 torch reference."""

import pytest
import torch

from meshplan.kernels.reference import entering_state_ref
from meshplan.kernels.shard_state import EnteringStateFn

# Outputs come from torch.empty poisoned with NaN: an element a kernel leaves unwritten fails.
pytestmark = pytest.mark.usefixtures("poison_empty")


def _inputs(b, s, h, p, g, n, seed, wide_c):
    gen = torch.Generator().manual_seed(seed)
    y0 = torch.randn(b, s, h, p, generator=gen)
    # C as the executor passes it: a column slice of the conv output (tokens apart in memory), or alone.
    xbc = torch.randn(b, s, 3, g, n, generator=gen)
    C = xbc[:, :, 1] if wide_c else xbc[:, :, 1].contiguous()
    dta = -torch.rand(b, h, s, generator=gen) * 0.2
    cum = torch.cumsum(dta, -1)  # (b, h, s), as the executor forms it
    E = torch.randn(b, h, p, n, generator=gen)
    dy = torch.randn(b, s, h, p, generator=gen)
    return (y0, C, cum, E), dy


@pytest.mark.parametrize(
    "b, s, h, p, g, n, wide_c",
    [(2, 100, 4, 16, 2, 16, True), (1, 64, 3, 24, 1, 20, False), (1, 200, 2, 16, 1, 32, True)],
)
def test_matches_autograd_through_the_reference(b, s, h, p, g, n, wide_c):
    ins, dy = _inputs(b, s, h, p, g, n, seed=s + h, wide_c=wide_c)
    mine = [t.clone().requires_grad_() for t in ins]
    ref = [t.clone().double().requires_grad_() for t in ins]
    out = EnteringStateFn.apply(*mine)
    want = entering_state_ref(ref[0], ref[1], ref[2].transpose(1, 2), ref[3])
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    out.backward(dy)
    want.backward(dy.double())
    for name, got, exp in zip(("y0", "C", "cum", "E"), mine, ref):
        torch.testing.assert_close(got.grad.double(), exp.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_zero_entering_state_leaves_the_scan_output():
    """E = 0 (the first shard): y is y0 bit for bit, and C and cum get no gradient."""
    ins, dy = _inputs(1, 70, 2, 16, 1, 16, seed=1, wide_c=False)
    y0, C, cum, E = ins
    leaves = [t.clone().requires_grad_() for t in (y0, C, cum, torch.zeros_like(E))]
    out = EnteringStateFn.apply(*leaves)
    assert torch.equal(out, y0)
    out.backward(dy)
    assert torch.equal(leaves[0].grad, dy)
    assert not leaves[1].grad.any() and not leaves[2].grad.any()


def test_tokens_of_a_new_document_take_no_entering_state():
    """Packed documents: the executor sets cum to −inf on the tokens past the first boundary
    (layouts.mamba.ShardDocs.keep). Those tokens keep y0 bit for bit, every gradient stays finite, and
    the rest match the reference."""
    ins, dy = _inputs(2, 90, 3, 16, 1, 16, seed=5, wide_c=False)
    y0, C, cum, E = ins
    keep = torch.arange(90) < torch.tensor([[40], [0]])  # row 0: a boundary at 40; row 1: at the start
    cum = cum.masked_fill(~keep[:, None, :], -float("inf"))
    mine = [t.clone().requires_grad_() for t in (y0, C, cum, E)]
    ref = [t.clone().double().requires_grad_() for t in (y0, C, cum, E)]
    out = EnteringStateFn.apply(*mine)
    want = entering_state_ref(ref[0], ref[1], ref[2].transpose(1, 2), ref[3])
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    assert torch.equal(out[0, 40:], y0[0, 40:]) and torch.equal(out[1], y0[1])
    out.backward(dy)
    want.backward(dy.double())
    for name, got, exp in zip(("y0", "C", "E"), (mine[0], mine[1], mine[3]), (ref[0], ref[1], ref[3])):
        assert torch.isfinite(got.grad).all(), name
        torch.testing.assert_close(got.grad.double(), exp.grad, rtol=1e-4, atol=1e-4, msg=name)
    kept = keep[:, None, :].expand_as(cum)
    assert torch.isfinite(mine[2].grad[kept]).all()
    torch.testing.assert_close(mine[2].grad[kept].double(), ref[2].grad[kept], rtol=1e-4, atol=1e-4)

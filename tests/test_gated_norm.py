"""Triton gated RMSNorm (interpreted without a GPU) against autograd through the torch reference,
for groups inside one rank and for a group split across two ranks (statistics summed by `reduce`)."""

import pytest
import torch

from meshplan.executor.blocks import gated_rmsnorm
from meshplan.kernels.gated_norm import gated_rmsnorm_triton, rmsnorm_triton

# Outputs come from torch.empty poisoned with NaN: an element a kernel leaves unwritten fails.
pytestmark = pytest.mark.usefixtures("poison_empty")


def _inputs(rows, channels, seed):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, rows, channels, generator=gen),
        torch.randn(2, rows, channels, generator=gen),
        torch.rand(channels, generator=gen) + 0.5,
        torch.randn(2, rows, channels, generator=gen),
    )


@pytest.mark.parametrize("rows, channels", [(5, 64), (19, 300)])
def test_plain_rmsnorm_matches_autograd_through_torch_ops(rows, channels):
    x, _, w, g = _inputs(rows, channels, seed=rows)
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    ref = [t.clone().double().requires_grad_() for t in (x, w)]
    out = rmsnorm_triton(*leaves, eps=1e-5)
    want = ref[0] * torch.rsqrt(ref[0].pow(2).mean(-1, keepdim=True) + 1e-5) * ref[1]
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    out.backward(g)
    want.backward(g.double())
    for mine, theirs in zip(leaves, ref):
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows, channels, group", [(5, 64, 64), (19, 96, 32), (3, 300, 300)])
def test_matches_reference_forward_and_backward(rows, channels, group):
    _check_against_reference(*_inputs(rows, channels, seed=channels), group)


def _check_against_reference(y, z, w, g, group):
    """Outputs, and the gradients of y, z and w, against autograd through the float64 torch reference."""
    leaves = [t.clone().requires_grad_() for t in (y, z, w)]
    ref = [t.clone().double().requires_grad_() for t in (y, z, w)]
    out = gated_rmsnorm_triton(*leaves, group)
    want = gated_rmsnorm(*ref, group)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    out.backward(g)
    want.backward(g.double())
    for mine, theirs in zip(leaves, ref):
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-4, atol=1e-4)


def test_group_split_across_ranks_equals_the_whole():
    """Two 'ranks' hold halves of one 128-channel group; `reduce` adds the other half's statistics
    (what the all-reduce does under TP-SSM): outputs and gradients equal the unsplit norm."""
    y, z, w, g = _inputs(7, 128, seed=3)
    whole = [t.clone().requires_grad_() for t in (y, z, w)]
    out = gated_rmsnorm_triton(*whole, 128)
    out.backward(g)
    halves = [[t[..., :64], t[..., 64:]] for t in (y, z)]
    w_halves = [w[:64], w[64:]]
    g_halves = [g[..., :64], g[..., 64:]]
    # Each half's statistics, computed first with no reduce, then exchanged through `reduce`.
    from meshplan.kernels.gated_norm import _stats

    def stats(i, dot):
        yy, zz = halves[0][i].reshape(-1, 64).contiguous(), halves[1][i].reshape(-1, 64).contiguous()
        d = g_halves[i].reshape(-1, 64).contiguous() if dot else None
        return _stats(yy, zz, d, w_halves[i], 64, dot)

    for i in range(2):
        other = 1 - i
        calls = iter([stats(other, False), stats(other, True)])
        leaves = [
            halves[0][i].clone().requires_grad_(),
            halves[1][i].clone().requires_grad_(),
            w_halves[i].clone().requires_grad_(),
        ]
        part = gated_rmsnorm_triton(*leaves, 128, local=64, reduce=lambda t: t + next(calls))  # noqa: B023 (called here)
        sl = slice(0, 64) if i == 0 else slice(64, 128)
        torch.testing.assert_close(part, out[..., sl].detach(), rtol=1e-5, atol=1e-5)
        part.backward(g_halves[i])
        torch.testing.assert_close(leaves[0].grad, whole[0].grad[..., sl], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(leaves[1].grad, whole[1].grad[..., sl], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(leaves[2].grad, whole[2].grad[sl], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("max_block, programs", [(16, None), (8192, 2)])
def test_one_pass_and_two_pass_kernels_agree(monkeypatch, max_block, programs):
    """Groups wider than FUSED_MAX_BLOCK take the two-pass kernels; the one-pass backward's programs
    each take several row blocks when there are few of them: both match the reference."""
    from meshplan.kernels import gated_norm

    monkeypatch.setattr(gated_norm, "FUSED_MAX_BLOCK", max_block)
    if programs:
        monkeypatch.setattr(gated_norm, "FUSED_BWD_PROGRAMS", programs)
        monkeypatch.setattr(gated_norm, "FUSED_TILE", 32)  # one row a program
    _check_against_reference(*_inputs(19, 96, seed=11), 32)


def test_reads_column_slices_in_place():
    """y and z as the executor passes them — column slices of one wider tensor — give the outputs and
    gradients of contiguous copies."""
    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(2, 9, 3 * 64 + 7, generator=gen, requires_grad=True)
    w = torch.rand(64, generator=gen) + 0.5
    g = torch.randn(2, 9, 64, generator=gen)

    def run(contiguous):
        y, z = wide[..., 64:128], wide[..., :64]
        if contiguous:
            y, z = y.contiguous(), z.contiguous()
        out = gated_rmsnorm_triton(y, z, w, 64)
        (grad,) = torch.autograd.grad((out * g).sum(), wide)
        return out, grad

    for got, want in zip(run(False), run(True)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("max_block", [None, 16])  # the one-pass kernel, and the two-pass one it falls back to
def test_output_may_be_turned_in_place(monkeypatch, max_block):
    """The norm's output is a tensor of its own, not a view made inside the autograd Function: the rotary
    turns Qwen3's normed query/key heads in place (executor.blocks.qkv_heads), which autograd forbids on such
    a view ("Output 0 of GatedRMSNormFnBackward is a view and is being modified inplace", run on an H200).
    The gradient through the in-place change is the reference's: per group of 32 channels, twice y·rstd·w."""
    import meshplan.kernels.gated_norm as gn

    if max_block is not None:
        monkeypatch.setattr(gn, "FUSED_MAX_BLOCK", max_block)
    x, _, w, g = _inputs(3, 64, seed=7)
    leaf, ref = x.clone().requires_grad_(), x.clone().double().requires_grad_()
    out = gated_rmsnorm_triton(leaf, None, w, 32)
    assert out._base is None
    out.mul_(2.0)  # in place, under autograd
    out.backward(g)
    groups = ref.unflatten(-1, (2, 32))
    want = 2 * (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + 1e-5)).flatten(-2) * w.double()
    want.backward(g.double())
    torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leaf.grad.double(), ref.grad, rtol=1e-4, atol=1e-4)

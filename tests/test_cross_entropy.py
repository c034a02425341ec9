"""The executor's cross-entropy through meshplan.kernels.cross_entropy (interpreted without a GPU) against its
torch path (executor/layouts/vocab.py _VocabParallelCE): losses and the logits' gradient, bf16 and fp32
logits, a row longer than the kernels' column block, labels inside and outside a vocabulary slice, and the
vocabulary split over two gloo ranks; the same tensors saved for backward."""

import pytest
import torch

from meshplan.executor.layouts import vocab
from meshplan.executor.saved import count_saved_bytes
from meshplan.kernels import cross_entropy

pytestmark = pytest.mark.usefixtures("poison_empty")


def _losses(logits, labels, start, fused, monkeypatch):
    monkeypatch.setattr(vocab, "_ce_kernels", lambda t: fused)
    leaf = logits.detach().clone().requires_grad_()
    g = torch.linspace(0.5, 1.5, len(labels))
    with count_saved_bytes([]) as saved:
        out = vocab._VocabParallelCE.apply(leaf, labels, start, None, None)
    out.backward(g)
    return out.detach(), leaf.grad, saved["bytes"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, v, start, block", [(5, 37, 0, None), (7, 70, 30, 16)])
def test_kernels_are_the_torch_path(monkeypatch, dtype, n, v, start, block):
    """`block`: a column block smaller than the row, so the online max and sum cross blocks; `start` past 0
    puts some labels outside the slice (their loss: log of the slice's sum, no target)."""
    if block:
        monkeypatch.setattr(cross_entropy, "BLOCK", block)
    gen = torch.Generator().manual_seed(n)
    logits = (3 * torch.randn(n, v, generator=gen)).to(dtype)
    labels = torch.randint(0, start + v + 5, (n,), generator=gen)
    want, want_grad, want_saved = _losses(logits, labels, start, False, monkeypatch)
    got, got_grad, got_saved = _losses(logits, labels, start, True, monkeypatch)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, **tol)
    assert got_saved == want_saved


def _split_rank(rank, world, fused):
    """Rank `rank` of a vocabulary split over tp: its slice's losses (the all-reduced ones) and gradient."""
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    from meshplan.executor.comm import build_mesh
    from meshplan.layout import parse_layout

    vocab._ce_kernels = lambda t: fused
    mesh = build_mesh(parse_layout(f"tp={world}"))
    gen = torch.Generator().manual_seed(3)
    logits = 3 * torch.randn(6, 40, generator=gen)
    labels = torch.randint(0, 40, (6,), generator=gen)
    width = 40 // world
    leaf = logits[:, rank * width : (rank + 1) * width].clone().requires_grad_()
    out = vocab._VocabParallelCE.apply(leaf, labels, rank * width, mesh, "tp")
    out.backward(torch.ones(6))
    return out.detach(), leaf.grad


def test_kernels_over_a_vocabulary_split():
    """Two gloo ranks, each with half the vocabulary: every rank's losses are the whole vocabulary's
    cross-entropy, and the gradients, laid side by side, the whole one's — through the kernels as through the
    torch path."""
    from meshplan.executor.distributed import run_distributed

    gen = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(6, 40, generator=gen)).requires_grad_()
    labels = torch.randint(0, 40, (6,), generator=gen)
    want = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    want.sum().backward()
    for fused in (False, True):
        ranks = run_distributed(_split_rank, 2, fused, timeout_s=120)
        for out, _ in ranks:
            torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.cat([g for _, g in ranks], 1), logits.grad, rtol=1e-5, atol=1e-5)

"""cat_last and split_last (meshplan/executor/blocks.py): torch.cat a block of rows at a time, and the
split whose backward uses it."""

import torch


def test_cat_last_in_row_blocks_equals_one_cat(monkeypatch):
    """cat_last joins a block of rows at a time (blocks of 2^31 elements on the GPU; here of 50): the
    result, and the gradient split_last's backward assembles, equal torch.cat's and autograd's."""
    from meshplan.executor import blocks

    monkeypatch.setattr(blocks, "CAT_BLOCK_ELEMENTS", 50)
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(2, 7, w, generator=gen) for w in (3, 5, 1)]
    assert torch.equal(blocks.cat_last(parts), torch.cat(parts, -1))
    t = torch.randn(2, 7, 9, generator=gen, requires_grad=True)
    a, b, c = blocks.split_last(t, [3, 5, 1])
    (a.sum() * 2 + (b * b).sum()).backward()  # c unused: its gradient is zeros
    want = torch.cat([torch.full_like(a, 2.0), 2 * b.detach(), torch.zeros_like(c)], -1)
    assert torch.equal(t.grad, want)

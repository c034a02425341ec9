"""comm.reduce_scatter on NCCL: the tensor form where the rank chunks lie end to end in memory (every
dimension before the split one of size 1), the list form elsewhere — both giving each rank the sum of its
chunk. NCCL stands in here as a two-rank emulation in one process (every rank holding the same tensor)."""

from types import SimpleNamespace

import pytest
import torch

from meshplan.executor import comm


def _two_ranks(monkeypatch, rank: int):
    calls = []

    def tensor_form(out, t, group=None):
        calls.append("tensor")
        out.copy_(2 * t.reshape(2, -1)[rank].view_as(out))  # rank's chunk of the flat tensor, from both ranks

    def list_form(out, chunks, group=None):
        calls.append("list")
        out.copy_(2 * chunks[rank])

    monkeypatch.setattr(comm.dist, "reduce_scatter_tensor", tensor_form)
    monkeypatch.setattr(comm.dist, "reduce_scatter", list_form)
    axis = SimpleNamespace(size=2, rank=rank, group=None)
    mesh = SimpleNamespace(axis=lambda name: axis, record=lambda *a: None, enabled=True, nccl=True)
    return mesh, calls


@pytest.mark.parametrize(
    "shape, dim, form",
    [
        ((8,), 0, "tensor"),
        ((6, 4), 0, "tensor"),
        ((1, 6, 3), 1, "tensor"),
        ((1, 1, 4, 5), 2, "tensor"),
        ((2, 6, 3), 1, "list"),
        ((3, 4), 1, "list"),
    ],
)
@pytest.mark.parametrize("rank", [0, 1])
def test_reduce_scatter_reads_end_to_end_chunks_in_place(monkeypatch, shape, dim, form, rank):
    mesh, calls = _two_ranks(monkeypatch, rank)
    t = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    got = comm.reduce_scatter(mesh, t, "tsp", dim)
    want = 2 * t.chunk(2, dim=dim)[rank]
    assert calls == [form]
    torch.testing.assert_close(got, want)

"""comm.reduce_scatter on NCCL: always the tensor form — read in place where the rank chunks lie end to end in
memory (every dimension before the split one of size 1), laid out rank-major in one copy elsewhere (a batch's
rows) — each rank getting the sum of its chunk. NCCL stands in here as a two-rank emulation in one process
(every rank holding the same tensor)."""

from types import SimpleNamespace

import pytest
import torch

from meshplan.executor import comm


def _two_ranks(monkeypatch, rank: int):
    calls = []

    def tensor_form(out, t, group=None):
        calls.append(("tensor", t.data_ptr()))
        out.copy_(2 * t.reshape(2, -1)[rank].view_as(out))  # rank's chunk of the flat tensor, from both ranks

    def list_form(out, chunks, group=None):
        calls.append(("list", None))
        out.copy_(2 * chunks[rank])

    monkeypatch.setattr(comm.dist, "reduce_scatter_tensor", tensor_form)
    monkeypatch.setattr(comm.dist, "reduce_scatter", list_form)
    axis = SimpleNamespace(size=2, rank=rank, group=None)
    mesh = SimpleNamespace(axis=lambda name: axis, record=lambda *a: None, enabled=True, nccl=True)
    return mesh, calls


@pytest.mark.parametrize(
    "shape, dim, in_place",
    [
        ((8,), 0, True),
        ((6, 4), 0, True),
        ((1, 6, 3), 1, True),
        ((1, 1, 4, 5), 2, True),
        ((2, 6, 3), 1, False),
        ((3, 4), 1, False),
        ((2, 3, 4, 5), 2, False),
        ((2, 3, 4, 5), -2, False),  # counted from the end, as dim 2
        ((1, 6), -1, True),
    ],
)
@pytest.mark.parametrize("rank", [0, 1])
def test_reduce_scatter_takes_the_tensor_form(monkeypatch, shape, dim, in_place, rank):
    mesh, calls = _two_ranks(monkeypatch, rank)
    t = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    got = comm.reduce_scatter(mesh, t, "tsp", dim)
    want = 2 * t.chunk(2, dim=dim)[rank]
    assert [form for form, _ in calls] == ["tensor"]
    assert (calls[0][1] == t.data_ptr()) == in_place  # read where it lies, or from one rank-major copy
    torch.testing.assert_close(got, want)


def test_reduce_scatter_refuses_unequal_chunks(monkeypatch):
    mesh, _ = _two_ranks(monkeypatch, 0)
    with pytest.raises(ValueError, match="does not split into 2 equal chunks"):
        comm.reduce_scatter(mesh, torch.zeros(2, 5), "tsp", 1)

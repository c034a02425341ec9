"""The executor's point-to-point exchange receives into a contiguous buffer whatever the layout of the
tensor it is shaped like: a transposed view (a kernel's gradient of a tail, say) once kept its strides,
and the bytes, sent in logical order, landed in the wrong places (NCCL only warns; gloo refuses)."""

import torch

from meshplan.executor.comm import build_mesh, exchange
from meshplan.executor.distributed import run_distributed
from meshplan.layout import parse_layout


def _pass_a_tail(rank, world):
    mesh = build_mesh(parse_layout("sp=2"))
    tail = torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank
    like = torch.empty(3, 2).t()  # (2, 3), strides (1, 2): a transposed view
    got = exchange(mesh, "sp", tail if rank == 0 else None, 1, like if rank == 1 else None, 0, tag=7)
    return None if got is None else (got.tolist(), got.is_contiguous())


def test_a_transposed_receive_buffer_gets_the_senders_order():
    _, (values, contiguous) = run_distributed(_pass_a_tail, 2, timeout_s=60)
    assert values == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and contiguous


def _line_up_on_members(rank, world):
    """A 2 × 2 layout on ranks 0-3 of 5; the fifth rank never calls a barrier. Rank 3 arrives late: the
    layout's other ranks leave Mesh.line_up only after it has entered."""
    import time

    mesh = build_mesh(parse_layout("tp=2,dp=2"), members=list(range(4)))
    if mesh is None:
        return None
    if rank == 3:
        time.sleep(1.0)
    entered = time.time()
    mesh.line_up()
    return entered, time.time()


def test_line_up_waits_for_every_rank_of_the_layout_and_no_other():
    out = run_distributed(_line_up_on_members, 5, timeout_s=60)
    assert out[4] is None
    late_entered = out[3][0]
    assert all(left >= late_entered for _, left in out[:4])

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

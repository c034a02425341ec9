"""The executor's grouped experts (meshplan.executor.experts): rows laid out by expert with their groups
padded for the grouped GEMM give the same outputs and gradients as one GEMM an expert."""

import pytest
import torch

from meshplan.executor.experts import ALIGN, _looped, experts_mlp, reference_grouped_mm


@pytest.mark.parametrize("counts", [[3, 0, 17, 8], [0, 0, 5, 0], [8, 16, 1, 9, 0, 2]])
def test_padded_groups_equal_one_gemm_an_expert(counts):
    torch.manual_seed(0)
    h, f, e = 16, 12, len(counts)
    x = torch.randn(sum(counts), h, dtype=torch.float64, requires_grad=True)
    w1 = torch.randn(e, 2 * f, h, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(e, h, f, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(sum(counts), h, dtype=torch.float64)
    grads = []
    for run in (lambda: experts_mlp(x, counts, w1, w2, mm=reference_grouped_mm), lambda: _looped(x, counts, w1, w2)):
        out = run()
        out.backward(grad)
        grads.append((out.detach(), x.grad.clone(), w1.grad.clone(), w2.grad.clone()))
        x.grad = w1.grad = w2.grad = None
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_groups_start_aligned():
    """What the grouped GEMM receives: every expert's rows start a multiple of ALIGN rows in."""
    seen = {}

    def spy(a, b, offs):
        seen["offs"] = offs.tolist()
        return reference_grouped_mm(a, b, offs)

    x, w1, w2 = torch.randn(21, 4), torch.randn(3, 6, 4), torch.randn(3, 4, 3)
    experts_mlp(x, [5, 0, 16], w1, w2, mm=spy)
    assert seen["offs"] == [8, 8, 24] and all(o % ALIGN == 0 for o in seen["offs"])


def test_cpu_rows_run_one_gemm_an_expert():
    """Without a GPU the grouped kernel is not asked for: the looped path, the same numbers."""
    x, w1, w2 = torch.randn(7, 4), torch.randn(2, 6, 4), torch.randn(2, 4, 3)
    torch.testing.assert_close(experts_mlp(x, [3, 4], w1, w2), _looped(x, [3, 4], w1, w2))

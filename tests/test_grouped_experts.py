"""The executor's routed experts (meshplan.executor.experts): copies laid out by expert in groups padded
for the grouped GEMM and gathered back give the same outputs and gradients as one GEMM an expert on
each copy — in float64, with empty experts, groups not a multiple of the alignment, and a token's copies
through several experts."""

import pytest
import torch

from meshplan.executor.experts import ALIGN, expert_mlp, groups_of, reference_grouped_mm, routed_experts


def _one_by_one(x, group_of, w1, w2, fold):
    """Each copy c (of row c // fold) through expert group_of[c] on its own."""
    return torch.stack([expert_mlp(x[c // fold][None], w1[e], w2[e])[0] for c, e in enumerate(group_of.tolist())])


@pytest.mark.parametrize(("tokens", "experts", "fold"), [(13, 4, 2), (9, 6, 3), (20, 3, 1), (5, 16, 2)])
def test_routed_copies_equal_one_gemm_an_expert(tokens, experts, fold):
    torch.manual_seed(tokens)
    h, f = 16, 12
    x = torch.randn(tokens, h, dtype=torch.float64, requires_grad=True)
    w1 = torch.randn(experts, 2 * f, h, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(experts, h, f, dtype=torch.float64, requires_grad=True)
    group_of = torch.randint(0, experts, (tokens * fold,))
    grad = torch.randn(tokens * fold, h, dtype=torch.float64)
    results = []
    for run in (
        lambda: routed_experts(x, group_of, experts, w1, w2, fold),
        lambda: _one_by_one(x, group_of, w1, w2, fold),
    ):
        out = run()
        out.backward(grad)
        results.append((out.detach(), x.grad.clone(), w1.grad.clone(), w2.grad.clone()))
        x.grad = w1.grad = w2.grad = None
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_groups_start_aligned_and_hold_each_row_once():
    """Expert 0 takes 5 rows, expert 1 none, expert 2 sixteen: padded ends 8, 8, 24; every row has one
    place, the rest is padding."""
    group_of = torch.tensor([2] * 10 + [0] * 5 + [2] * 6)
    g = groups_of(group_of, 3)
    assert g.offs.tolist() == [8, 8, 24] and all(o % ALIGN == 0 for o in g.offs.tolist())
    assert sorted(g.slot.tolist()) == list(range(5)) + list(range(8, 24))
    assert int((~g.pad).sum()) == 21 and g.src[g.slot].tolist() == list(range(21))


def test_the_reference_grouped_gemm_is_a_loop_over_groups():
    a, b = torch.randn(12, 3), torch.randn(2, 3, 4)
    out = reference_grouped_mm(a, b, torch.tensor([4, 8], dtype=torch.int32))
    torch.testing.assert_close(out[:4], a[:4] @ b[0])
    torch.testing.assert_close(out[4:8], a[4:8] @ b[1])
    assert not out[8:].any()


def test_a_rank_that_no_copy_reached_runs_no_rows_and_keeps_its_graph():
    """Expert parallelism can leave a rank's experts no copies (one decoded token a sequence, its k copies
    on other ranks): no rows out, and the backward still runs (its all-to-alls pair with the other
    ranks'), giving the weights zero gradients."""
    h, f, experts = 16, 12, 4
    x = torch.zeros(0, h, dtype=torch.float64, requires_grad=True)
    w1 = torch.randn(experts, 2 * f, h, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(experts, h, f, dtype=torch.float64, requires_grad=True)
    out = routed_experts(x, torch.zeros(0, dtype=torch.long), experts, w1, w2)
    assert out.shape == (0, h) and out.requires_grad
    out.sum().backward()
    assert x.grad.shape == (0, h) and not w1.grad.any() and not w2.grad.any()

"""One rank order (meshplan/rank_order.py) for the cost model's link placement and the executor's process
groups (meshplan.executor.comm.build_mesh): the groups the executor creates, against ranks placed by
hand from the formula rank = t + T·(σ + Σ·(d + DP·p))."""

import itertools

import pytest

from meshplan import rank_order
from meshplan.executor.comm import rank_groups
from meshplan.layout import parse_layout

LAYOUTS = ["single", "tp=2", "tsp=4", "tpssm=2,sp=2", "dp=2,sp=2", "dp=2,pp=2,tp=2", "pp=3,sp=2,dp=2", "tp=2,sp=3,dp=2"]


def _by_hand(layout) -> dict:
    """Each rank's coordinates (t, σ, d, p) from the formula, innermost first."""
    t_, s_, d_, p_ = layout.weight_shard_degree, layout.sp, layout.dp, layout.pp
    return {
        t + t_ * (s + s_ * (d + d_ * p)): {"tensor": t, "sp": s, "dp": d, "pp": p}
        for t, s, d, p in itertools.product(range(t_), range(s_), range(d_), range(p_))
    }


@pytest.mark.parametrize("text", LAYOUTS)
@pytest.mark.parametrize("varying", [("tensor",), ("sp",), ("dp",), ("pp",), ("sp", "dp")])
def test_executor_groups_are_the_ranks_that_differ_only_along_the_axes(text, varying):
    layout = parse_layout(text)
    coords = _by_hand(layout)
    want = {}
    for rank, c in coords.items():
        key = tuple(v for name, v in c.items() if name not in varying)
        want.setdefault(key, []).append(rank)
    got = rank_groups(layout, varying)
    assert sorted(map(tuple, got)) == sorted(tuple(sorted(g)) for g in want.values())
    # Each group in axis order (its ranks ascending), the same (size, stride) the cost model places.
    size, stride = rank_order.group(layout, varying)
    for ranks in got:
        assert len(ranks) == size and ranks == [ranks[0] + i * stride for i in range(size)]

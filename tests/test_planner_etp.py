"""recommend's search of the experts' tensor split (--etp): as TP or whole by default, any split of a
stage's ranks with --etp all — the folds past a tensor group that costmodel/axes/ep.py prices as gathers."""

import pytest

from meshplan.costmodel.stacks import get_stack
from meshplan.errors import MeshplanError
from meshplan.models import PRESETS
from meshplan.planner.plan import enumerate_layouts, plan
from meshplan.topologies import load_cluster


def _etps(layouts):
    return {(lay.tensor_degree, lay.expert_tensor_degree) for lay in layouts if lay.ep > 1 or lay.etp}


def test_default_search_splits_experts_as_tp_or_not_at_all():
    layouts = enumerate_layouts(PRESETS["qwen3-30b-a3b"], 8, 4096, 1, "train", stack=get_stack("megatron"))
    assert all(etp in (tensor, 1) for tensor, etp in _etps(layouts))


def test_all_adds_splits_inside_and_past_a_tensor_group():
    model = PRESETS["qwen3-30b-a3b"]
    narrow = enumerate_layouts(model, 8, 4096, 1, "train", stack=get_stack("megatron"))
    wide = enumerate_layouts(model, 8, 4096, 1, "train", stack=get_stack("megatron"), etp="all")
    assert set(narrow) < set(wide)
    pairs = _etps(wide)
    assert (4, 2) in pairs  # inside a tensor group of 4
    assert (1, 2) in pairs  # past it: two data-parallel ranks split each expert
    for layout in set(wide) - set(narrow):
        assert layout.expert_tensor_degree not in (layout.tensor_degree, 1)


def test_the_planner_ranks_them_and_refuses_an_unknown_search():
    model, cluster = PRESETS["qwen3-30b-a3b"], load_cluster("h100-sxm-8")
    from meshplan.costmodel.options import CostOptions

    opts = CostOptions(stack="megatron", global_batch=64)
    ranked = plan(model, cluster, 4096, 1, opts, etp="all", keep=0).ranked
    assert any(c.layout.expert_tensor_degree not in (c.layout.tensor_degree, 1) for c in ranked)
    with pytest.raises(MeshplanError, match="--etp"):
        plan(model, cluster, 4096, 1, opts, etp="some")

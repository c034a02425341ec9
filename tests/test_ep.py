"""Expert parallelism's first piece through the parallelism core (issue #30's check on it): the ep
axis splits the routed experts alone, and memory holds each rank's share by hand."""

import pytest

from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.step import estimate_step
from meshplan.errors import MeshplanError
from meshplan.layout import Layout, parse_layout, validate_layout
from meshplan.models import PRESETS, AttentionSpec, ModelSpec, MoeSpec
from meshplan.topologies import load_cluster

# Mixtral-8x7B's shapes (mistralai/Mixtral-8x7B-v0.1 config.json).
MIXTRAL = ModelSpec(
    name="mixtral-8x7b",
    family="moe",
    d_model=4096,
    layers=32,
    vocab=32000,
    attention=AttentionSpec(4096, 32, 8, 128, 4096),
    moe=MoeSpec(4096, 8, 2, 14336),
)


def test_ep_splits_the_routed_experts_alone():
    """tp=2, ep=4 on dp=4: attention, router, norms and the vocabulary as under tp=2; each rank holds
    8/4 = 2 experts, each split 2 ways by the tensor axis (ETP = TP): by hand, in bf16."""
    opts = CostOptions(optimizer="none")
    expert = 3 * 4096 * 14336
    experts = 32 * 8 * expert
    norms = MIXTRAL.norm_params()
    rest = MIXTRAL.param_count() - experts
    want = (rest - norms) / 2 + norms + experts / (2 * 4)
    got = memory_per_gpu(MIXTRAL, Layout(dp=4, tp=2, ep=4), 4096, 1, opts).per_gpu_bytes["parameters"]
    assert got == round(2 * want)
    # ep = 1: every expert on every rank of the data axis.
    plain = memory_per_gpu(MIXTRAL, Layout(dp=4, tp=2), 4096, 1, opts).per_gpu_bytes["parameters"]
    assert plain == round(2 * (MIXTRAL.param_count() - norms) / 2 + 2 * norms)
    # The activations do not depend on where the experts live.
    acts = [
        memory_per_gpu(MIXTRAL, Layout(dp=4, tp=2, ep=e), 4096, 1, opts).per_gpu_bytes["activations"] for e in (1, 4)
    ]
    assert acts[0] == acts[1]


def test_ep_is_checked_in_one_line():
    assert str(parse_layout("dp=8,tp=2,ep=8")) == "dp=8,tp=2,ep=8"
    assert Layout(dp=8, ep=8).world_size == 8  # folded: no ranks of its own
    with pytest.raises(MeshplanError, match="divisors of 2"):
        validate_layout(Layout(dp=2, ep=4), MIXTRAL)
    with pytest.raises(MeshplanError, match="experts \\(8\\)"):
        validate_layout(Layout(dp=16, ep=16), MIXTRAL)
    dense = PRESETS["dense-7b"]
    with pytest.raises(MeshplanError, match="has none"):
        validate_layout(Layout(dp=2, ep=2), dense)


def test_step_time_refuses_ep_until_its_all_to_alls_are_priced():
    with pytest.raises(MeshplanError, match="not priced yet"):
        estimate_step(MIXTRAL, Layout(dp=4, tp=2, ep=4), 4096, 1, CostOptions(), load_cluster("h100-sxm-8"))

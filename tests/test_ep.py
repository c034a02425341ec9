"""Expert parallelism folded onto the data and sequence ranks: the ep axis splits the routed experts
alone (its first piece went in through the parallelism core in 4 files, issue #30's check), memory
holds each rank's share, the all-to-alls and the experts' gradient sums are priced, by hand."""

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


def test_ep_dispatches_each_tokens_routed_copies_by_hand():
    """dp=4, tp=2 with Megatron-SP, ep=4, 4,096 tokens a micro-batch: a tensor rank dispatches its 2,048
    tokens' 2 routed copies of 4,096 bf16 elements — 32 MiB — in each of the four all-to-alls of an
    MoE layer (dispatch and combine forward, their gradients backward), over the 4 ranks of its expert
    group. With dp·sp/ep = 1 expert-data-parallel rank the experts' gradients need no sum; with ep = 2
    they are summed over the other expert-data-parallel rank, the rest of the model's over dp."""
    from meshplan.costmodel.schedule import step_schedule

    opts = CostOptions(tp_sequence_parallel=True, global_batch=8)
    sched = step_schedule(MIXTRAL, Layout(dp=4, tp=2, ep=4), 4096, 1, opts)
    a2a = [c for c in sched.per_block["experts"] if c.axis == "ep"]
    assert [c.kind for c in a2a] == ["all_to_all"] * 4 and [c.phase for c in a2a] == ["fwd", "fwd", "bwd", "bwd"]
    assert all(c.message_bytes == 2048 * 2 * 4096 * 2 and c.group_size == 4 for c in a2a)
    assert not [c for c in sched.all_comms() if c[0].axis == "edp"]  # edp = 1: nothing to sum
    # ep = 2 on dp = 4: the experts' gradients summed over the other 2 expert-data-parallel ranks.
    two = step_schedule(MIXTRAL, Layout(dp=4, tp=2, ep=2), 4096, 1, opts)
    edp = [c for c, _ in two.all_comms() if c.axis == "edp"]
    experts_local = 32 * 8 * 3 * 4096 * 14336 / (2 * 2)
    assert sum(c.message_bytes for c in edp) == experts_local * opts.nbytes("grad_dtype")
    assert all(c.group_size == 2 for c in edp)


def test_zero_shards_the_experts_over_the_expert_data_parallel_ranks():
    """ZeRO-1 with dp=4, ep=2: the experts' optimizer states are split over edp = 2, the rest over dp = 4."""
    opts = CostOptions(optimizer="adam", tp_sequence_parallel=True)
    mem = memory_per_gpu(MIXTRAL, Layout(dp=4, tp=2, ep=2, zero=1), 4096, 1, opts).per_gpu_bytes
    experts = 32 * 8 * 3 * 4096 * 14336 / (2 * 2)
    norms = MIXTRAL.norm_params()
    rest = (MIXTRAL.param_count() - 32 * 8 * 3 * 4096 * 14336 - norms) / 2 + norms
    assert mem["optimizer_state"] == round(12 * (rest / 4 + experts / 2))


def test_the_planner_folds_experts_onto_the_data_ranks():
    """Mixtral-8x7B on 16 H100s at 4K: every mesh with each ep its experts and dp×sp allow is
    priced, and one with ep > 1 wins — holding fewer experts a rank frees memory for a faster plan."""
    from meshplan.planner import plan
    from meshplan.planner.plan import KNOBS

    result = plan(
        MIXTRAL,
        load_cluster("h100-sxm-8", 2),
        4096,
        1,
        CostOptions(stack="megatron", global_batch=64),
        search=frozenset(KNOBS),
    )
    assert any(c.layout.ep > 1 for c in result.ranked) and result.ranked[0].layout.ep > 1


def test_the_optimizer_steps_the_experts_states_each_rank_keeps():
    """ZeRO-1, dp=4, ep=2: the optimizer step reads and writes the states of the rest of the model over
    4 ranks and of the experts over edp = 2 — the same shares memory holds."""
    from meshplan.costmodel.axes import plan_context
    from meshplan.costmodel.compute import ADAM_STEP_BYTES_PER_PARAM
    from meshplan.costmodel.device import Device
    from meshplan.costmodel.memory import local_params, zero_sharded

    cluster = load_cluster("h100-sxm-8")
    opts = CostOptions(tp_sequence_parallel=True, global_batch=8)
    layout = Layout(dp=4, tp=2, ep=2, zero=1)
    ctx = plan_context(MIXTRAL, layout, 4096, 1, opts)
    held = local_params(MIXTRAL, ctx.sharding, by_kind=ctx.by_kind)
    experts = 32 * 8 * 3 * 4096 * 14336 / (2 * 2)
    kept = zero_sharded(MIXTRAL, layout, held, ctx.by_kind, 1.0, from_stage=1)
    assert kept == pytest.approx((held - experts) / 4 + experts / 2)
    est = estimate_step(MIXTRAL, layout, 4096, 1, opts, cluster)
    dev = Device.of(cluster, opts.stack_spec)
    assert est.optimizer_s == pytest.approx(kept * ADAM_STEP_BYTES_PER_PARAM / dev.hbm_bytes_per_s)

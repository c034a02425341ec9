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
    """tp=2, ep=4 on dp=4: attention and the vocabulary as under tp=2, the norms and the routers whole
    on every tensor rank (Megatron-Core's TopKRouter.weight is not split); each rank holds 8/4 = 2
    experts, each split 2 ways by the tensor axis (ETP = TP): by hand, in bf16."""
    opts = CostOptions(optimizer="none")
    expert = 3 * 4096 * 14336
    experts = 32 * 8 * expert
    norms = MIXTRAL.norm_params()
    routers = 32 * 8 * 4096
    rest = MIXTRAL.param_count() - experts
    want = (rest - norms - routers) / 2 + norms + routers + experts / (2 * 4)
    got = memory_per_gpu(MIXTRAL, Layout(dp=4, tp=2, ep=4), 4096, 1, opts).per_gpu_bytes["parameters"]
    assert got == round(2 * want)
    # ep = 1: every expert on every rank of the data axis.
    plain = memory_per_gpu(MIXTRAL, Layout(dp=4, tp=2), 4096, 1, opts).per_gpu_bytes["parameters"]
    assert plain == round(2 * (MIXTRAL.param_count() - norms - routers) / 2 + 2 * (norms + routers))
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
    whole = MIXTRAL.norm_params() + 32 * 8 * 4096  # the norms and the routers, on every tensor rank
    rest = (MIXTRAL.param_count() - 32 * 8 * 3 * 4096 * 14336 - whole) / 2 + whole
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
    # The executor's one-kernel step: 28 B a kept parameter (Stack.optimizer_step_bytes_per_param) at the
    # copy rate it was measured at, 0.86 of HBM (Stack.optimizer_hbm_fraction)
    assert est.optimizer_s == pytest.approx(kept * 28 / (dev.hbm_bytes_per_s * 0.86))


# -- MoE parallel folding: etp, the dispatchers, uneven routing (issue #31) ------------------------------

MEGATRON_SP = CostOptions(stack="megatron", tp_sequence_parallel=True, global_batch=16)


def _expert_comms(layout: str, opts: CostOptions = MEGATRON_SP, seq: int = 4096):
    from meshplan.costmodel.schedule import step_schedule

    return step_schedule(MIXTRAL, parse_layout(layout), seq, 1, opts).per_block["experts"]


def test_etp_folds_the_experts_onto_the_tensor_ranks_too():
    """tp=2, dp=4 (8 ranks a stage): etp=1, ep=8 gives each rank one whole expert (8 / 8), the experts'
    gradients summed over edp = 8 / (1·8) = 1 rank; the default etp (= tp) keeps ep within dp."""
    layout = parse_layout("dp=4,tp=2,ep=8,etp=1")
    assert (layout.expert_tensor_degree, layout.expert_data_degree) == (1, 1)
    assert str(layout) == "dp=4,tp=2,ep=8,etp=1"
    validate_layout(layout, MIXTRAL, 8)
    with pytest.raises(MeshplanError, match="etp×ep = 2×8 must divide a stage's tp×sp×dp = 8"):
        validate_layout(parse_layout("dp=4,tp=2,ep=8"), MIXTRAL)
    with pytest.raises(MeshplanError, match="add ep"):
        validate_layout(parse_layout("tsp=2"), MIXTRAL)
    with pytest.raises(MeshplanError, match="leave etp out"):
        validate_layout(parse_layout("tsp=2,ep=2,etp=2"), MIXTRAL)
    validate_layout(parse_layout("tsp=2,ep=2"), MIXTRAL)  # TSP's attention, the experts split by ep
    opts = CostOptions(optimizer="none")
    params = memory_per_gpu(MIXTRAL, layout, 4096, 1, opts).per_gpu_bytes["parameters"]
    experts = 32 * 8 * 3 * 4096 * 14336
    whole = MIXTRAL.norm_params() + 32 * 8 * 4096  # the norms and the routers, on every tensor rank
    assert params == round(2 * ((MIXTRAL.param_count() - experts - whole) / 2 + whole + experts / 8))


def test_etp_moves_the_same_flops_and_saved_copies_as_etp_equal_tp():
    """Even routing: the experts of tp=2 with etp=1 run the routed copies of a rank's own 2,048 tokens
    whole; with etp=2 they run the tensor group's 4,096 tokens' copies at half the width — the same
    FLOPs and the same saved intermediates a rank. The permuted copies (full width) are etp times
    as many (Megatron-MoE-ModelZoo's permute_out, s/TP · ETP · k · h)."""
    from meshplan.costmodel.axes import plan_context
    from meshplan.costmodel.blocks import block_saved
    from meshplan.costmodel.memory import _block_bytes

    by = {}
    for text in ("dp=4,tp=2,ep=2", "dp=4,tp=2,ep=2,etp=1"):
        ctx = plan_context(MIXTRAL, parse_layout(text), 4096, 1, MEGATRON_SP)
        own = ctx.sharding_of("experts")
        tokens = 4096 / own.token_div
        assert tokens * 2 * 3 * 14336 / own.head_div == 2048 * 2 * 3 * 14336  # copies × FFN width
        items = {i.name: i for i in block_saved("experts", MIXTRAL, MEGATRON_SP)}
        by[text] = {
            "all": _block_bytes(MIXTRAL, MEGATRON_SP, "experts", 4096, 4096, ctx.sharding, ctx.by_kind),
            "inputs": 4096 / own.token_div * items["expert_inputs"].bytes_per_token,
            "gate": 4096 / own.token_div / own.head_div * items["expert_gate"].bytes_per_token,
        }
    folded, split = by["dp=4,tp=2,ep=2,etp=1"], by["dp=4,tp=2,ep=2"]
    assert split["gate"] == folded["gate"] and split["inputs"] == 2 * folded["inputs"]
    assert split["all"] - folded["all"] == pytest.approx(split["inputs"] - folded["inputs"] + 2048 * 2 * 4)


def test_the_alltoall_dispatcher_by_hand():
    """tp=2 (Megatron-SP), ep=4, etp=2 on dp=4: a rank routes its 2,048 tokens' 2 copies, 32 MiB, in the
    dispatch and combine all-to-alls over ep; the etp group all-gathers what both its ranks received
    (64 MiB) and reduce-scatters the outputs; backward mirrors all four, full recompute adds the
    forward's again."""
    copies = 2048 * 2 * 4096 * 2
    comms = _expert_comms("dp=4,tp=2,ep=4")
    assert [(c.kind, c.axis, c.phase) for c in comms] == [
        ("all_to_all", "ep", "fwd"),
        ("all_gather", "etp", "fwd"),
        ("reduce_scatter", "etp", "fwd"),
        ("all_to_all", "ep", "fwd"),
        ("all_to_all", "ep", "bwd"),
        ("all_gather", "etp", "bwd"),
        ("reduce_scatter", "etp", "bwd"),
        ("all_to_all", "ep", "bwd"),
    ]
    assert [c.message_bytes for c in comms] == [copies, 2 * copies, 2 * copies, copies] * 2
    full = _expert_comms("dp=4,tp=2,ep=4", CostOptions(**{**MEGATRON_SP.as_dict(), "recompute": "full"}))
    assert sum(c.kind == "all_to_all" for c in full) == 6


def test_the_allgather_and_deepep_dispatchers_by_hand():
    """allgather: the 2,048 tokens (not their copies) gathered over etp × ep = 8 ranks, 8 × 16 MiB, and
    the outputs reduce-scattered back. DeepEP: one all-to-all over etp × ep of the copies, a token to
    each etp rank of its experts (fanout top_k × etp)."""
    from dataclasses import replace

    tokens = 2048 * 4096 * 2
    ag = _expert_comms("dp=4,tp=2,ep=4", replace(MEGATRON_SP, moe_dispatcher="allgather"))
    assert [(c.kind, c.axis, c.group_size, c.message_bytes) for c in ag[:2]] == [
        ("all_gather", "etp+ep", 8, 8 * tokens),
        ("reduce_scatter", "etp+ep", 8, 8 * tokens),
    ]
    deep = _expert_comms("dp=4,tp=2,ep=4", replace(MEGATRON_SP, moe_dispatcher="deepep"))
    assert [(c.axis, c.group_size, c.fanout, c.message_bytes) for c in deep[:2]] == [("etp+ep", 8, 4, 4 * tokens)] * 2


def test_an_all_to_all_across_nodes_sends_over_nvlink_and_the_nic_at_once():
    """16 ranks on 2 nodes of 8, 1 GB a rank: 7/16 of it to the node's peers at 400 GB/s, 8/16 to the
    other node at 50 GB/s — the NIC's 10 ms sets the time (latencies aside). DeepEP with top-8 of the
    routed copies (125 MB of tokens): a token reaches 2·(1 − 0.5⁸) nodes, half of them remote, once."""
    from meshplan.costmodel.collectives import GroupPlacement, all_to_all_s

    group = GroupPlacement(16, 8, 2)
    assert all_to_all_s(1e9, group, 400e9, 0.0, 50e9, 0.0) == pytest.approx(0.5e9 / 50e9)
    deep = all_to_all_s(1e9, group, 400e9, 0.0, 50e9, 0.0, fanout=8)
    assert deep == pytest.approx(1e9 / 8 * 2 * (1 - 0.5**8) * 0.5 / 50e9)
    # Node-limited to one node: nothing crosses but what the token's one node is not this one's.
    assert all_to_all_s(1e9, group, 400e9, 0.0, 50e9, 0.0, fanout=8, node_limit=1) == pytest.approx(
        max(1e9 / 8 * 8 * (1 - (7 / 8) ** 8) * 7 / 8 / 400e9, 1e9 / 8 * 0.5 / 50e9)
    )


def test_uneven_routing_slows_the_experts_and_their_all_to_all_not_the_model_flops():
    """Dropless at 1.5× the even share: the busiest rank's expert GEMMs and all-to-alls take longer,
    its saved copies grow by 1.5, the model FLOPs (Megatron's convention) do not; padded to capacity
    1.0 it is the even share again."""
    from dataclasses import replace

    from meshplan.costmodel.schedule import step_schedule

    cluster = load_cluster("h100-sxm-8", 2)
    layout = parse_layout("dp=8,tp=2,ep=8,etp=1")
    even = estimate_step(MIXTRAL, layout, 4096, 1, MEGATRON_SP, cluster)
    skew = replace(MEGATRON_SP, moe_imbalance=1.5)
    busy = estimate_step(MIXTRAL, layout, 4096, 1, skew, cluster)
    assert busy.breakdown["experts_compute_s"] == pytest.approx(1.5 * even.breakdown["experts_compute_s"], rel=0.05)
    assert busy.breakdown["experts_compute_s"] > 1.4 * even.breakdown["experts_compute_s"]
    assert busy.mfu * busy.step_time_s == pytest.approx(even.mfu * even.step_time_s)
    a2a = [c.message_bytes for c in step_schedule(MIXTRAL, layout, 4096, 1, skew).per_block["experts"]]
    assert a2a[0] == 1.5 * 2048 * 2 * 4096 * 2
    acts = [memory_per_gpu(MIXTRAL, layout, 4096, 1, o).per_gpu_bytes["activations"] for o in (MEGATRON_SP, skew)]
    assert acts[1] > acts[0]
    padded = replace(skew, capacity_factor=1.0, moe_pad_to_capacity=True)
    assert estimate_step(MIXTRAL, layout, 4096, 1, padded, cluster).step_time_s == pytest.approx(even.step_time_s)


def test_the_grouped_gemm_rate_falls_with_the_rows_an_expert_runs():
    """The measured curve (benchmarks/results/grouped-gemm-grid-h100.json): at 128 rows an expert a third of
    a large dense GEMM's rate, from 2,048 about 0.84; rising to there, flat above (no grid cell there);
    interpolated in log rows, in proportion below the table; the experts block prices it."""
    from meshplan.costmodel.device import GROUPED_GEMM_FACTOR, grouped_gemm_factor

    assert grouped_gemm_factor(128) == pytest.approx(0.346)
    assert grouped_gemm_factor(32) == pytest.approx(0.346 / 4)
    assert grouped_gemm_factor(362) == pytest.approx(0.596 + 0.5 * (0.747 - 0.596), rel=1e-3)  # √(256·512)
    rising = [2**k for k in range(4, 12)]  # up to 2,048 rows; flat from there
    assert all(grouped_gemm_factor(a) < grouped_gemm_factor(b) for a, b in zip(rising, rising[1:]))
    assert all(grouped_gemm_factor(2**k) == pytest.approx(0.842) for k in range(12, 16))
    assert max(f for _, f in GROUPED_GEMM_FACTOR) < 1
    # Qwen3-30B-A3B-like fine-grained experts: 128 of them, top-8; fewer tokens a rank = fewer rows an expert.
    fine = ModelSpec(
        name="fine", family="moe", d_model=2048, layers=4, vocab=32000,
        attention=AttentionSpec(2048, 32, 4, 128, 2048), moe=MoeSpec(2048, 128, 8, 768),
    )  # fmt: skip
    cluster = load_cluster("h100-sxm-8")
    opts = CostOptions(stack="megatron")
    short, long = (
        estimate_step(fine, Layout(dp=8, ep=8), seq, 1, opts, cluster).breakdown["experts_compute_s"] / seq
        for seq in (512, 8192)
    )
    # per token: 32 rows an expert against 512 (the routing's per-token bytes are the same at both)
    assert short > 1.2 * long


def test_moe_rules_are_one_line_errors():
    """Megatron-Core: MoE under TP needs Megatron-SP; the 1F1B all-to-all overlap needs ep > 1, a
    dispatcher that all-to-alls, no full recompute and virtual stages under a pipeline; DeepEP pads
    no capacity."""
    from dataclasses import replace

    from meshplan.predict import predict

    cluster = load_cluster("h100-sxm-8", 2)
    with pytest.raises(MeshplanError, match="needs Megatron-SP") as err:
        predict(MIXTRAL, cluster, parse_layout("dp=8,tp=2,ep=8,etp=1"), 4096, 1, CostOptions(stack="megatron"))
    assert "\n" not in str(err.value)
    overlap = replace(MEGATRON_SP, moe_a2a_overlap=True)
    with pytest.raises(MeshplanError, match="virtual stages"):
        predict(MIXTRAL, cluster, parse_layout("dp=4,pp=2,tp=2,ep=4"), 4096, 1, overlap)
    with pytest.raises(MeshplanError, match="ep > 1"):
        predict(MIXTRAL, cluster, parse_layout("dp=8,tp=2"), 4096, 1, overlap)
    with pytest.raises(MeshplanError, match="does not overlap"):
        predict(MIXTRAL, cluster, parse_layout("dp=8,tp=2,ep=8,etp=1"), 4096, 1, replace(overlap, stack="meshplan"))
    with pytest.raises(MeshplanError, match="DeepEP pads no capacity"):
        CostOptions(moe_dispatcher="deepep", capacity_factor=1.0, moe_pad_to_capacity=True)
    with pytest.raises(MeshplanError, match="--moe-dispatcher: unknown"):
        CostOptions(moe_dispatcher="a2a")


def test_the_a2a_overlap_hides_the_all_to_all():
    """Megatron-Core's 1F1B all-to-all overlap: with 16 micro-batches the experts' all-to-alls run beside
    another micro-batch's compute, so less of the step is exposed communication and nothing else changes;
    with one micro-batch there is no partner, and in prefill no backward to pair with: nothing hides."""
    from dataclasses import replace

    cluster = load_cluster("h100-sxm-8", 4)
    layout = parse_layout("dp=16,tp=2,ep=8")  # the expert group over 16 ranks: two nodes
    validate_layout(layout, MIXTRAL, 32)
    many = replace(MEGATRON_SP, global_batch=256)
    plain = estimate_step(MIXTRAL, layout, 4096, 1, many, cluster)
    hidden = estimate_step(MIXTRAL, layout, 4096, 1, replace(many, moe_a2a_overlap=True), cluster)
    assert hidden.exposed_comm_s < plain.exposed_comm_s and hidden.compute_s == plain.compute_s
    one = [estimate_step(MIXTRAL, layout, 4096, 1, replace(MEGATRON_SP, moe_a2a_overlap=o), cluster) for o in (0, 1)]
    assert one[0].step_time_s == one[1].step_time_s
    prefill = replace(MEGATRON_SP, mode="prefill", global_batch=0)
    runs = [estimate_step(MIXTRAL, layout, 4096, 1, replace(prefill, moe_a2a_overlap=o), cluster) for o in (0, 1)]
    assert runs[0].step_time_s == runs[1].step_time_s


def test_the_overlap_pairs_all_but_the_schedules_lone_units():
    """Without a pipeline all but one of m micro-batches have a partner; 1F1B leaves the first rank's
    p − 1 warm-up units alone, the interleaved schedule (p − 1)·2 + (v − 1)·p of m·v."""
    from meshplan.costmodel.step import paired_share

    assert paired_share(1, 1, 1) == 0 and paired_share(16, 1, 1) == 15 / 16
    assert paired_share(32, 8, 1) == 25 / 32
    assert paired_share(128, 8, 2) == (256 - 22) / 256


def test_etp_one_under_tp_keeps_every_expert_whole():
    """tp=8 with etp=1 and no ep: attention split 8 ways, every rank holds all 8 experts whole and runs
    its own sequence shard's copies through them — 8 times tp=8's expert weights, no expert collectives."""
    opts = CostOptions(optimizer="none", tp_sequence_parallel=True)
    split = memory_per_gpu(MIXTRAL, parse_layout("tp=8"), 4096, 1, opts).per_gpu_bytes["parameters"]
    whole = memory_per_gpu(MIXTRAL, parse_layout("tp=8,etp=1"), 4096, 1, opts).per_gpu_bytes["parameters"]
    experts = 32 * 8 * 3 * 4096 * 14336 * 2
    assert whole - split == pytest.approx(experts - experts / 8)
    assert not _expert_comms("tp=8,etp=1", opts)


def test_experts_without_megatron_sp_run_the_tokens_once():
    """Prefill under tp=8 with no Megatron-SP: every tensor rank holds all the tokens, so its experts run
    them over 1/8 of the FFN and sum the partial outputs — the expert compute matches Megatron-SP's, not
    eight times it."""
    cluster = load_cluster("h100-sxm-8")
    times = [
        estimate_step(
            MIXTRAL, parse_layout("tp=8"), 4096, 1, CostOptions(mode="prefill", tp_sequence_parallel=sp), cluster
        ).breakdown["experts_compute_s"]
        for sp in (True, False)
    ]
    assert times[1] == pytest.approx(times[0], rel=0.05)
    comms = _expert_comms("tp=8", CostOptions(mode="prefill"))
    assert [(c.kind, c.axis) for c in comms] == [("all_reduce", "etp")]


def test_the_planner_prunes_only_meshes_that_cannot_reach_its_top():
    """Mixtral-8x7B on 32 H100s: ranking with the compute floor (keep the 5 best) names the same 5 meshes,
    in the same order and at the same times, as pricing every mesh; what it skips is counted."""
    from meshplan.planner import plan
    from meshplan.planner.plan import KNOBS

    cluster = load_cluster("h100-sxm-8", 4)
    opts = CostOptions(stack="megatron", global_batch=256)
    full = plan(MIXTRAL, cluster, 4096, 1, opts, search=frozenset(KNOBS), keep=0)
    fast = plan(MIXTRAL, cluster, 4096, 1, opts, search=frozenset(KNOBS), keep=5)
    assert fast.pruned > 0 and full.pruned == 0
    assert [(str(c.layout), c.estimate.step_time_s) for c in fast.ranked[:5]] == [
        (str(c.layout), c.estimate.step_time_s) for c in full.ranked[:5]
    ]
    assert len(fast.ranked) + len(fast.dropped) + fast.pruned == len(full.ranked) + len(full.dropped)
    assert f"{fast.pruned} more were not priced in full" in fast.reason


def test_the_reason_names_the_experts_all_to_all_when_it_decides():
    """Two meshes of 32 H100s alike but for where the experts live: ep = 16 over two nodes (etp = tp = 2
    spaces the expert group 2 ranks apart) against ep = 4 inside a node; the first's extra exposed
    communication is the experts' all-to-all, and the reason text says so."""
    from dataclasses import replace

    from meshplan.planner.plan import _exposed_owner

    cluster = load_cluster("h100-sxm-8", 4)
    opts = replace(MEGATRON_SP, global_batch=512)  # 32 micro-batches: the gradient sync's share is small
    near = estimate_step(MIXTRAL, parse_layout("dp=16,tp=2,ep=4"), 4096, 1, opts, cluster)
    far = estimate_step(MIXTRAL, parse_layout("dp=16,tp=2,ep=8"), 4096, 1, opts, cluster)
    assert far.exposed_comm_s > near.exposed_comm_s
    assert _exposed_owner(near, far, 1.0) == ", most of it the experts' token all-to-all (dispatch and combine)"
    assert _exposed_owner(far, near, 1.0) == ""  # nothing extra to name
    from meshplan.predict import exposed_by

    owners = exposed_by(far)  # what predict prints beside the exposed time, largest first
    assert next(iter(owners)) == "experts" and sum(owners.values()) == pytest.approx(far.exposed_comm_s)


def test_tsp_streams_attention_and_splits_the_experts_by_ep():
    """tsp=4 with ep=4: attention's weight shards are broadcast as TSP does, the routed experts are not
    streamed — each rank holds 2 of the 8, routes its own quarter of the tokens over the ep all-to-all —
    and the transient weight shards are attention's, not a whole MoE layer's."""
    from meshplan.costmodel.schedule import step_schedule

    layout = parse_layout("tsp=4,ep=4")
    sched = step_schedule(MIXTRAL, layout, 4096, 1, MEGATRON_SP)
    assert not [c for c in sched.per_block["experts"] if c.axis == "tsp"]
    a2a = [c for c in sched.per_block["experts"] if c.kind == "all_to_all"]
    assert a2a and all(c.message_bytes == 1024 * 2 * 4096 * 2 for c in a2a)
    assert [c for c in sched.per_block["attention"] if c.axis == "tsp"]
    mem = memory_per_gpu(MIXTRAL, layout, 4096, 1, CostOptions(optimizer="none")).per_gpu_bytes
    expert_layer = 8 * 3 * 4096 * 14336 * 2
    assert mem["transient_weight_shards"] < expert_layer / 4


def test_the_planner_ranks_the_same_in_parallel(monkeypatch):
    """Meshes dealt to two forked workers, each bounding its own share: the same top, at the same times."""
    import importlib

    from meshplan.planner import plan
    from meshplan.planner.plan import KNOBS

    monkeypatch.setattr(importlib.import_module("meshplan.planner.plan"), "PARALLEL_FROM", 0)  # a few hundred here
    cluster = load_cluster("h100-sxm-8", 4)
    opts = CostOptions(stack="megatron", global_batch=256)
    two = plan(MIXTRAL, cluster, 4096, 1, opts, search=frozenset(KNOBS), keep=5, workers=2)
    one = plan(MIXTRAL, cluster, 4096, 1, opts, search=frozenset(KNOBS), keep=5, workers=1)
    assert [(str(c.layout), c.estimate.step_time_s) for c in two.ranked[:5]] == [
        (str(c.layout), c.estimate.step_time_s) for c in one.ranked[:5]
    ]


def test_knob_search_skips_what_the_a2a_overlap_refuses():
    """With the 1F1B all-to-all overlap asked for, the recompute search skips full recompute and the
    virtual-stage search keeps the pipelines it can interleave, rather than failing or dropping them."""
    from dataclasses import replace

    from meshplan.planner import plan

    cluster = load_cluster("h100-sxm-8", 2)
    opts = replace(MEGATRON_SP, global_batch=256, moe_a2a_overlap=True)
    by_recompute = plan(MIXTRAL, cluster, 4096, 1, opts, search=frozenset({"recompute"}))
    assert by_recompute.ranked and all(c.knobs["recompute"] != "full" for c in by_recompute.ranked)
    by_stages = plan(MIXTRAL, cluster, 4096, 1, opts, search=frozenset({"virtual_stages"}))
    piped = [c for c in by_stages.ranked if c.layout.pp > 1]
    assert piped and all(c.knobs["virtual_stages"] > 1 for c in piped)


def test_a_hybrid_mamba_moe_model_plans_each_block_by_its_own_axes():
    """Nemotron 3 Nano (Mamba-2, attention and MoE layers) on 16 H100s: the ranking holds meshes with the
    Mamba and attention layers under TP-SSM, SP and TSP, each with the experts split by ep, all priced."""
    from meshplan.planner import plan
    from meshplan.planner.plan import KNOBS

    result = plan(
        PRESETS["nemotron-3-nano"],
        load_cluster("h100-sxm-8", 2),
        8192,
        1,
        CostOptions(stack="megatron", global_batch=256),
        search=frozenset(KNOBS),
        keep=0,
    )
    kinds = {(c.layout.kind, c.layout.ep > 1) for c in result.ranked}
    assert {("tpssm", True), ("sp", True), ("tsp", True)} <= kinds
    assert all(c.estimate.step_time_s > 0 for c in result.ranked)


def test_the_experts_states_shard_over_their_own_data_ranks_without_dp():
    """tp=8 with etp=1, ep=2 on one node (dp = 1): the experts' data-parallel group is 8/(1·2) = 4 ranks,
    and ZeRO-1 (Megatron's distributed optimizer) shards the experts' optimizer states over them while
    the rest, with no data parallelism, stays whole; the planner offers it."""
    from meshplan.planner.plan import enumerate_layouts

    layout = parse_layout("tp=8,ep=2,etp=1,zero=1")
    assert layout.expert_data_degree == 4
    opts = CostOptions(stack="megatron", tp_sequence_parallel=True)
    sharded = memory_per_gpu(MIXTRAL, layout, 4096, 1, opts).per_gpu_bytes["optimizer_state"]
    whole = memory_per_gpu(MIXTRAL, parse_layout("tp=8,ep=2,etp=1"), 4096, 1, opts).per_gpu_bytes["optimizer_state"]
    experts = 12 * 32 * 8 * 3 * 4096 * 14336 / 2  # a rank's 4 whole experts, 12 B a parameter
    assert whole - sharded == pytest.approx(experts * 3 / 4, rel=1e-6)
    assert layout in enumerate_layouts(MIXTRAL, 8, 4096, 1, "train", stack=opts.stack_spec)


def test_the_meshplan_stack_routes_every_tensor_ranks_tokens_without_megatron_sp():
    """meshplan's executor runs no Megatron-SP: each tensor rank routes all its shard's tokens
    (executor/layouts/ep.py), which its stack prices with no refusal — the all-to-alls twice the bytes
    of Megatron-SP's 1/tp share at tp=2."""
    from meshplan.costmodel.schedule import step_schedule
    from meshplan.predict import predict

    layout = parse_layout("dp=8,tp=2,ep=8,etp=1")
    predict(MIXTRAL, load_cluster("h100-sxm-8", 2), layout, 4096, 1, CostOptions(stack="meshplan"))

    def a2a_bytes(opts):
        per_block = step_schedule(MIXTRAL, layout, 4096, 1, opts).per_block["experts"]
        return sum(c.message_bytes * c.count for c in per_block if c.kind == "all_to_all")

    assert a2a_bytes(CostOptions(stack="meshplan")) == 2 * a2a_bytes(CostOptions(tp_sequence_parallel=True))


def test_the_executors_routing_is_priced_at_its_measured_passes():
    """The meshplan stack prices the router's and the permutation's bytes at EAGER_ROUTING_FACTOR (the
    executor's torch gathers and weighted sums) and the experts' SwiGLU at the elementwise factor (a Triton
    kernel); a fused stack (Megatron's) prices both at one pass. Hand arithmetic on Mixtral's shape:
    routing 4·k·h + (k + 1)·h = 45,056 elements a token, the activation 3·k·f = 86,016."""
    from meshplan.costmodel.blocks import BLOCKS
    from meshplan.costmodel.device import EAGER_ELEMENTWISE_FACTOR, EAGER_ROUTING_FACTOR, Device

    cluster = load_cluster("h100-sxm-8")
    mine = Device.of(cluster, CostOptions().stack_spec)
    routing, act = 4 * 2 * 4096 + 3 * 4096, 3 * 2 * 14336
    want = (routing * EAGER_ROUTING_FACTOR + act * EAGER_ELEMENTWISE_FACTOR) / (routing + act)
    assert BLOCKS["experts"].eager_factor(mine, MIXTRAL, 1) == pytest.approx(want)
    assert BLOCKS["router"].eager_factor(mine, MIXTRAL, 1) == EAGER_ROUTING_FACTOR
    fused = Device.of(cluster, CostOptions(stack="megatron").stack_spec)
    assert BLOCKS["experts"].eager_factor(fused, MIXTRAL, 1) == BLOCKS["router"].eager_factor(fused) == 1.0


def test_etp_over_sequence_or_data_ranks_gathers_the_copies_by_hand():
    """meshplan's stack (no Megatron-SP), Mixtral-8x7B at 4,096 tokens a rank: with etp = tp = 2 the two
    etp ranks route the same tokens, and their partial outputs of a rank's 4,096 · 2 copies (64 MiB of
    bf16) are all-reduced, forward and (the input gradients) backward. With etp = 2 over the data ranks
    (dp=4, ep=2, etp=2: etp innermost of the experts' order, so the group is two dp ranks) the ranks hold
    different tokens: summing their partial outputs means nothing, so each gathers the other's arrived
    copies (2 × 64 MiB) and reduce-scatters the outputs back, and its experts run both ranks' copies at
    half the FFN width — as under Megatron-SP. The executor runs both (executor/layouts/ep.py)."""
    from meshplan.costmodel.axes import plan_context
    from meshplan.costmodel.axes.ep import etp_gathers

    opts = CostOptions(stack="meshplan", global_batch=16)
    copies = 4096 * 2 * 4096 * 2
    within = _expert_comms("dp=2,tp=2,ep=2", opts)
    assert [(c.kind, c.axis, c.phase, c.message_bytes) for c in within] == [
        ("all_to_all", "ep", "fwd", copies),
        ("all_reduce", "etp", "fwd", copies),
        ("all_to_all", "ep", "fwd", copies),
        ("all_to_all", "ep", "bwd", copies),
        ("all_reduce", "etp", "bwd", copies),
        ("all_to_all", "ep", "bwd", copies),
    ]
    for text in ("dp=4,ep=2,etp=2", "sp=2,dp=2,ep=2,etp=2", "dp=2,tp=2,etp=4"):
        layout = parse_layout(text)
        ctx = plan_context(MIXTRAL, layout, 4096, 1, opts)
        own = 4096 / layout.sp
        assert etp_gathers(layout, ctx.sharding), text
        comms = [(c.kind, c.axis, c.message_bytes) for c in _expert_comms(text, opts) if c.axis == "etp"]
        group = layout.expert_tensor_degree * copies / layout.sp
        assert comms == [("all_gather", "etp", group), ("reduce_scatter", "etp", group)] * 2, text
        experts = ctx.sharding_of("experts")  # the group's copies, over FFN / etp
        assert 4096 / experts.token_div == layout.expert_tensor_degree * own, text
        assert experts.head_div == layout.expert_tensor_degree, text
    # etp = 2 inside tp = 4: both etp ranks are tensor ranks of the same tokens
    inside = parse_layout("dp=2,tp=4,ep=2,etp=2")
    assert not etp_gathers(inside, plan_context(MIXTRAL, inside, 4096, 1, opts).sharding)

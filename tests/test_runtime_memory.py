"""What a rank holds beside PyTorch's allocator (meshplan/costmodel/runtime.py): the communicators a
plan opens, hand-counted; the executor's measured growth per layout; the planner's fit check."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.costmodel import runtime
from meshplan.costmodel.options import CostOptions
from meshplan.layout import parse_layout
from meshplan.models import PRESETS
from meshplan.predict import predict
from meshplan.topologies import load_cluster

MIB = 2**20
RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "s22-h200x4"
EXECUTES = RESULTS.parent / "s22-h200x2-execute"
MIXTRAL = replace(PRESETS["mixtral-8x7b"], layers=2, name="mixtral-8x7b/2L")
DENSE = replace(PRESETS["dense-7b"], layers=2, name="dense-7b/2L")
EXECUTOR = CostOptions(stack="meshplan")
MEGATRON = CostOptions(stack="megatron")


def _opened(model, layout: str, gpus_per_node: int = 8, embeddings: bool = True, opts=EXECUTOR) -> dict[str, tuple]:
    comms = runtime.communicators(model, parse_layout(layout), 4096, opts, gpus_per_node, embeddings)
    return {c.axis: (c.ranks, c.ring, c.p2p_links) for c in comms}


def test_one_gpu_holds_the_context_alone():
    for opts in (MEGATRON, EXECUTOR):
        out = runtime.outside_allocator(DENSE, parse_layout("single"), 4096, opts, 8)
        assert out.communicators == () and out.total_bytes == (
            opts.stack_spec.cuda_context_bytes or runtime.CONTEXT_BYTES
        )
    assert (
        runtime.outside_allocator(DENSE, parse_layout("single"), 4096, MEGATRON, 8).total_bytes == runtime.CONTEXT_BYTES
    )


def test_expert_parallel_plan_by_hand():
    # dp=4,ep=4 on 4 GPUs under Megatron: the default group (its barriers) and dp's gradient all-reduce
    # run ring collectives; the experts' all-to-all sends to and receives from 3 peers: 6 links.
    opened = _opened(MIXTRAL, "dp=4,ep=4", opts=MEGATRON)
    assert opened == {"world": (4, True, 0), "ep": (4, False, 6), "dp": (4, True, 0)}
    out = runtime.outside_allocator(MIXTRAL, parse_layout("dp=4,ep=4"), 4096, MEGATRON, 8)
    ring = runtime.COMMUNICATOR_BYTES + runtime.RING_BYTES
    a2a = runtime.COMMUNICATOR_BYTES + 6 * runtime.P2P_LINK_BYTES
    assert out.total_bytes == runtime.CONTEXT_BYTES + runtime.NCCL_PROCESS_BYTES + 2 * ring + a2a
    # meshplan's executor runs nothing on the default group: no communicator for it
    assert "world" not in _opened(MIXTRAL, "dp=4,ep=4")


@pytest.mark.parametrize("path", sorted(EXECUTES.glob("execute-*.json")), ids=lambda p: p.stem)
def test_a_run_holds_what_is_priced_beside_its_allocator(path):
    # `meshplan execute` on 2 × H200 (benchmarks/sweeps/s22-two-gpu.sh), one process group a run: the
    # driver's bytes beyond the allocator after the timed steps against the executor's price.
    run = json.loads(path.read_text())
    model = replace(PRESETS[run["model"].split("/")[0]], layers=run["layers"])
    out = runtime.outside_allocator(model, parse_layout(run["layout"]), run["seq"], EXECUTOR, 8)
    assert out.total_bytes == pytest.approx(run["measured"]["outside_allocator_bytes"], rel=0.05)


def test_pipeline_and_ring_links_by_hand():
    # pp=2 in training: rank 0 sends activations to rank 1 and receives their gradients: 2 links; a
    # longer line is counted by its forward links alone (the next and the previous stage: 2, a floor:
    # runtime._neighbour_links). TSP's weight ring: next and previous: 2.
    assert _opened(DENSE, "pp=2")["pp"] == (2, False, 2)
    assert _opened(DENSE, "pp=4")["pp"] == (4, False, 2)
    assert _opened(DENSE, "tsp=4", embeddings=False)["tsp"] == (4, True, 2)
    prefill = runtime.communicators(DENSE, parse_layout("pp=4"), 4096, replace(EXECUTOR, mode="prefill"), 8)
    assert {c.axis: c.p2p_links for c in prefill} == {"pp": 2}
    prefill2 = runtime.communicators(DENSE, parse_layout("pp=2"), 4096, replace(EXECUTOR, mode="prefill"), 8)
    assert {c.axis: c.p2p_links for c in prefill2} == {"pp": 1}  # the activations forward, nothing back


def test_links_to_other_nodes_are_not_counted():
    # ep=16 over two nodes of 8: an all-to-all links the 7 peers on the rank's node (NIC buffers are
    # unmeasured); a pipeline whose stages sit on different nodes opens no NVLink links.
    model = PRESETS["qwen3-30b-a3b"]
    assert _opened(model, "dp=16,ep=16")["ep"] == (16, False, 14)
    assert _opened(DENSE, "dp=8,pp=2")["pp"] == (2, False, 0)
    # pp=4 over tp=4 on nodes of 8: two stages a node, so a stage's one neighbour shares its node
    assert _opened(DENSE, "pp=4,tp=4")["pp"] == (4, False, 1)


def _deltas(name: str):
    """(layout, growth of outside_allocator_bytes) for each layout whose mesh was new, after the first
    multi-GPU one (which also opens the default group and the sweep's gather to rank 0)."""
    runs = json.loads((RESULTS / name).read_text())["runs"]
    seen, prev, out = set(), None, []
    for r in runs:
        now = r["measured"]["outside_allocator_bytes"]
        if r["layout"] not in seen and prev is not None and r["world"] > 1 and prev[0] > 1:
            out.append((r["layout"], now - prev[1]))
        seen.add(r["layout"])
        prev = (r["world"], now)
    return out


MAMBA = replace(PRESETS["mamba2-2.7b"], layers=2, name="mamba2-2.7b/2L")
# Where the price is known to fall short (a floor): TSP's Mamba-2 block gathers its weight shards round
# the ring both ways (meshplan/executor/layouts/tsp_mamba.py), two links more than a ring's at degree 4.
UNDERPRICED = {("validation-mamba2-h200x4-s22.json", "tsp=4")}


@pytest.mark.parametrize(
    "name, model",
    [
        ("validation-h200x4-s22.json", DENSE),
        ("validation-moe-h200x4-s22.json", MIXTRAL),
        ("validation-mamba2-h200x4-s22.json", MAMBA),
    ],
)
def test_executor_growth_per_layout_matches_measurement(name, model):
    # Each layout the sweep ran opened its own communicators (benchmarks/sweeps/s22-four-gpu.sh on 4 × H200);
    # what the driver held beyond the allocator (its fullest rank) grew by them: never less than priced,
    # and within 5% where the price is not known to fall short.
    deltas = _deltas(name)
    assert len(deltas) >= 4
    for layout, grew in deltas:
        comms = runtime.communicators(model, parse_layout(layout), 4096, EXECUTOR, 8, False)
        predicted = sum(c.buffer_bytes for c in comms if c.axis != "world")
        assert predicted <= grew * 1.02, layout
        if (name, layout) not in UNDERPRICED:
            assert grew <= predicted * 1.05, layout


def test_a_plan_that_fits_the_allocator_but_not_beside_it_does_not_fit():
    cluster = load_cluster("h100-sxm-8")
    opts = CostOptions(global_batch=8)
    layout = parse_layout("tp=8")
    p = predict(DENSE, cluster, layout, 4096, 1, opts)
    assert p.fits
    room = p.memory.total_bytes + p.outside.total_bytes // 2
    tight = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=room))
    q = predict(DENSE, tight, layout, 4096, 1, opts)
    assert q.memory.total_bytes < room and not q.fits


@settings(max_examples=60, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    sp=st.sampled_from([1, 2]),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 4]),
    ep=st.sampled_from([1, 2, 4]),
    mode=st.sampled_from(["train", "prefill"]),
)
def test_more_gpus_a_node_never_price_less_beside(tp, sp, pp, dp, ep, mode):
    # Links to other nodes are not counted: the same plan on larger nodes keeps more of each group on
    # one node, and never holds less; one GPU a node holds only the groups' own buffers.
    layout = parse_layout(f"tp={tp},sp={sp},pp={pp},dp={dp},ep={ep}")
    opts = replace(MEGATRON, mode=mode)
    held = [runtime.outside_allocator(MIXTRAL, layout, 4096, opts, g).total_bytes for g in (1, 2, 4, 8, 16)]
    assert held == sorted(held)
    if layout.world_size > 1:
        assert all(c.p2p_links == 0 for c in runtime.communicators(MIXTRAL, layout, 4096, opts, 1))


def test_the_memory_report_and_the_planner_refuse_what_fits_only_the_allocator():
    from meshplan.planner.plan import search_knobs
    from meshplan.reports import memory_record

    cluster = load_cluster("h100-sxm-8")
    layout = parse_layout("tp=8")
    opts = CostOptions(global_batch=8)
    p = predict(DENSE, cluster, layout, 4096, 1, opts)
    tight = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=p.memory.total_bytes + p.outside.total_bytes // 2))
    record = memory_record(DENSE, layout, 4096, 1, opts, tight)
    assert record["total_bytes"] < tight.gpu.memory_bytes and not record["fits"]
    chosen = search_knobs(DENSE, tight, layout, 4096, 1, opts, search=frozenset())
    assert chosen is not None and chosen[2] is False  # none of its settings fits


def test_a_tight_winner_is_said_to_be_tight():
    # The caching allocator's slack is not priced: a winner within 5% of the GPU's memory says so.
    from meshplan.planner.plan import TIGHT_SHARE, explain, plan

    cluster = load_cluster("h100-sxm-8")
    opts = CostOptions(global_batch=8)
    result = plan(DENSE, cluster, 4096, 1, opts)
    win = result.ranked[0]
    roomy = explain(result.ranked, result.dropped, "throughput", opts, cluster)
    assert win.device_bytes < (1 - TIGHT_SHARE) * cluster.gpu.memory_bytes and "may not run" not in roomy
    tight = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=int(win.device_bytes * 1.02)))
    assert "may not run" in explain(result.ranked, result.dropped, "throughput", opts, tight)

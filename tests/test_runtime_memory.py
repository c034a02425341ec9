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
    # pp=2 in training: rank 0 sends activations to rank 1 and receives their gradients: 2 links;
    # a middle stage of 4 sends and receives both ways: 4. TSP's weight ring: next and previous: 2.
    assert _opened(DENSE, "pp=2")["pp"] == (2, False, 2)
    assert _opened(DENSE, "pp=4")["pp"] == (4, False, 4)
    assert _opened(DENSE, "tsp=4", embeddings=False)["tsp"] == (4, True, 2)
    prefill = runtime.communicators(DENSE, parse_layout("pp=4"), 4096, replace(EXECUTOR, mode="prefill"), 8)
    assert {c.axis: c.p2p_links for c in prefill} == {"pp": 2}  # forward only


def test_links_to_other_nodes_are_not_counted():
    # ep=16 over two nodes of 8: an all-to-all links the 7 peers on the rank's node (NIC buffers are
    # unmeasured); a pipeline whose stages sit on different nodes opens no NVLink links.
    model = PRESETS["qwen3-30b-a3b"]
    assert _opened(model, "dp=16,ep=16")["ep"] == (16, False, 14)
    assert _opened(DENSE, "dp=8,pp=2")["pp"] == (2, False, 0)


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


@pytest.mark.parametrize(
    "name, model", [("validation-h200x4-s22.json", DENSE), ("validation-moe-h200x4-s22.json", MIXTRAL)]
)
def test_executor_growth_per_layout_matches_measurement(name, model):
    # Each layout the sweep ran opened its own communicators (benchmarks/sweeps/s22-four-gpu.sh on 4 × H200);
    # what the driver held beyond the allocator grew by them.
    deltas = _deltas(name)
    assert len(deltas) >= 4
    for layout, grew in deltas:
        comms = runtime.communicators(model, parse_layout(layout), 4096, EXECUTOR, 8, False)
        predicted = sum(c.buffer_bytes for c in comms if c.axis != "world")
        assert predicted == pytest.approx(grew, rel=0.02), layout


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


@settings(max_examples=40, deadline=None)
@given(
    axis=st.sampled_from(["tp", "sp", "dp", "pp", "tsp"]),
    degree=st.sampled_from([2, 4, 8]),
    nodes_gpus=st.sampled_from([4, 8]),
)
def test_adding_a_data_parallel_axis_never_shrinks_what_lies_beside(axis, degree, nodes_gpus):
    base = parse_layout(f"{axis}={degree}")
    more = parse_layout(f"{axis}={degree},dp=2") if axis != "dp" else parse_layout(f"dp={2 * degree}")
    a = runtime.outside_allocator(DENSE, base, 4096, MEGATRON, nodes_gpus).total_bytes
    b = runtime.outside_allocator(DENSE, more, 4096, MEGATRON, nodes_gpus).total_bytes
    assert runtime.CONTEXT_BYTES + runtime.NCCL_PROCESS_BYTES < a <= b

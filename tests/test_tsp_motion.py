"""costmodel/axes/tsp.py's TSP motion (motion_bytes, head_motion_bytes) against what the executor's TSP
layout moves, counted op by op on the CPU (benchmarks/tsp_bytes.py: a whole-model training step on gloo
ranks, the GEMMs and attention kernels stubbed), and where the step prices it."""

from dataclasses import replace

import pytest
from benchmark_scripts import BENCHMARKS, load

from meshplan.costmodel.axes.tsp import head_motion_bytes, motion_bytes
from meshplan.executor.distributed import run_distributed
from meshplan.models import dense


def _tiny(qk_norm: bool, hidden: int, heads: int, kv_heads: int):
    model = replace(dense("tiny-tsp", hidden, 2, heads, kv_heads, 2 * hidden, 96), param_dtype="bf16")
    if qk_norm:
        model = replace(model, attention=replace(model.attention, qk_norm=2 * model.attention.head_dim))
    return model


@pytest.mark.parametrize(
    "d, qk_norm, hidden, heads, kv_heads",
    [(2, False, 64, 8, 4), (3, True, 96, 6, 3)],
)
def test_tsp_motion_is_what_the_executor_moves(monkeypatch, d, qk_norm, hidden, heads, kv_heads):
    """Every rank's counted bytes of the TSP attention and MLP Functions' torch ops and of _TSPLogits equal the
    formulas' (bf16, GQA; with query/key norms at D = 3)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the spawned ranks import the counter by name
    counter = load("tsp_bytes")
    model = _tiny(qk_norm, hidden, heads, kv_heads)
    seq = 2 * d * 16
    ranks = run_distributed(counter._rank, d, seq, True, model, timeout_s=300)
    tokens = seq / d
    attn, mlp = motion_bytes(model, "attention", tokens, d, 2), motion_bytes(model, "mlp", tokens, d, 2)
    head = head_motion_bytes(model, tokens, d, 2)
    for r in ranks:
        got = counter.tsp_motion(r)
        assert got["layers forward"] == pytest.approx(model.layers * (attn[0] + mlp[0]), rel=1e-9)
        assert got["layers backward"] == pytest.approx(model.layers * (attn[1] + mlp[1]), rel=1e-9)
        assert got["head forward"] == pytest.approx(head[0], rel=1e-9)
        assert got["head backward"] == pytest.approx(head[1], rel=1e-9)


def test_tsp_motion_is_priced_for_the_executor_only(monkeypatch):
    """meshplan's stack pays TSP's motion at the rated HBM rate, in its layers and its head, over what the
    same stack pays without it (Stack.tsp_motion off, as for a stack with no TSP executor); tp=2 pays none."""
    from meshplan.costmodel import stacks
    from meshplan.costmodel.options import CostOptions
    from meshplan.costmodel.step import estimate_step
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS
    from meshplan.topologies.cluster import load_cluster

    cluster = load_cluster("h200-8")
    model = replace(PRESETS["dense-7b"], layers=2)

    def breakdown(layout):
        return estimate_step(model, parse_layout(layout), 4096, 1, CostOptions(mode="train"), cluster).breakdown

    mine = breakdown("tsp=2")
    monkeypatch.setitem(stacks.STACKS, "meshplan", replace(stacks.STACKS["meshplan"], tsp_motion=False))
    stacks.stack_at.cache_clear()  # it made meshplan's stack once
    try:
        without = breakdown("tsp=2")
    finally:
        monkeypatch.undo()
        stacks.stack_at.cache_clear()
    rated = cluster.gpu.hbm_bytes_per_s
    attn, mlp = motion_bytes(model, "attention", 2048, 2, 2), motion_bytes(model, "mlp", 2048, 2, 2)
    layers = model.layers * (sum(attn) + sum(mlp)) / rated
    assert mine["shard_motion_s"] - without["shard_motion_s"] == pytest.approx(layers, rel=1e-6)
    head = sum(head_motion_bytes(model, 2048, 2, 2)) / rated
    assert mine["logits_compute_s"] - without["logits_compute_s"] == pytest.approx(head, rel=1e-6)
    assert breakdown("tp=2").get("shard_motion_s", 0.0) == 0.0

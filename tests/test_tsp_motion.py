"""costmodel/axes/tsp.py's TSP motion (motion_bytes, head_motion_bytes) against what the executor's TSP
layout moves, counted op by op on the CPU (benchmarks/tsp_bytes.py: a whole-model training step on gloo
ranks, the GEMMs and attention kernels stubbed), and where the step prices it."""

from dataclasses import replace

import pytest
from benchmark_scripts import BENCHMARKS, load

from meshplan.costmodel.axes.tsp import head_motion_bytes, motion_bytes
from meshplan.costmodel.compute import executor_loss_bytes
from meshplan.costmodel.device import TORCH_OP_HBM_FRACTION
from meshplan.executor.distributed import run_distributed
from meshplan.models import MoeSpec, dense, mamba2, moe


def _tiny(qk_norm: bool, hidden: int, heads: int, kv_heads: int):
    model = replace(dense("tiny-tsp", hidden, 2, heads, kv_heads, 2 * hidden, 96), param_dtype="bf16")
    if qk_norm:
        model = replace(model, attention=replace(model.attention, qk_norm=2 * model.attention.head_dim))
    return model


@pytest.mark.parametrize(
    "d, qk_norm, hidden, heads, kv_heads, batch",
    [(2, False, 64, 8, 4, 1), (3, True, 96, 6, 3, 1), (2, False, 64, 8, 4, 2)],
)
def test_tsp_motion_is_what_the_executor_moves(monkeypatch, d, qk_norm, hidden, heads, kv_heads, batch):
    """Every rank's counted bytes of the TSP attention and MLP Functions' torch ops (and the gathers' and
    reduce-scatters' copies they make) and of _TSPLogits equal the formulas' (bf16, GQA; with query/key norms
    at D = 3; two sequences a batch)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the spawned ranks import the counter by name
    counter = load("tsp_bytes")
    model = _tiny(qk_norm, hidden, heads, kv_heads)
    seq = 2 * d * 16
    ranks = run_distributed(counter._rank, d, seq, True, model, batch, timeout_s=300)
    tokens = batch * seq / d
    attn = motion_bytes(model, "attention", tokens, d, 2, rows=batch)
    mlp = motion_bytes(model, "mlp", tokens, d, 2, rows=batch)
    head = head_motion_bytes(model, tokens, d, 2)
    for r in ranks:
        got = counter.tsp_motion(r)
        for part, want in (("attention", attn), ("mlp", mlp)):
            assert got[f"{part} forward"] == pytest.approx(model.layers * want[0], rel=1e-9)
            assert got[f"{part} backward"] == pytest.approx(model.layers * want[1], rel=1e-9)
        assert got["head forward"] == pytest.approx(head[0], rel=1e-9)
        assert got["head backward"] == pytest.approx(head[1], rel=1e-9)
        # the loss over TSP's fp32 logits as compute.executor_loss_bytes prices it; beside it only the ops on
        # each token's row statistics and label (under 160 bytes a token; the logits' are 48 · vocab)
        loss = executor_loss_bytes(tokens * model.vocab, 4)
        for phase, want in zip(("forward", "backward"), loss):
            assert 0 <= got[f"loss {phase}"] - want <= 160 * tokens, (phase, got[f"loss {phase}"], want)


def test_tsp_loss_bytes_are_exact_per_logit(monkeypatch):
    """The loss's counted bytes at two vocabulary sizes: what grows with the vocabulary is exactly
    compute.executor_loss_bytes's per logit, and what is left (the ops on each token's row statistics and
    label, which the model does not price) is the same at both — not a share of the logits' bytes."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    counter = load("tsp_bytes")
    d, seq = 2, 64
    tokens = seq / d
    left = {}
    for vocab in (96, 160):
        model = replace(_tiny(False, 64, 8, 4), vocab=vocab)
        ranks = run_distributed(counter._rank, d, seq, True, model, 1, timeout_s=300)
        want = executor_loss_bytes(tokens * vocab, 4)
        left[vocab] = [
            tuple(counter.tsp_motion(r)[f"loss {phase}"] - w for phase, w in zip(("forward", "backward"), want))
            for r in ranks
        ]
    assert left[96] == left[160]
    assert all(0 <= b <= 160 * tokens for rank in left[96] for b in rank)


@pytest.mark.parametrize("d, batch", [(2, 1), (4, 1), (2, 2)])
def test_tsp_mamba2_motion_is_what_the_executor_moves(monkeypatch, d, batch):
    """A Mamba-2 stack under TSP: every rank's counted bytes of tsp_mamba.py's gathers, packing and Function
    equal motion_bytes's, and the head's as for a dense model."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    counter = load("tsp_bytes")
    model = replace(mamba2("tiny-tsp-mamba2", 64, 2, 96, d_state=16, headdim=16), param_dtype="bf16")
    seq = 64
    ranks = run_distributed(counter._rank, d, seq, True, model, batch, timeout_s=300)
    block = motion_bytes(model, "mamba2", batch * seq / d, d, 2, rows=batch)
    head = head_motion_bytes(model, batch * seq / d, d, 2)
    for r in ranks:
        got = counter.tsp_motion(r)
        assert got["mamba2 forward"] == pytest.approx(model.layers * block[0], rel=1e-9)
        assert got["mamba2 backward"] == pytest.approx(model.layers * block[1], rel=1e-9)
        assert (got["head forward"], got["head backward"]) == pytest.approx(head, rel=1e-9)


@pytest.mark.parametrize("d", [2, 4])
def test_tsp_moe_motion_is_what_the_executor_moves(monkeypatch, d):
    """An MoE stack under TSP (Qwen2-MoE's shape: a gated shared expert behind a sigmoid gate): every rank's
    counted bytes of the router's ring (RingRowsFn), the shared expert's (_TSPMlpFn) and its gate's
    (RingColumnsFn) equal motion_bytes's."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    counter = load("tsp_bytes")
    spec = MoeSpec(64, 4, 2, 64, shared_ffn=96, shared_gate=True, norm_topk=False)
    model = replace(moe(dense("tiny-tsp-moe", 64, 2, 8, 4, 128, 96), spec), param_dtype="bf16")
    seq = 64
    ranks = run_distributed(counter._rank, d, seq, True, model, 1, timeout_s=300)
    router = motion_bytes(model, "router", seq / d, d, 2)
    shared = motion_bytes(model, "shared_expert", seq / d, d, 2)
    for r in ranks:
        got = counter.tsp_motion(r)
        assert (got["router forward"], got["router backward"]) == pytest.approx(
            tuple(model.layers * b for b in router), rel=1e-9
        )
        both = (got["mlp forward"] + got["shared gate forward"], got["mlp backward"] + got["shared gate backward"])
        assert both == pytest.approx(tuple(model.layers * b for b in shared), rel=1e-9)
        # the gate's share alone: its one-wide output zero-filled and summed over the D hops, and backward the
        # input gradient's columns copied into place
        gate = (seq / d * 2 * (1 + 3 * d), 2 * seq / d * model.d_model * 2)
        assert (got["shared gate forward"], got["shared gate backward"]) == pytest.approx(
            tuple(model.layers * b for b in gate), rel=1e-9
        )
        assert got["attention forward"] > 0 and got["mamba2 forward"] == 0  # nothing counted in the wrong part


def test_tsp_motion_is_priced_for_the_executor_only(monkeypatch):
    """meshplan's stack pays TSP's motion at its torch ops' rate, in its layers and its head, over what the
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
    rate = cluster.gpu.hbm_bytes_per_s * TORCH_OP_HBM_FRACTION  # the executor's torch ops' measured rate
    attn, mlp = motion_bytes(model, "attention", 2048, 2, 2), motion_bytes(model, "mlp", 2048, 2, 2)
    layers = model.layers * (sum(attn) + sum(mlp)) / rate
    assert mine["shard_motion_s"] - without["shard_motion_s"] == pytest.approx(layers, rel=1e-6)
    head = sum(head_motion_bytes(model, 2048, 2, 2)) / rate
    assert mine["logits_compute_s"] - without["logits_compute_s"] == pytest.approx(head, rel=1e-6)
    assert breakdown("tp=2").get("shard_motion_s", 0.0) == 0.0


@pytest.mark.parametrize("name, kind", [("dense-7b", "attention"), ("dense-7b", "mlp"), ("mamba2-2.7b", "mamba2")])
def test_tsp_decode_motion(name, kind):
    """A TSP decode step pays what the executor's decode moves: attention its shard packed, its output
    zero-filled and D partial outputs added (TSPAttention.decode); the MLP its forward's ring; a Mamba-2 block
    its whole weights gathered and rebuilt (TSPMamba2.decode) — none of the forward's saved-tensor copies."""
    from meshplan.costmodel.axes import plan_context
    from meshplan.costmodel.blocks import BLOCKS, streamed_block_params
    from meshplan.costmodel.compute import block_compute
    from meshplan.costmodel.device import Device
    from meshplan.costmodel.options import CostOptions
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS
    from meshplan.topologies.cluster import load_cluster

    model, batch, seq, d = PRESETS[name], 8, 4096, 2
    opts = CostOptions(mode="decode")
    ctx = plan_context(model, parse_layout(f"tsp={d},dp=4"), seq, batch, opts)
    sh, dev = ctx.sharding_of(kind), Device.of(load_cluster("h200-8"))
    comp = block_compute(model, kind, batch, seq, sh, 2, dev, recompute="none", training=False, row_tokens=1)
    got = (
        BLOCKS[kind].decode(comp, model, batch, seq, sh, opts, dev).motion_fwd_s * dev.rated_hbm * TORCH_OP_HBM_FRACTION
    )
    x, shard = batch * model.d_model * 2, streamed_block_params(model, kind) / d * 2
    want = {
        "attention": 2 * shard + x + 3 * d * x,
        "mlp": 2 * shard + 3 * (d - 1) * x,
        "mamba2": 2 * shard + 4 * d * shard,
    }[kind]
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("layout, kind", [("tsp=2", "mlp"), ("tsp=2", "mamba2"), ("sp=2", "attention")])
def test_full_recompute_redoes_the_forward_motion(layout, kind):
    """Full recompute runs a block's forward again in its backward, the forward's data motion (TSP's packing,
    a sequence shard's zigzag concatenations) with it, and the block's own recompute (a Mamba mixer's core, a
    sequence shard's attention) runs nested inside that: full recompute costs the forward more than none."""
    from meshplan.costmodel.axes import plan_context
    from meshplan.costmodel.compute import block_compute
    from meshplan.costmodel.device import Device
    from meshplan.costmodel.options import CostOptions
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS
    from meshplan.topologies.cluster import load_cluster

    model = PRESETS["mamba2-2.7b" if kind == "mamba2" else "dense-7b"]
    seq = 8192
    ctx = plan_context(model, parse_layout(layout), seq, 1, CostOptions(mode="train"))
    sh, dev = ctx.sharding_of(kind), Device.of(load_cluster("h200-8"))
    zigzag = 2 if kind == "attention" else 0

    def comp(recompute):
        return block_compute(
            model, kind, seq / 2, seq, sh, 2, dev, recompute=recompute, training=True, zigzag=zigzag, row_tokens=seq / 2
        )

    full, none = comp("full"), comp("none")
    assert full.motion_fwd_s > 0
    assert (none.recompute_fwd_s > 0) == (kind != "mlp")  # the block's own: the shard's core, the mixer's
    assert full.recompute_fwd_s == pytest.approx(full.fwd_s + none.recompute_fwd_s, rel=1e-12)
    assert full.bwd_s - none.bwd_s == pytest.approx(full.fwd_s, rel=1e-12)

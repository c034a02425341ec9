"""Context parallelism's K/V exchange as each stack makes it (meshplan.costmodel.axes.sp, --cp-comm-type):
allgather (gather, then attend), p2p (a ring of K/V blocks beside the attention, Megatron's default) and
a2a (Ulysses' heads-for-sequence all-to-alls) — bytes by hand, the overlap, the memory held, the rules,
and a ring attention on gloo processes whose output equals whole-sequence attention and whose bytes sent
equal the model's."""

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from meshplan.costmodel.axes import plan_context
from meshplan.costmodel.axes import sp as axes_sp
from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.step import estimate_step
from meshplan.errors import MeshplanError
from meshplan.executor.distributed import run_distributed
from meshplan.layout import parse_layout
from meshplan.models import PRESETS
from meshplan.topologies import load_cluster

LLAMA = replace(PRESETS["llama3-8b"], layers=2)  # 32 heads, 8 K/V heads of 128, hidden 4096
SEQ = 32768
MEGATRON = CostOptions(stack="megatron", tp_sequence_parallel=True)


def _attention_comms(opts, layout="tp=2,sp=4"):
    ctx = plan_context(LLAMA, parse_layout(layout), SEQ, 1, opts)
    return axes_sp.block_comms(ctx, "attention")


def test_each_stack_has_its_exchange_and_the_option_overrides_it():
    assert MEGATRON.cp_comm == "p2p"  # Megatron's --cp-comm-type default
    assert CostOptions().cp_comm == "allgather"  # meshplan's executor gathers
    assert replace(MEGATRON, cp_comm_type="a2a").cp_comm == "a2a"
    with pytest.raises(MeshplanError, match="--cp-comm-type: unknown 'ring'"):
        CostOptions(cp_comm_type="ring")


def test_ring_moves_the_gathers_bytes_beside_the_attention():
    """K/V of the whole sequence for a tensor rank's 4 of 8 K/V heads: 32768 · 2 · 4 · 128 · 2 bytes, in
    the forward and twice in the backward, either way; the ring's hide behind the attention."""
    kv = SEQ * 2 * 4 * 128 * 2
    gather, ring = _attention_comms(replace(MEGATRON, cp_comm_type="allgather")), _attention_comms(MEGATRON)
    assert [c.message_bytes for c in gather] == [c.message_bytes for c in ring] == [kv, kv, kv]
    assert [c.phase for c in ring] == ["fwd", "bwd", "bwd"]
    assert {c.overlap for c in gather} == {"none"} and {c.overlap for c in ring} == {"attention"}
    cluster = load_cluster("h100-sxm-8")
    layout = parse_layout("tp=2,sp=4")
    both = [
        estimate_step(LLAMA, layout, SEQ, 1, o, cluster)
        for o in (replace(MEGATRON, cp_comm_type="allgather"), MEGATRON)
    ]
    assert both[0].comm_bytes_per_step == both[1].comm_bytes_per_step
    assert both[1].exposed_comm_s < both[0].exposed_comm_s  # at 32K the attention hides the ring's steps


def test_all_to_all_swaps_heads_for_the_sequence_by_hand():
    """a2a: a rank's 8192 tokens of Q (16 heads) and K/V (4 + 4 heads) out and the output's 16 heads back,
    forward, and the same two in the backward."""
    local = SEQ // 4 * 128 * 2  # a rank's tokens × a head × bf16
    comms = _attention_comms(replace(MEGATRON, cp_comm_type="a2a"))
    assert [(c.kind, c.phase, c.message_bytes) for c in comms] == [
        ("all_to_all", "fwd", local * (16 + 8)),
        ("all_to_all", "fwd", local * 16),
        ("all_to_all", "bwd", local * 16),
        ("all_to_all", "bwd", local * (16 + 8)),
    ]


def test_what_a_rank_holds_for_the_other_shards():
    """The gather holds the whole sequence's K/V (and their gradients in training); the ring two blocks of
    a quarter each; the all-to-all the whole sequence's Q, K, V and output for a quarter of the heads."""
    layout = parse_layout("tp=2,sp=4")
    held = {
        t: memory_per_gpu(LLAMA, layout, SEQ, 1, replace(MEGATRON, cp_comm_type=t)).per_gpu_bytes["transient_kv_gather"]
        for t in ("allgather", "p2p", "a2a")
    }
    kv = SEQ * 2 * 4 * 128 * 2
    assert held["allgather"] == 2 * kv
    assert held["p2p"] == 2 * kv * 2 / 4
    assert held["a2a"] == 2 * SEQ * (16 + 8 + 16) * 128 * 2 / 4


def test_all_to_all_needs_whole_heads_per_rank():
    """tp=2 leaves 4 K/V heads a rank: sp = 8 cannot deal them out — one line naming the fix; the planner
    leaves such meshes out instead of failing."""
    opts = replace(MEGATRON, cp_comm_type="a2a")
    cluster = load_cluster("h100-sxm-8", 2)
    with pytest.raises(MeshplanError, match="sp=8 must divide the 16 query and 4 K/V heads"):
        estimate_step(LLAMA, parse_layout("tp=2,sp=8"), SEQ, 1, opts, cluster)
    assert axes_sp.violation(LLAMA, parse_layout("tp=2,sp=4"), opts) is None
    from meshplan.planner import plan

    ranked = plan(LLAMA, cluster, SEQ, 1, replace(opts, global_batch=8)).ranked
    assert ranked and all(axes_sp.violation(LLAMA, c.layout, opts) is None for c in ranked)


def _ring_attention(rank, world, seq_shard, heads, dim):
    """Causal attention of contiguous sequence shards by a ring of K/V blocks: each step attends to the
    block in hand, merging by log-sum-exp, and passes it on; the bytes sent counted."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(heads, seq_shard * world, dim, dtype=torch.float64) for _ in range(3))
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    mine = slice(rank * seq_shard, (rank + 1) * seq_shard)
    q_loc, kv = q[:, mine], torch.stack([k[:, mine], v[:, mine]])
    out = torch.zeros_like(q_loc)
    lse = torch.full((heads, seq_shard, 1), -torch.inf, dtype=torch.float64)
    sent = 0
    for step in range(world):
        src = (rank - step) % world
        if src <= rank:  # a later shard's keys are all masked for these queries
            scores = q_loc @ kv[0].transpose(-1, -2) / dim**0.5
            if src == rank:
                scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -torch.inf)
            block_lse = torch.logsumexp(scores, -1, keepdim=True)
            new = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - new) + torch.softmax(scores, -1) @ kv[1] * torch.exp(block_lse - new)
            lse = new
        if step < world - 1:
            arriving = torch.empty_like(kv)
            ops = [dist.P2POp(dist.isend, kv, (rank + 1) % world), dist.P2POp(dist.irecv, arriving, (rank - 1) % world)]
            for r in dist.batch_isend_irecv(ops):
                r.wait()
            sent += kv.numel() * 2  # as bf16 bytes, the model's unit
            kv = arriving
    return {"err": float((out - full[:, mine]).abs().max()), "sent": sent}


def test_a_ring_attention_matches_whole_attention_and_the_models_bytes():
    """Four gloo ranks, 16 tokens each: the ring's output equals causal attention over the 64 tokens, and
    each rank sends (σ − 1)/σ of the whole sequence's K/V — the model's forward K/V ring, per rank."""
    world, shard, heads, dim = 4, 16, 2, 8
    per_rank = run_distributed(_ring_attention, world, shard, heads, dim, timeout_s=120)
    assert max(r["err"] for r in per_rank) < 1e-12
    from meshplan.models import dense

    tiny = dense("tiny", heads * dim, 1, heads, heads, 32, 100)
    ctx = plan_context(tiny, parse_layout("sp=4"), shard * world, 1, MEGATRON)
    ring_fwd = next(c for c in axes_sp.block_comms(ctx, "attention") if c.phase == "fwd")
    assert all(r["sent"] == ring_fwd.bytes_per_rank for r in per_rank)

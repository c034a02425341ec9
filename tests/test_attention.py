"""The executor's attention core (meshplan.executor.attention) against plain SDPA with an explicit mask."""

import math

import pytest
import torch
import torch.nn.functional as F
from benchmark_scripts import load

from meshplan.executor.attention import (
    CUDNN_BLOCKS,
    FLASH_BLOCKS,
    MATH_BLOCKS,
    _ShardAttention,
    causal_attention,
    shard_attention,
    shard_blocks,
)
from meshplan.executor.saved import count_saved_bytes

# (queries, keys, query heads, KV heads): a whole sequence, shards at 2-4× their keys, GQA, MQA and MHA,
# and lengths that are no power of two.
SHAPES = [
    (8, 8, 4, 4),
    (8, 8, 4, 2),
    (8, 16, 4, 4),
    (8, 16, 4, 2),
    (8, 24, 6, 3),
    (8, 32, 4, 1),
    (16, 64, 8, 2),
    (5, 13, 2, 2),
]


def _inputs(t, kv_len, heads, kv_heads, dtype, d=16, batch=2):
    q = torch.randn(batch, heads, t, d, dtype=torch.float64)
    k, v = (torch.randn(batch, kv_heads, kv_len, d, dtype=torch.float64) for _ in range(2))
    go = torch.randn(batch, heads, t, d, dtype=torch.float64)
    return [x.to(dtype).requires_grad_(True) for x in (q, k, v)], go.to(dtype)


def _reference(q, k, v):
    """SDPA over K/V repeated to every query head, with a materialised lower-right causal mask."""
    t, kv_len = q.shape[2], k.shape[2]
    rep = q.shape[1] // k.shape[1]
    visible = torch.ones(t, kv_len, dtype=torch.bool).tril(kv_len - t)
    return F.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=visible
    )


def _output_and_grads(fn, inputs, go):
    out = fn(*inputs)
    return [out, *torch.autograd.grad(out, inputs, go)]


@pytest.mark.parametrize("t, kv_len, heads, kv_heads", SHAPES)
def test_shard_attention_matches_masked_sdpa_in_float64(t, kv_len, heads, kv_heads):
    torch.manual_seed(t * kv_len + heads + kv_heads)
    inputs, go = _inputs(t, kv_len, heads, kv_heads, torch.float64)
    got = _output_and_grads(shard_attention, inputs, go)
    want = _output_and_grads(_reference, inputs, go)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_shard_attention_in_low_precision_stays_near_float64(dtype, tol):
    """The blocks accumulate in fp32 and merge in fp32: bf16 inputs land within bf16's rounding."""
    torch.manual_seed(1)
    inputs, go = _inputs(16, 48, 8, 2, dtype)
    got = _output_and_grads(shard_attention, inputs, go)
    exact = [x.detach().double().requires_grad_(True) for x in inputs]
    want = _output_and_grads(_reference, exact, go.double())
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol, msg=name)


def test_causal_attention_takes_gqa_kv_as_they_are():
    torch.manual_seed(2)
    inputs, go = _inputs(12, 12, 8, 2, torch.float64)
    got = _output_and_grads(causal_attention, inputs, go)
    want = _output_and_grads(_reference, inputs, go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_shard_saves_q_k_v_output_and_one_fp32_lse():
    """What the memory model counts for fused attention: q, k, v, the output and a per-head fp32
    log-sum-exp — one, the merged one, not each block's."""
    torch.manual_seed(3)
    (q, k, v), _ = _inputs(16, 64, 8, 2, torch.float32)
    with count_saved_bytes() as saved:
        out = shard_attention(q, k, v)
    b, a, t, _ = q.shape
    expected = sum(x.numel() * x.element_size() for x in (q, k, v, out)) + b * a * t * 4
    assert saved["bytes"] == expected
    assert saved["tensors"] == 5


def test_cpu_runs_the_plain_torch_blocks():
    (q, k, v), _ = _inputs(8, 16, 4, 2, torch.float32)
    assert shard_blocks(q, k, v) is MATH_BLOCKS


def test_shard_rejects_fewer_keys_than_queries():
    (q, k, v), _ = _inputs(8, 4, 4, 2, torch.float32)
    with pytest.raises(ValueError, match="at least as many keys"):
        shard_attention(q, k, v)


@pytest.mark.parametrize("blocks", [CUDNN_BLOCKS, FLASH_BLOCKS], ids=lambda b: b.name)
def test_fused_blocks_call_their_aten_ops_with_the_right_arguments(blocks):
    """The GPU kernels' forward and backward through torch's meta registrations (shapes and dtypes, no
    data): the arguments reach the aten ops in their schemas' order, GQA's K/V at their own head count,
    and the merge and backward of a shard run on what they return."""
    q = torch.empty(2, 8, 128, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.empty(2, 2, 384, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = _ShardAttention.apply(q, k, v, blocks)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    _, lse, _ = blocks.forward(q, k[:, :, :128], v[:, :, :128], True)
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32


def test_attention_paths_benchmark_runs_its_plumbing_on_the_cpu(tmp_path):
    """benchmarks/bench_attention_paths.py at tiny shapes on the CPU: every case timed old and new, the
    check's bf16 blocks within bf16 rounding of float64, and the tables keyed as device.py's."""
    import json

    bench = load("bench_attention_paths")
    out = tmp_path / "paths.json"
    assert bench.main(["--device", "cpu", "--quick", "--reps", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [c["blocks"] for c in result["check"]] == ["math"]
    assert all(result["check"][0][g] < 1e-2 for g in ("out", "dq", "dk", "dv"))
    assert [(r["path"], r["queries"], r["keys"]) for r in result["rows"]] == [
        ("causal", 256, 256),
        ("prefix", 256, 512),
        ("prefix", 128, 512),
    ]
    assert all(r["old_ms"] > 0 and r["new_ms"] > 0 for r in result["rows"])
    assert result["tables"] == {
        "ATTENTION_EFFICIENCY_CAUSAL": [[256, round(result["rows"][0]["new_efficiency"], 3)]],
        "ATTENTION_EFFICIENCY_PREFIX": [[512, round(result["rows"][1]["new_efficiency"], 3)]],
    }


def test_peers_benchmark_layer_computes_meshplans_dense_layer():
    """benchmarks/peers.py's torchtitan-style layer, given meshplan's DenseLayer weights, is the same
    function (float64, GQA), so the peers time the same work."""
    from meshplan.executor.blocks import DenseLayer
    from meshplan.models import dense

    peers = load("peers")
    model = dense("tiny-gqa", 64, 2, 8, 2, 128, 100)
    torch.manual_seed(4)
    ref = DenseLayer(model).double()
    peer = peers.PeerLayer(model).double().load_from(ref)
    x = torch.randn(2, 24, 64, dtype=torch.float64)
    torch.testing.assert_close(peer(x), ref(x), rtol=1e-12, atol=1e-12)


def _causal_reference(q, k, v):
    """Position-order causal attention, GQA's K/V repeated, in q's dtype: (b, S, a, d)."""
    b, S, a, d = q.shape
    rep = a // k.shape[2]
    qh, kh, vh = (
        q.transpose(1, 2),
        k.transpose(1, 2).repeat_interleave(rep, 1),
        v.transpose(1, 2).repeat_interleave(rep, 1),
    )
    scores = (qh @ kh.transpose(-1, -2) / math.sqrt(d)).masked_fill(
        torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf")
    )
    return (scores.softmax(-1) @ vh).transpose(1, 2)


def test_zigzag_runs_by_hand():
    """Two ranks, chunks of 4: rank-major gathered keys [f0 s0 f1 s1] at positions [0, 3, 1, 2] (chunks)."""
    from meshplan.executor.attention import KeyRun, zigzag_runs

    assert zigzag_runs(2, 0, 4) == (
        (KeyRun(0, 4, True),),
        (KeyRun(0, 4, False), KeyRun(4, 4, True), KeyRun(8, 8, False)),
    )
    assert zigzag_runs(2, 1, 4) == (
        (KeyRun(0, 4, False), KeyRun(8, 4, True)),
        (KeyRun(0, 4, False), KeyRun(8, 4, False), KeyRun(12, 4, True)),
    )


@pytest.mark.parametrize("parts", [2, 3, 4])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
def test_zigzag_attention_over_gathered_keys_is_causal_attention(parts, heads, kv_heads):
    """Each rank's two zigzag chunks over the keys as the all-gather leaves them (rank-major, never put in
    position order): its rows of whole-sequence causal attention, its query gradients, and — summed over
    the ranks, as the reduce-scatter sums them — the keys' and values' gradients, in float64."""
    from meshplan.executor.attention import zigzag_attention
    from meshplan.executor.layouts.common import zigzag_tokens

    gen = torch.Generator().manual_seed(parts * 10 + kv_heads)
    b, S, d = 2, parts * 2 * 4, 8
    q, k, v = (torch.randn(b, S, n, d, dtype=torch.float64, generator=gen) for n in (heads, kv_heads, kv_heads))
    for t in (q, k, v):
        t.requires_grad_(True)
    want = _causal_reference(q, k, v)
    dy = torch.randn(want.shape, dtype=torch.float64, generator=gen)
    want.backward(dy)
    gathered = torch.cat([zigzag_tokens(S, parts, r) for r in range(parts)])
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for rank in range(parts):
        mine = zigzag_tokens(S, parts, rank)
        qr = q.detach()[:, mine].clone().requires_grad_(True)
        kr, vr = (t.detach()[:, gathered].clone().requires_grad_(True) for t in (k, v))
        out = zigzag_attention(qr, kr, vr, parts, rank)
        out.backward(dy[:, mine])
        torch.testing.assert_close(out, want.detach()[:, mine], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(qr.grad, q.grad[:, mine], rtol=1e-10, atol=1e-10)
        dk[:, gathered] += kr.grad
        dv[:, gathered] += vr.grad
    torch.testing.assert_close(dk, k.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dv, v.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("parts", [2, 3, 4])
@pytest.mark.parametrize("heads, kv_heads", [(32, 32), (32, 8)])
def test_zigzag_motion_bytes_are_what_the_executor_moves(parts, heads, kv_heads):
    """blocks.attention.zigzag_motion_bytes against the executor's own ops counted (benchmarks/zigzag_bytes.py:
    attend_zigzag forward and backward on the CPU, the attention kernels stubbed) on the busiest rank (the
    last: a rank past the first, whose second chunk sees fewer than every key)."""
    from meshplan.costmodel.blocks.attention import zigzag_motion_bytes
    from meshplan.executor import attention

    counter = load("zigzag_bytes")
    seq, d = parts * 2 * 64, 128
    # the path the executor takes by default: the formula prices the reorder, and must change with the default
    counted = counter.count(seq, parts, parts - 1, heads, kv_heads, runs=attention.ZIGZAG_RUNS, d=d)
    fwd, bwd = zigzag_motion_bytes(seq / parts, parts, heads * d, kv_heads * d, 2)
    assert fwd + bwd == pytest.approx(sum(counted.bytes.values()), rel=0.01)


def test_zigzag_motion_is_priced_for_the_executor_only():
    """The data motion is meshplan's executor's (Stack.zigzag_motion): its sp and tsp steps pay it, its tp step
    and Megatron's context parallelism do not, nor a hybrid stack under TSP, whose shards are contiguous."""
    from meshplan.costmodel.options import CostOptions
    from meshplan.costmodel.step import estimate_step
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS
    from meshplan.topologies.cluster import load_cluster

    cluster = load_cluster("h200-8")
    model = PRESETS["dense-7b"]

    def motion(layout, stack):
        opts = CostOptions(mode="train", stack=stack)
        return estimate_step(model, parse_layout(layout), 16384, 1, opts, cluster).breakdown.get("shard_motion_s", 0.0)

    assert motion("sp=2", "meshplan") > 0 and motion("tsp=2", "meshplan") > 0
    assert motion("tp=2", "meshplan") == 0 and motion("sp=2", "megatron") == 0
    # TSP deals a hybrid stack's tokens contiguously (its Mamba layers pass state shard to shard): no reorder,
    # only TSP's own motion around its blocks (axes/tsp.motion_bytes; tests/test_tsp_motion.py)
    from meshplan.costmodel.axes.tsp import motion_bytes
    from meshplan.costmodel.device import TORCH_OP_HBM_FRACTION

    model = PRESETS["nemotron-3-nano"]
    blocks = model.block_invocations()
    own = sum(n * sum(motion_bytes(model, kind, 16384 / 2, 2, 2)) for kind, n in blocks)
    rate = cluster.gpu.hbm_bytes_per_s * TORCH_OP_HBM_FRACTION
    assert motion("tsp=2", "meshplan") == pytest.approx(own / rate, rel=1e-9)

"""Triton causal conv1d (interpreted without a GPU) against the reference and autograd; packing is
invisible: a packed row gives each sequence what it gets alone."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.kernels import conv1d
from meshplan.kernels.conv1d import causal_conv1d
from meshplan.kernels.packing import pack, unpack
from meshplan.kernels.reference import causal_conv1d_ref, ssd_scan_ref

# Outputs come from torch.empty poisoned with NaN: an element a kernel leaves unwritten fails.
pytestmark = pytest.mark.usefixtures("poison_empty")


def _inputs(b, t, c, k, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, c, generator=gen, dtype=dtype)
    w = torch.randn(c, k, generator=gen, dtype=dtype)
    bias = torch.randn(c, generator=gen, dtype=dtype)
    return x, w, bias


# The time-marching kernels with 16- and 18-row, 8-channel programs (several per sequence and per row;
# 18 rows stop in the middle of a four-row step; the 18-row backward loads its rows a step ahead), and the tiled ones:
# 8-step tiles, 2 steps — several
# backward programs, each walking two tiles (dw summed across both), in the one-pass backward
# (pre-activation rebuilt at each shift) and the two-pass one.
@pytest.mark.parametrize("bwd_tiles", [16, 18, (8, 2, False), (8, 2, True)])
@pytest.mark.parametrize("t, c, k", [(37, 20, 4), (130, 40, 3), (5, 7, 4), (41, 12, 6), (29, 9, 2)])
def test_forward_and_backward_match_reference(monkeypatch, bwd_tiles, t, c, k):
    if isinstance(bwd_tiles, int):
        monkeypatch.setattr(conv1d, "MARCH_ROWS", bwd_tiles)
        monkeypatch.setattr(conv1d, "MARCH_FWD_ROWS", bwd_tiles)
        monkeypatch.setattr(conv1d, "MARCH_PREFETCH", bwd_tiles == 18)
        monkeypatch.setattr(conv1d, "MARCH_CHANNELS", 8)
        monkeypatch.setattr(conv1d, "MARCH_FWD_CHANNELS", 8)
    else:
        monkeypatch.setattr(conv1d, "MARCH_FWD", False)
        monkeypatch.setattr(conv1d, "MARCH_BWD", False)
        monkeypatch.setattr(conv1d, "BWD_TILE_T", bwd_tiles[0])
        monkeypatch.setattr(conv1d, "BWD_STEPS", bwd_tiles[1])
        monkeypatch.setattr(conv1d, "TWO_PASS", bwd_tiles[2])
    x, w, bias = _inputs(2, t, c, k, seed=t)
    seq_idx = torch.tensor([[0] * (t // 3) + [1] * (t - t // 3), [0] * t])
    xs, ws, bs = (v.clone().requires_grad_(True) for v in (x, w, bias))
    xr, wr, br = (v.clone().requires_grad_(True) for v in (x, w, bias))
    out = causal_conv1d(xs, ws, bs, seq_idx)
    ref = causal_conv1d_ref(xr, wr, br, seq_idx=seq_idx)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    for mine, theirs in ((xs, xr), (ws, wr), (bs, br)):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-4)


def test_output_is_fully_written():
    x, w, bias = _inputs(1, 70, 33, 4, seed=3)
    out = causal_conv1d(x, w, bias)  # fresh torch.empty output: every element must come from the kernel
    torch.testing.assert_close(out, causal_conv1d_ref(x, w, bias), rtol=1e-5, atol=1e-5)


lengths = st.lists(st.one_of(st.just(1), st.integers(2, 9), st.integers(10, 40)), min_size=1, max_size=6)


@settings(max_examples=12, deadline=None)
@given(lengths, st.integers(0, 2**31 - 1))
def test_packing_is_invisible_to_conv_and_scan(lens, seed):
    gen = torch.Generator().manual_seed(seed)
    c, k, h, p, n = 6, 4, 2, 3, 4
    w = torch.randn(c, k, generator=gen)
    seqs = [torch.randn(m, c, generator=gen) for m in lens]
    packed = pack(seqs, row_len=max(40, max(lens)))
    conv = causal_conv1d(packed.rows, w, None, packed.seq_idx)
    for alone, got in zip(seqs, unpack(conv, packed)):
        torch.testing.assert_close(got, causal_conv1d_ref(alone[None], w)[0], rtol=1e-5, atol=1e-5)
    # The scan reference restarts at the same boundaries.
    xs = [torch.randn(m, h, p, generator=gen, dtype=torch.float64) for m in lens]
    dts = [torch.rand(m, h, generator=gen, dtype=torch.float64) * 0.3 for m in lens]
    Bs = [torch.randn(m, 1, n, generator=gen, dtype=torch.float64) for m in lens]
    A = -torch.rand(h, generator=gen, dtype=torch.float64)
    px, pdt, pB = pack(xs, packed.rows.shape[1]), pack(dts, packed.rows.shape[1]), pack(Bs, packed.rows.shape[1])
    y, _ = ssd_scan_ref(px.rows, pdt.rows, A, pB.rows, pB.rows, seq_idx=px.seq_idx)
    for i, got in enumerate(unpack(y, px)):
        alone, _ = ssd_scan_ref(xs[i][None], dts[i][None], A, Bs[i][None], Bs[i][None])
        torch.testing.assert_close(got, alone[0])


def test_pack_errors_and_round_trip():
    seqs = [torch.arange(n, dtype=torch.float32)[:, None] for n in (3, 5, 1, 4)]
    packed = pack(seqs, row_len=6)
    assert packed.rows.shape[0] == 3  # 5+1, 4, 3 — first fit, longest first
    for a, b in zip(seqs, unpack(packed.rows, packed)):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="lengths must be 1..row_len"):
        pack([torch.zeros(7, 1)], row_len=6)


def test_mamba2_block_on_packed_rows_equals_each_sequence_alone():
    from meshplan.executor.blocks import Mamba2Block
    from meshplan.models import mamba2

    torch.manual_seed(0)
    block = Mamba2Block(mamba2("m", 32, 1, 10, d_state=8, headdim=8, ngroups=2)).double()
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randn(m, 32, generator=gen, dtype=torch.float64) for m in (1, 17, 40, 5)]
    packed = pack(seqs, row_len=64)
    rows = packed.rows.clone().requires_grad_(True)
    out = block(rows, packed.seq_idx)
    for alone, got in zip(seqs, unpack(out, packed)):
        torch.testing.assert_close(got, block(alone[None])[0])
    # Gradients flow through the recomputing core with the boundaries in place.
    out.sum().backward()
    grads = unpack(rows.grad, packed)
    for alone, got in zip(seqs, grads):
        a = alone[None].clone().requires_grad_(True)
        block(a).sum().backward()
        torch.testing.assert_close(got, a.grad[0])


@pytest.mark.parametrize("c, k", [(20, 4), (300, 3), (7, 2)])
def test_conv_update_continues_the_full_conv(c, k):
    """Decoding token by token from an empty window gives the full causal conv's outputs, and the
    Triton update equals the reference update (output and state) at every step."""
    from meshplan.kernels.conv1d import causal_conv1d_update
    from meshplan.kernels.reference import causal_conv1d_update_ref

    x, w, bias = _inputs(2, 9, c, k, seed=c)
    full = causal_conv1d_ref(x, w, bias)
    state = torch.zeros(2, k - 1, c)
    state_ref = state.clone()
    for t in range(x.shape[1]):
        out = causal_conv1d_update(x[:, t], state, w, bias, bc=64)
        ref = causal_conv1d_update_ref(x[:, t], state_ref, w, bias)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state, state_ref)
        torch.testing.assert_close(out, full[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "k, start, rest, activation",
    [(4, 17, 13, "silu"), (3, 14, 16, "silu"), (2, 9, 21, None), (4, 27, 2, "silu"), (4, 29, 1, None)],
)
def test_initial_state_continues_a_sequence_shard(k, start, rest, activation):
    """A shard starting from the previous one's last K − 1 inputs (its conv tail, passed as the executor
    passes it: a transposed view of (b, K − 1, c)) equals that part of the whole sequence — shards
    shorter than the three rows the head kernels redo included — and so do its gradients: x's, the
    state's (the share of the earlier inputs that flows through this shard's outputs), the weight's and
    the bias's. x is a column slice of a wider tensor."""
    x, w, bias = _inputs(2, start + rest, 12, k, seed=start)
    wide = torch.cat([x, torch.randn(2, start + rest, 5)], dim=-1)
    g = torch.randn(2, rest, 12, generator=torch.Generator().manual_seed(rest))
    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, bias))
    ref = causal_conv1d_ref(xs, ws, bs, activation=activation)[:, start:]
    ref.backward(g)
    second = wide[:, start:].clone().requires_grad_(True)
    tail = x[:, start - (k - 1) : start].clone().requires_grad_(True)  # (b, K − 1, c)
    wk, bk = w.clone().requires_grad_(True), bias.clone().requires_grad_(True)
    out = causal_conv1d(second[..., :12], wk, bk, initial_state=tail.transpose(1, 2), activation=activation)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-5, atol=1e-5)
    out.backward(g)
    torch.testing.assert_close(second.grad[..., :12], xs.grad[:, start:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tail.grad, xs.grad[:, start - (k - 1) : start], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wk.grad, ws.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(bk.grad, bs.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k, c, prefetch", [(4, 12, False), (3, 16, True)])
def test_marching_backward_without_seq_idx_across_programs(monkeypatch, k, c, prefetch):
    """No seq_idx, several 16-row programs per row: every program starts three rows above its own (the
    pre-activation gradients it needs) and counts dw, db only for its own rows (channels a multiple of
    the program's 8, or not)."""
    monkeypatch.setattr(conv1d, "MARCH_ROWS", 16)
    monkeypatch.setattr(conv1d, "MARCH_FWD_ROWS", 16)
    monkeypatch.setattr(conv1d, "MARCH_PREFETCH", prefetch)
    monkeypatch.setattr(conv1d, "MARCH_CHANNELS", 8)
    monkeypatch.setattr(conv1d, "MARCH_FWD_CHANNELS", 8)
    x, w, bias = _inputs(2, 53, c, k, seed=k)
    xs, ws, bs = (v.clone().requires_grad_(True) for v in (x, w, bias))
    xr, wr, br = (v.clone().requires_grad_(True) for v in (x, w, bias))
    g = torch.randn(2, 53, c, generator=torch.Generator().manual_seed(9))
    causal_conv1d(xs, ws, bs).backward(g)
    causal_conv1d_ref(xr, wr, br).backward(g)
    for mine, theirs in ((xs, xr), (ws, wr), (bs, br)):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("with_seq_idx", [False, True])
def test_marching_kernels_read_a_column_slice_in_place(monkeypatch, with_seq_idx):
    """x a column slice of a wider tensor (Mamba-2's xBC of the in_proj output): the marching kernels
    read its rows where they lie (rows XT apart, not C) — forward, and backward into the wide tensor's
    gradient, zero outside the slice — as the reference does on a contiguous copy."""
    monkeypatch.setattr(conv1d, "MARCH_ROWS", 16)
    monkeypatch.setattr(conv1d, "MARCH_FWD_ROWS", 16)
    monkeypatch.setattr(conv1d, "MARCH_CHANNELS", 8)
    monkeypatch.setattr(conv1d, "MARCH_FWD_CHANNELS", 8)
    t, c, k = 45, 12, 4
    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(2, t, c + 9, generator=gen)
    w, bias = torch.randn(c, k, generator=gen), torch.randn(c, generator=gen)
    seq_idx = torch.tensor([[0] * 20 + [1] * (t - 20), [0] * t]) if with_seq_idx else None
    ws, wr = wide.clone().requires_grad_(True), wide.clone().requires_grad_(True)
    x = ws[:, :, 5 : 5 + c]
    assert x.stride(1) == c + 9 and conv1d._rows_as_read(x, True)[0] is x  # read in place, no copy
    out = causal_conv1d(x, w, bias, seq_idx)
    ref = causal_conv1d_ref(wr[:, :, 5 : 5 + c].contiguous(), w, bias, seq_idx=seq_idx)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn(out.shape, generator=gen)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(ws.grad, wr.grad, rtol=1e-4, atol=1e-4)
    assert ws.grad[:, :, :5].abs().max() == 0 and ws.grad[:, :, 5 + c :].abs().max() == 0


def _shard_with_docs(lengths_per_row, index, t, k, c, seed, dtype=torch.float32):
    """A whole sequence of (index + 1) · t tokens per row, packed from documents of the given lengths
    (one list a row), and shard `index` of it as the executor hands it to the conv: x a column slice of
    a wider tensor, the previous shard's last K − 1 inputs as a transposed (b, K − 1, c) view (zeros on
    the first shard), and the documents' ids (ShardDocs: the shard's seq_idx and the tail's ids)."""
    from meshplan.executor.layouts.mamba import ShardDocs

    total = (index + 1) * t
    assert all(sum(lens) == total for lens in lengths_per_row)
    packed = torch.stack([torch.repeat_interleave(torch.arange(len(ls)), torch.tensor(ls)) for ls in lengths_per_row])
    gen = torch.Generator().manual_seed(seed)
    b = len(lengths_per_row)
    x_all = torch.randn(b, total, c, generator=gen).to(dtype)
    w = torch.randn(c, k, generator=gen).to(dtype)
    bias = torch.randn(c, generator=gen).to(dtype)
    docs = ShardDocs.of(packed, index, t, k)
    start = index * t
    wide = torch.cat([torch.randn(b, t, 3, generator=gen).to(dtype), x_all[:, start:], torch.randn(b, t, 5)], -1)
    tail = x_all[:, start - (k - 1) : start] if index else torch.zeros(b, k - 1, c, dtype=dtype)
    return x_all, packed, wide, tail, w, bias, docs


# Documents on a shard of a packed sequence (lengths per batch row, summing to (index + 1) · t):
# - a document starting exactly at the shard's first token, and one continuing across the boundary;
# - the tail's last document (one token long) ended at the boundary; a document continuing one token
#   into the shard, then a new one; 300 channels: two head programs, the second partly masked;
# - K = 3: one-token documents in the tail and at the shard's head;
# - K = 2;
# - a shard of two tokens (shorter than the three rows the head kernels redo), single-token documents;
# - the first shard: the tail is zeros and belongs to no document (ids −1).
DOC_SHARDS = [
    (4, 12, 20, 1, [[20, 20], [15, 25]], "silu"),
    (4, 300, 16, 2, [[31, 1, 16], [30, 3, 15]], "silu"),
    (3, 7, 9, 1, [[8, 1, 9], [10, 1, 1, 6]], "silu"),
    (2, 33, 12, 1, [[12, 12], [5, 19]], None),
    (4, 12, 2, 3, [[7, 1], [5, 1, 1, 1]], "silu"),
    (4, 20, 10, 0, [[3, 7], [10]], None),
]


@pytest.mark.parametrize("k, c, t, index, lengths, activation", DOC_SHARDS)
def test_initial_state_with_packed_documents(k, c, t, index, lengths, activation):
    """The Triton conv of a sequence shard with packed documents and the previous shard's tail equals the
    reference as the executor calls it (initial_state with its columns' document ids) — output and the
    gradients of x, the tail, the weight and the bias — and both equal that part of the whole packed
    sequence's conv: a token sees the tail only where the tail's token is of its own document."""
    x_all, packed, wide, tail, w, bias, docs = _shard_with_docs(lengths, index, t, k, c, seed=t + c)
    start = index * t
    g = torch.randn(x_all.shape[0], t, c, generator=torch.Generator().manual_seed(k))
    # Ground truth: the whole sequence, only this shard's outputs carrying a gradient.
    xa, wa, ba = (v.clone().requires_grad_(True) for v in (x_all, w, bias))
    whole = causal_conv1d_ref(xa, wa, ba, seq_idx=packed, activation=activation)[:, start:]
    whole.backward(g)
    # The reference as the executor's CPU path calls it, and the Triton kernels.
    runs = []
    for conv in (causal_conv1d_ref, causal_conv1d):
        wd, st, wk, bk = (v.clone().requires_grad_(True) for v in (wide, tail, w, bias))
        out = conv(
            wd[..., 3 : 3 + c],
            wk,
            bk,
            seq_idx=docs.seq_idx,
            initial_state=st.transpose(1, 2),
            activation=activation,
            initial_seq_idx=docs.tail_idx,
        )
        out.backward(g)
        assert wd.grad[..., :3].abs().max() == 0 and wd.grad[..., 3 + c :].abs().max() == 0
        runs.append((out.detach(), wd.grad[..., 3 : 3 + c], st.grad, wk.grad, bk.grad))
    (ref, *ref_grads), (out, *grads) = runs
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, whole.detach(), rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    truth = [xa.grad[:, start:], xa.grad[:, start - (k - 1) : start] if index else None, wa.grad, ba.grad]
    for mine, theirs in zip(grads, truth):
        if theirs is not None:
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_initial_state_with_packed_documents_bf16():
    """bf16 inputs, as the executor runs on the GPU: the Triton conv of a shard with documents and a tail
    against the reference (both accumulate in fp32 and round once), to bf16's tolerance (2^-7 relative:
    a rounding step or two apart; dw and db sum over every token)."""
    x_all, packed, wide, tail, w, bias, docs = _shard_with_docs([[31, 1, 16], [30, 3, 15]], 2, 16, 4, 40, seed=7)
    x_all, wide, tail, w, bias = (v.bfloat16() for v in (x_all, wide, tail, w, bias))
    g = torch.randn(2, 16, 40, generator=torch.Generator().manual_seed(8)).bfloat16()
    results = []
    for conv in (causal_conv1d_ref, causal_conv1d):
        leaves = [v.clone().requires_grad_(True) for v in (wide[..., 3:43], tail, w, bias)]
        out = conv(
            leaves[0],
            *leaves[2:],
            seq_idx=docs.seq_idx,
            initial_state=leaves[1].transpose(1, 2),
            initial_seq_idx=docs.tail_idx,
        )
        out.backward(g)
        results.append((out.detach(), *(v.grad for v in leaves)))
    for mine, theirs in zip(*results):
        assert mine.dtype == theirs.dtype == torch.bfloat16
        torch.testing.assert_close(mine, theirs, rtol=2**-7, atol=2**-7 * theirs.abs().max().item())


@pytest.mark.parametrize(
    "k, t, c, seed", [(4, 9, 5, 0), (4, 20, 12, 1), (3, 6, 12, 2), (2, 11, 5, 3), (4, 2, 5, 4), (3, 1, 12, 5)]
)
def test_initial_state_with_arbitrary_sequence_ids(k, t, c, seed):
    """Sequence ids drawn token by token from a small alphabet (recurring out of order, which packing
    never makes) on the shard and on the tail's columns: the Triton conv with a tail still equals the
    reference, which lets a tap through wherever the two ids are equal — output and every gradient.
    (With packing's non-decreasing ids some of the head kernels' masks can never be false.)"""
    gen = torch.Generator().manual_seed(seed)
    b = 4
    seq_idx = torch.randint(0, 3, (b, t), generator=gen)
    state_idx = torch.randint(-1, 3, (b, k - 1), generator=gen)
    x, w, bias = _inputs(b, t, c, k, seed=seed % 1000)
    state = torch.randn(b, c, k - 1, generator=gen)
    g = torch.randn(b, t, c, generator=gen)
    results = []
    for conv in (causal_conv1d_ref, causal_conv1d):
        leaves = [v.clone().requires_grad_(True) for v in (x, state, w, bias)]
        out = conv(leaves[0], *leaves[2:], seq_idx=seq_idx, initial_state=leaves[1], initial_seq_idx=state_idx)
        out.backward(g)
        results.append((out.detach(), *(v.grad for v in leaves)))
    (ref, *ref_grads), (out, *grads) = results
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def _triton_conv(x, weight, bias=None, seq_idx=None, initial_state=None, activation="silu", initial_seq_idx=None):
    """causal_conv1d_ref's signature over the Triton conv (interpreted here)."""
    return causal_conv1d(x, weight, bias, seq_idx, activation, initial_state, initial_seq_idx)


def _run_packed_with_triton_conv(rank, world, layouts):
    from meshplan.executor import blocks
    from meshplan.executor.check_model import check_model
    from meshplan.layout import parse_layout
    from meshplan.models import mamba2

    blocks.causal_conv1d_ref = _triton_conv  # the executor's CPU conv, in this rank's process only
    model = mamba2("tiny-m2-lm", 32, 2, 100, d_state=8, headdim=8, ngroups=1)
    return [
        (text, mode, check_model(rank, world, model, parse_layout(text), 16, 2, mode, packed=True))
        for text in layouts
        for mode in ("train",)
    ]


def test_sequence_shards_with_packed_documents_run_the_triton_conv():
    """SP and TSP Mamba-2 shards of rows packing several documents (check_model.packed_documents: one
    continuing across the shard boundary and ending in the next shard, one starting exactly at it), with
    the executor's conv routed to the Triton kernels as it is on the GPU — the tail, its document ids
    and the tail's gradient sent back to the previous shard as the layouts pass them: the loss, every
    weight gradient and the prefill's outputs equal the single process's (which runs the Triton conv too,
    without a tail), to fp32 rounding."""
    from meshplan.executor.distributed import run_distributed

    per_rank = run_distributed(_run_packed_with_triton_conv, 2, ["sp=2", "tsp=2"], timeout_s=300)
    for i, (text, _, _) in enumerate(per_rank[0]):
        for r in (ranks[i][2] for ranks in per_rank):
            assert r.get("loss_err", 0.0) < 1e-6, (text, r)
            assert r["max_weight_grad_rel_err"] < 1e-5, (text, r)

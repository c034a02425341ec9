"""The plain-torch references agree with each other and with the definition of the recurrence."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.kernels.reference import causal_conv1d_ref, ssd_chunked_ref, ssd_scan_ref


def random_ssd(b, s, h, p, g, n, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, s, h, p, generator=gen, dtype=torch.float64)
    dt = torch.rand(b, s, h, generator=gen, dtype=torch.float64) * 0.2
    A = -torch.rand(h, generator=gen, dtype=torch.float64) * 4
    B = torch.randn(b, s, g, n, generator=gen, dtype=torch.float64)
    C = torch.randn(b, s, g, n, generator=gen, dtype=torch.float64)
    D = torch.randn(h, generator=gen, dtype=torch.float64)
    h0 = torch.randn(b, h, p, n, generator=gen, dtype=torch.float64)
    return x, dt, A, B, C, D, h0


@pytest.mark.parametrize("s, chunk", [(64, 16), (50, 16), (7, 8), (128, 64)])
def test_chunked_ssd_equals_the_recurrence(s, chunk):
    x, dt, A, B, C, D, h0 = random_ssd(2, s, 4, 3, 2, 5, seed=s)
    y_ref, st_ref = ssd_scan_ref(x, dt, A, B, C, D, initial_state=h0)
    y, st = ssd_chunked_ref(x, dt, A, B, C, D, initial_state=h0, chunk=chunk)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(st, st_ref, rtol=1e-10, atol=1e-10)


def test_scan_restarts_at_sequence_boundaries():
    x, dt, A, B, C, D, _ = random_ssd(1, 24, 2, 3, 1, 4, seed=1)
    seq_idx = torch.tensor([[0] * 10 + [1] * 9 + [2] * 5])
    packed, _ = ssd_scan_ref(x, dt, A, B, C, D, seq_idx=seq_idx)
    for lo, hi in ((0, 10), (10, 19), (19, 24)):
        alone, _ = ssd_scan_ref(x[:, lo:hi], dt[:, lo:hi], A, B[:, lo:hi], C[:, lo:hi], D)
        torch.testing.assert_close(packed[:, lo:hi], alone)


def test_conv_restarts_at_sequence_boundaries_and_continues_from_a_state():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 12, 6, generator=gen, dtype=torch.float64)
    w = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    seq_idx = torch.tensor([[0] * 5 + [1] * 7])
    packed = causal_conv1d_ref(x, w, seq_idx=seq_idx)
    torch.testing.assert_close(packed[:, 5:], causal_conv1d_ref(x[:, 5:], w))
    # A shard continues from the previous shard's last 3 inputs.
    whole = causal_conv1d_ref(x, w)
    tail = x[:, 5 - 3 : 5].transpose(1, 2)
    torch.testing.assert_close(causal_conv1d_ref(x[:, 5:], w, initial_state=tail), whole[:, 5:])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.one_of(st.just(1), st.integers(2, 9), st.integers(14, 40)), min_size=1, max_size=7),
    st.sampled_from([8, 16]),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_chunked_ssd_with_seq_idx_equals_the_recurrence(lengths, chunk, with_init, seed):
    """Packed rows, boundaries anywhere (on chunk edges, inside chunks, length-1 sequences)."""
    s = sum(lengths)
    x, dt, A, B, C, D, h0 = random_ssd(2, s, 4, 3, 2, 5, seed=seed % 1000)
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    seq_idx = torch.stack([ids, torch.zeros_like(ids)])  # row 1: one sequence
    init = h0 if with_init else None
    y_ref, st_ref = ssd_scan_ref(x, dt, A, B, C, D, initial_state=init, seq_idx=seq_idx)
    y, st_ = ssd_chunked_ref(x, dt, A, B, C, D, initial_state=init, chunk=chunk, seq_idx=seq_idx)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(st_, st_ref, rtol=1e-9, atol=1e-9)


@settings(max_examples=15, deadline=None)
@given(s=st.integers(1, 40), shards=st.integers(2, 4), seed=st.integers(0, 10_000))
def test_sequence_shards_scanned_once_and_corrected_equal_one_scan(s, shards, seed):
    """SP Mamba-2's one-scan shards (meshplan/executor/layouts/mamba.py): each shard scanned from a zero
    state, the entering states built from every shard's final state and decay (_entering), and the
    outputs corrected (_finish_shard, with out_proj the identity and the norm passing y through) give
    the outputs and final state of one scan over the whole sequence."""
    from meshplan.executor.layouts.mamba import _entering, _finish_shard

    gen = torch.Generator().manual_seed(seed)
    b, h, p, n, g = 2, 4, 3, 5, 2
    total = s * shards
    x = torch.randn(b, total, h, p, dtype=torch.float64, generator=gen)
    dt = torch.rand(b, total, h, dtype=torch.float64, generator=gen) * 0.5
    A = -torch.rand(h, dtype=torch.float64, generator=gen) - 0.1
    B = torch.randn(b, total, g, n, dtype=torch.float64, generator=gen)
    C = torch.randn(b, total, g, n, dtype=torch.float64, generator=gen)
    y_ref, final_ref = ssd_chunked_ref(x, dt, A, B, C, chunk=8)
    parts = [slice(i * s, (i + 1) * s) for i in range(shards)]
    scans = [ssd_chunked_ref(x[:, q], dt[:, q], A, B[:, q], C[:, q], chunk=8) for q in parts]
    gathered = torch.stack(
        [torch.cat([f.flatten(), (dt[:, q] * A).sum(1).flatten()]) for q, (_, f) in zip(parts, scans)]
    )
    dims = (h * p, g, n, h, p)
    identity = torch.eye(h * p, dtype=torch.float64)  # out_proj, and a norm that passes y through
    for r, q in enumerate(parts):
        E = _entering(gathered, r, (b, h, p, n), (b, h))
        y0, final0 = scans[r]
        y, final = _finish_shard(y0, C[:, q], dt[:, q], A, None, E, final0, None, identity, dims, lambda y, z, w: y)
        torch.testing.assert_close(y, y_ref[:, q].reshape(b, s, h * p), rtol=1e-9, atol=1e-9)
        if r == shards - 1:
            torch.testing.assert_close(final, final_ref, rtol=1e-9, atol=1e-9)

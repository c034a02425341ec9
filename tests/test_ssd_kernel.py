"""Triton chunked SSD (interpreted without a GPU): forward against the recurrence, backward against
autograd through the chunked reference (float64)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.kernels import launch, ssd
from meshplan.kernels.launch import token_rows
from meshplan.kernels.reference import ssd_chunked_ref, ssd_scan_ref
from meshplan.kernels.ssd_combined import ssd_chunked

# Outputs come from torch.empty poisoned with NaN: an element a kernel leaves unwritten fails.
pytestmark = pytest.mark.usefixtures("poison_empty")


# The output kernel with one head per program, and with all of a group's heads in one program's loop
# (the state passing then in 16 × 16 tiles: four a state at headdim and d_state 32; its weights two
# heads a program).
@pytest.mark.parametrize("split_target", [1024, 1])
@pytest.mark.parametrize(
    "s, h, p, g, n, chunk, with_init",
    [(64, 2, 16, 1, 16, 32, False), (50, 4, 16, 2, 16, 16, True), (96, 4, 32, 2, 32, 32, True)],
)
def test_triton_ssd_matches_the_recurrence(monkeypatch, split_target, s, h, p, g, n, chunk, with_init):
    monkeypatch.setattr(launch, "SPLIT_TARGET", split_target)
    if split_target == 1:
        monkeypatch.setattr(launch, "PASS_HEADDIM_BLOCK", 16)
        monkeypatch.setattr(launch, "PASS_STATE_BLOCK", 16)
        monkeypatch.setattr(ssd, "WEIGHTS_HEAD_BLOCK", 2)
    gen = torch.Generator().manual_seed(s + h)
    x = torch.randn(2, s, h, p, generator=gen)
    dt = torch.rand(2, s, h, generator=gen) * 0.2
    A = -torch.rand(h, generator=gen) * 3
    B = torch.randn(2, s, g, n, generator=gen)
    C = torch.randn(2, s, g, n, generator=gen)
    D = torch.randn(h, generator=gen)
    h0 = torch.randn(2, h, p, n, generator=gen) if with_init else None
    y_ref, st_ref = ssd_scan_ref(
        x.double(),
        dt.double(),
        A.double(),
        B.double(),
        C.double(),
        D.double(),
        initial_state=h0.double() if with_init else None,
    )
    y, st = ssd_chunked(x, dt, A, B, C, D, initial_state=h0, chunk=chunk)
    torch.testing.assert_close(y.double(), y_ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(st.double(), st_ref, rtol=2e-3, atol=2e-3)


@settings(max_examples=10, deadline=None)
@given(
    st.lists(st.one_of(st.just(1), st.integers(2, 9), st.integers(14, 40)), min_size=1, max_size=6),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_triton_ssd_respects_packed_boundaries(lengths, with_init, seed):
    s = sum(lengths)
    gen = torch.Generator().manual_seed(seed % 10_000)
    h, p, g, n = 2, 16, 1, 16
    x = torch.randn(1, s, h, p, generator=gen)
    dt = torch.rand(1, s, h, generator=gen) * 0.3
    A = -torch.rand(h, generator=gen) * 2
    B, C = torch.randn(1, s, g, n, generator=gen), torch.randn(1, s, g, n, generator=gen)
    h0 = torch.randn(1, h, p, n, generator=gen) if with_init else None
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]
    y_ref, st_ref = ssd_scan_ref(
        x.double(),
        dt.double(),
        A.double(),
        B.double(),
        C.double(),
        initial_state=h0.double() if with_init else None,
        seq_idx=seq_idx,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "SPLIT_TARGET", 1)  # both heads in one program's loop
        mp.setattr(ssd, "WEIGHTS_HEAD_BLOCK", 1)  # the passing's weights one head a program
        y, st_ = ssd_chunked(x, dt, A, B, C, initial_state=h0, chunk=16, seq_idx=seq_idx)
    torch.testing.assert_close(y.double(), y_ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(st_.double(), st_ref, rtol=2e-3, atol=2e-3)


def _grads(fn, ins, dy, dfinal, **kw):
    leaves = [t.clone().requires_grad_() if t is not None else None for t in ins]
    y, final = fn(*leaves[:6], initial_state=leaves[6], **kw)
    ((y * dy.to(y.dtype)).sum() + (final * dfinal.to(final.dtype)).sum()).backward()
    return [t.grad if t is not None else None for t in leaves]


def _check_backward(b, s, h, p, g, n, chunk, with_init, with_d, seed, seq_idx=None):
    gen = torch.Generator().manual_seed(seed)
    ins = [
        torch.randn(b, s, h, p, generator=gen),
        torch.rand(b, s, h, generator=gen) * 0.3,
        -torch.rand(h, generator=gen) * 3,
        torch.randn(b, s, g, n, generator=gen),
        torch.randn(b, s, g, n, generator=gen),
        torch.randn(h, generator=gen) if with_d else None,
        torch.randn(b, h, p, n, generator=gen) if with_init else None,
    ]
    dy, dfinal = torch.randn(b, s, h, p, generator=gen), torch.randn(b, h, p, n, generator=gen)
    want = _grads(
        ssd_chunked_ref, [t.double() if t is not None else None for t in ins], dy, dfinal, chunk=chunk, seq_idx=seq_idx
    )
    got = _grads(ssd_chunked, ins, dy, dfinal, chunk=chunk, seq_idx=seq_idx)
    for name, w, o in zip(["x", "dt", "A", "B", "C", "D", "initial_state"], want, got):
        assert (w is None) == (o is None), name
        if w is not None:
            # The floor: where the exact gradient is 0 (dA of a one-token sequence) the kernel's fp32 sums
            # of terms of order 10 leave ~1e-8.
            torch.testing.assert_close(o.double(), w, rtol=1e-4, atol=max(1e-4 * float(w.abs().max()), 1e-6), msg=name)


# One program per group (all heads), d_state in blocks of 16, the state passings in 16 × 16 tiles (several
# a state, masked where headdim or d_state is off the block); and one per head with the launch defaults.
@pytest.mark.parametrize("split_target, state_block, pass_block", [(1, 16, 16), (1024, 64, None)])
@pytest.mark.parametrize(
    "s, h, p, g, n, chunk, with_init, with_d",
    [
        (64, 2, 16, 1, 16, 32, False, True),
        (50, 4, 16, 2, 16, 16, True, True),
        (96, 4, 32, 1, 32, 32, True, False),
        # headdim and d_state off the blocks: masked tiles
        (40, 2, 24, 1, 20, 16, True, True),
    ],
)
def test_triton_ssd_backward_matches_autograd_of_the_reference(
    monkeypatch, split_target, state_block, pass_block, s, h, p, g, n, chunk, with_init, with_d
):
    monkeypatch.setattr(launch, "SPLIT_TARGET", split_target)
    monkeypatch.setattr(launch, "BWD_STATE_BLOCK", state_block)
    if pass_block:
        monkeypatch.setattr(launch, "PASS_HEADDIM_BLOCK", pass_block)
        monkeypatch.setattr(launch, "PASS_STATE_BLOCK", pass_block)
        monkeypatch.setattr(ssd, "WEIGHTS_HEAD_BLOCK", 2)
    _check_backward(2, s, h, p, g, n, chunk, with_init, with_d, seed=s + h)


@settings(max_examples=6, deadline=None)
@given(
    st.lists(st.one_of(st.just(1), st.integers(2, 9), st.integers(14, 40)), min_size=1, max_size=5),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_triton_ssd_backward_respects_packed_boundaries(lengths, with_init, seed):
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "SPLIT_TARGET", 1)  # both heads in one program's loop
        _check_backward(1, sum(lengths), 2, 16, 1, 16, 16, with_init, True, seed % 10_000, seq_idx=seq_idx)


def test_triton_ssd_reads_column_slices_in_place():
    """x, B and C as the executor passes them — column slices of one conv output, tokens strided
    by its full width — give the same outputs and gradients as contiguous copies."""
    gen = torch.Generator().manual_seed(7)
    b, s, h, p, g, n = 2, 48, 2, 16, 1, 16  # a whole number of chunks: no padded copy
    xbc = torch.randn(b, s, h * p + 2 * g * n + 5, generator=gen, requires_grad=True)
    assert token_rows(xbc[..., : h * p].reshape(b, s, h, p))[1] == h * p + 2 * g * n + 5
    dt = torch.rand(b, s, h, generator=gen) * 0.3
    A = -torch.rand(h, generator=gen) * 2
    dy = torch.randn(b, s, h, p, generator=gen)

    def run(contiguous):
        x, B, C, _ = xbc.split([h * p, g * n, g * n, 5], dim=-1)
        x, B, C = x.reshape(b, s, h, p), B.reshape(b, s, g, n), C.reshape(b, s, g, n)
        if contiguous:
            x, B, C = x.contiguous(), B.contiguous(), C.contiguous()
        y, final = ssd_chunked(x, dt, A, B, C, chunk=16)
        (grad,) = torch.autograd.grad((y * dy).sum() + final.sum(), xbc)
        return y, final, grad

    for got, want in zip(run(False), run(True)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _segmented(mp, per_segment: int):
    """Passings cut into as many segments as leave each `per_segment` chunks or more, whatever the
    programs (segments of ⌈chunks / segments⌉, the last shorter where that does not divide)."""
    mp.setattr(launch, "PASS_PROGRAM_TARGET", 10**6)
    mp.setattr(launch, "PASS_SEGMENT_BELOW", 10**9)
    mp.setattr(launch, "PASS_SEGMENT_BACKWARD_BELOW", 10**9)
    mp.setattr(launch, "PASS_MIN_SEGMENT_CHUNKS", per_segment)


def test_pass_segments_fill_the_target_in_whole_chunks(monkeypatch):
    monkeypatch.setattr(launch, "PASS_PROGRAM_TARGET", 512)
    monkeypatch.setattr(launch, "PASS_SEGMENT_BELOW", 10**9)
    monkeypatch.setattr(launch, "PASS_MIN_SEGMENT_CHUNKS", 8)
    assert launch.pass_segments(4, 80, 64, 128, 64) == (1, 64)  # 640 programs: no cut
    assert launch.pass_segments(1, 80, 64, 128, 256) == (4, 64)  # 160 programs → 640
    assert launch.pass_segments(1, 40, 64, 128, 256) == (7, 37)  # 80 → 560; 7 segments of 37, the last 34
    assert launch.pass_segments(1, 2, 64, 128, 20) == (2, 10)  # at least 8 chunks a segment
    assert launch.pass_segments(1, 2, 64, 128, 9) == (1, 9)


# 8 chunks in 8, 4 or 2 segments; 7 in 7, 3 (of 3, 3, 1) or 2 (4, 3); with and without an initial
# state; the output kernel one head a program and a group's heads in its loop.
@pytest.mark.parametrize("per_segment, split_target", [(1, 1024), (2, 1), (3, 1024)])
@pytest.mark.parametrize(
    "s, h, p, g, n, chunk, with_init", [(64, 2, 16, 1, 16, 8, False), (100, 4, 16, 2, 16, 16, True)]
)
def test_segmented_passing_matches_the_recurrence(
    monkeypatch, per_segment, split_target, s, h, p, g, n, chunk, with_init
):
    _segmented(monkeypatch, per_segment)
    monkeypatch.setattr(launch, "SPLIT_TARGET", split_target)
    assert launch.pass_segments(2, h, p, n, -(-s // chunk))[0] > 1
    gen = torch.Generator().manual_seed(s + per_segment)
    x = torch.randn(2, s, h, p, generator=gen)
    dt = torch.rand(2, s, h, generator=gen) * 0.2
    A = -torch.rand(h, generator=gen) * 3
    B, C = torch.randn(2, s, g, n, generator=gen), torch.randn(2, s, g, n, generator=gen)
    h0 = torch.randn(2, h, p, n, generator=gen) if with_init else None
    y_ref, st_ref = ssd_scan_ref(
        x.double(), dt.double(), A.double(), B.double(), C.double(), initial_state=h0.double() if with_init else None
    )
    y, st_ = ssd_chunked(x, dt, A, B, C, initial_state=h0, chunk=chunk)
    torch.testing.assert_close(y.double(), y_ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(st_.double(), st_ref, rtol=2e-3, atol=2e-3)


# 4 chunks in 4 or 2 segments, 7 in 7 or 3 (3, 3, 1), 5 in 5 or 2 (3, 2); and the forward's passing
# alone segmented.
@pytest.mark.parametrize("per_segment, state_block, backward_too", [(1, 16, True), (2, 64, True), (2, 64, False)])
@pytest.mark.parametrize(
    "s, h, p, g, n, chunk, with_init, with_d",
    [(64, 2, 16, 1, 16, 16, True, True), (100, 4, 16, 2, 16, 16, False, True), (40, 2, 24, 1, 20, 8, True, False)],
)
def test_segmented_backward_matches_autograd_of_the_reference(
    monkeypatch, per_segment, state_block, backward_too, s, h, p, g, n, chunk, with_init, with_d
):
    _segmented(monkeypatch, per_segment)
    monkeypatch.setattr(launch, "PASS_SEGMENT_BACKWARD_BELOW", 10**9 if backward_too else 0)
    monkeypatch.setattr(launch, "BWD_STATE_BLOCK", state_block)
    assert launch.pass_segments(2, h, p, n, -(-s // chunk))[0] > 1
    cuts = []  # (backward, segments) of each passing launched: the backward's by its own threshold

    def spy(*args, **kwargs):
        got = pass_segments(*args, **kwargs)
        cuts.append((bool(args[5] if len(args) > 5 else kwargs.get("backward", False)), got[0]))
        return got

    pass_segments = launch.pass_segments
    monkeypatch.setattr(launch, "pass_segments", spy)
    _check_backward(2, s, h, p, g, n, chunk, with_init, with_d, seed=s + per_segment)
    backward = [seg for bwd, seg in cuts if bwd]
    assert len(backward) >= 2 and all((seg > 1) == backward_too for seg in backward)
    assert all(seg > 1 for bwd, seg in cuts if not bwd)


@settings(max_examples=6, deadline=None)
@given(
    st.lists(st.one_of(st.just(1), st.integers(2, 9), st.integers(14, 40)), min_size=1, max_size=5),
    st.integers(1, 3),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_segmented_passing_respects_packed_boundaries(lengths, per_segment, with_init, seed):
    """A segment's start or a boundary inside it: no state crosses a packed sequence's boundary,
    forward or backward."""
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]
    with pytest.MonkeyPatch.context() as mp:
        _segmented(mp, per_segment)
        _check_backward(1, sum(lengths), 2, 16, 1, 16, 8, with_init, True, seed % 10_000, seq_idx=seq_idx)


def test_committed_segment_thresholds_cut_only_the_few_head_rows():
    """The committed settings, as the H100 sweep chose them (benchmarks/results/ssd-segments-h100.json):
    16K tokens × 12 heads (24 programs) cut in both directions, × 24 heads (48) the forward alone, 40 and
    80 heads whole."""
    chunks = 16384 // launch.SSD_CHUNK
    assert launch.pass_segments(1, 12, 64, 128, chunks) == launch.pass_segments(1, 12, 64, 128, chunks, True)
    assert launch.pass_segments(1, 12, 64, 128, chunks)[0] == 11  # 24 programs → 264
    assert launch.pass_segments(1, 24, 64, 128, chunks) == (6, 43)
    assert launch.pass_segments(1, 24, 64, 128, chunks, backward=True) == (1, chunks)
    for heads in (40, 80):
        assert launch.pass_segments(1, heads, 64, 128, chunks) == (1, chunks)

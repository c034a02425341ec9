"""int8 kernels (under TRITON_INTERPRET=1 without a GPU: tests/conftest.py) against the torch reference."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.kernels.quant import dequantize_int8, quantize_int8
from meshplan.kernels.reference import dequantize_int8_ref, quantize_int8_ref

# Outputs come from torch.empty poisoned with NaN: an element a kernel leaves unwritten fails.
pytestmark = pytest.mark.usefixtures("poison_empty")


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 40), st.sampled_from([32, 128]), st.floats(1e-3, 1e3), st.integers(0, 2**31 - 1))
def test_quantize_matches_reference(groups, group, magnitude, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(groups * group, generator=gen) * magnitude
    x[:group] = 0.0  # an all-zero group keeps scale 1
    q, s = quantize_int8(x, group)
    q_ref, s_ref = quantize_int8_ref(x, group)
    torch.testing.assert_close(s, s_ref)
    assert (q.to(torch.int16) - q_ref.to(torch.int16)).abs().max() <= 1  # rounding of exact halves may differ
    # Round trip: every element within half a quantization step of its group.
    back = dequantize_int8(q, s, group)
    err = (back - x).reshape(-1, group).abs().amax(1)
    assert torch.all(err <= s * 0.5 * (1 + 1e-4))  # half a step, and fp32 rounding of x / s and q·s


def test_dequantize_writes_every_element():
    q = torch.randint(-127, 128, (5 * 128,), dtype=torch.int8)
    s = torch.rand(5) + 0.1
    out = dequantize_int8(q, s, 128, torch.float32)
    torch.testing.assert_close(out, dequantize_int8_ref(q, s, 128))
    assert torch.isfinite(out).all()


def test_quantize_rejects_partial_groups():
    with pytest.raises(ValueError, match="multiple of the group size"):
        quantize_int8(torch.randn(100), 128)


@pytest.mark.parametrize("parts, groups_per_part", [(2, 3), (4, 1), (3, 17)])
def test_packed_wire_format_matches_reference(parts, groups_per_part):
    """The packed quantize, the dequantize-sum-requantize of n packed copies, and the packed
    dequantize equal their torch references byte for byte (values and scales)."""
    from meshplan.kernels.quant import dequant_sum, dequant_sum_requant, dequantize_packed, quantize_int8_packed
    from meshplan.kernels.reference import (
        dequant_sum_ref,
        dequant_sum_requant_ref,
        dequantize_packed_ref,
        quantize_int8_packed_ref,
    )

    gen = torch.Generator().manual_seed(parts * 100 + groups_per_part)
    x = torch.randn(parts * groups_per_part * 128, generator=gen) * 3
    x[:128] = 0  # an all-zero group keeps scale 1
    buf = quantize_int8_packed(x, parts)
    assert torch.equal(buf, quantize_int8_packed_ref(x, parts))
    copies = torch.stack(
        [quantize_int8_packed(torch.randn(groups_per_part * 128, generator=gen), 1)[0] for _ in range(parts)]
    )
    assert torch.equal(dequant_sum_requant(copies), dequant_sum_requant_ref(copies))
    torch.testing.assert_close(dequant_sum(copies), dequant_sum_ref(copies), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dequantize_packed(buf), dequantize_packed_ref(buf))
    torch.testing.assert_close(dequantize_packed(buf), x, rtol=0, atol=float(x.abs().max()) / 127)


@pytest.mark.parametrize("world, groups, programs", [(1, 3, None), (2, 5, 2), (3, 2, None), (8, 1, 1)])
def test_peer_sum_matches_reference(world, groups, programs):
    """The one-shot sum over separate slots (each rank's packed row where it lies, after the signal
    words, in a slot larger than the row, as a peer-mapped slot is) equals the reference sum of the
    stacked rows; the bytes past the row are never read (they hold NaN-making garbage); fewer programs
    than tiles loop over them."""
    from meshplan.kernels.quant import PEER_HEADER, dequant_sum_peers, quantize_int8_packed
    from meshplan.kernels.reference import dequant_sum_ref, packed_chunk_bytes

    gen = torch.Generator().manual_seed(world * 10 + groups)
    numel = groups * 128
    nbytes = packed_chunk_bytes(numel)
    slots = []
    for _ in range(world):
        slot = torch.full((PEER_HEADER + nbytes + 300,), 255, dtype=torch.uint8)  # 0xFF past the row: NaN scales
        quantize_int8_packed(torch.randn(numel, generator=gen) * 5, 1, out=slot[PEER_HEADER : PEER_HEADER + nbytes])
        slots.append(slot)
    got = dequant_sum_peers(slots, numel, groups_per_program=2, programs=programs)
    want = dequant_sum_ref(torch.stack([s[PEER_HEADER : PEER_HEADER + nbytes] for s in slots]))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_peer_sum_signals_each_peer_and_reads_after_theirs():
    """With sync, rank 1 of 3 stores the epoch in word 1 of each peer's slot, leaves its own slot's
    words alone, and (its peers' words already at the epoch, as after their signals) sums."""
    from meshplan.kernels.quant import PEER_HEADER, dequant_sum_peers, quantize_int8_packed

    numel, epoch = 256, 7
    slots = []
    for r in range(3):
        slot = torch.zeros(PEER_HEADER + 264, dtype=torch.uint8)
        quantize_int8_packed(torch.full((numel,), float(r + 1)), 1, out=slot[PEER_HEADER:])
        slots.append(slot)
    words = [s[:PEER_HEADER].view(torch.int32) for s in slots]
    words[1][0], words[1][2] = epoch, epoch + 3  # rank 0 and rank 2 have signalled (rank 2 further on)
    got = dequant_sum_peers(slots, numel, rank=1, epoch=epoch, sync=True, programs=1)
    torch.testing.assert_close(got, torch.full((numel,), 6.0))
    assert words[0][1] == epoch and words[2][1] == epoch
    assert words[1].tolist()[:3] == [epoch, 0, epoch + 3]


def test_peer_sum_rejects_bad_input():
    from meshplan.kernels.quant import dequant_sum_peers

    with pytest.raises(ValueError, match="between 1 and 8"):
        dequant_sum_peers([torch.zeros(260, dtype=torch.uint8)] * 9, 128)
    with pytest.raises(ValueError, match="must hold 128 \\+ 132 bytes"):
        dequant_sum_peers([torch.zeros(200, dtype=torch.uint8)], 128)
    with pytest.raises(ValueError, match="multiple of the group size"):
        dequant_sum_peers([torch.zeros(300, dtype=torch.uint8)], 100)


def test_quantized_all_reduce_names_its_transports():
    from meshplan.executor.comm import quantized_all_reduce

    with pytest.raises(ValueError, match="transport 'nvlink'; choose one of auto, nccl, peer"):
        quantized_all_reduce(None, torch.zeros(128), "tp", transport="nvlink")


def test_auto_transport_takes_the_peer_path_for_two_ranks_of_one_host(monkeypatch):
    from meshplan.executor import peer

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    assert peer.wanted(object(), [0, 1]) and peer.wanted(object(), [8, 12])
    assert not peer.wanted(object(), [7, 8])  # two hosts
    assert not peer.wanted(object(), [0, 1, 2, 3])  # four ranks: NCCL's path (the peer one is unmeasured there)
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")  # a host without peer access
    assert not peer.wanted(object(), [0, 1])

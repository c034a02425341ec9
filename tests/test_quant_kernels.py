"""int8 kernels (under TRITON_INTERPRET=1 without a GPU: tests/conftest.py) against the torch reference."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from meshplan.kernels.quant import dequantize_int8, quantize_int8
from meshplan.kernels.reference import dequantize_int8_ref, quantize_int8_ref

# Outputs come from torch.empty poisoned with NaN: an element a kernel leaves unwritten fails.
pytestmark = pytest.mark.usefixtures("poison_empty")


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 40), st.sampled_from([32, 128]), st.floats(1e-3, 1e3), st.integers(0, 2 ** 31 - 1))
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
    from meshplan.kernels.reference import (dequant_sum_ref, dequant_sum_requant_ref, dequantize_packed_ref,
                                            quantize_int8_packed_ref)

    gen = torch.Generator().manual_seed(parts * 100 + groups_per_part)
    x = torch.randn(parts * groups_per_part * 128, generator=gen) * 3
    x[:128] = 0  # an all-zero group keeps scale 1
    buf = quantize_int8_packed(x, parts)
    assert torch.equal(buf, quantize_int8_packed_ref(x, parts))
    copies = torch.stack([quantize_int8_packed(torch.randn(groups_per_part * 128, generator=gen), 1)[0]
                          for _ in range(parts)])
    assert torch.equal(dequant_sum_requant(copies), dequant_sum_requant_ref(copies))
    torch.testing.assert_close(dequant_sum(copies), dequant_sum_ref(copies), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dequantize_packed(buf), dequantize_packed_ref(buf))
    torch.testing.assert_close(dequantize_packed(buf), x, rtol=0, atol=float(x.abs().max()) / 127)

"""Triton selective state update against the reference, and against the scan: decoding token by
token from a prefilled state gives what the full scan gives."""

import pytest
import torch

from meshplan.kernels.reference import selective_state_update_ref, ssd_scan_ref
from meshplan.kernels.state_update import selective_state_update

# Outputs come from torch.empty poisoned with NaN: an element a kernel leaves unwritten fails.
pytestmark = pytest.mark.usefixtures("poison_empty")


def test_state_update_matches_reference_and_continues_the_scan():
    gen = torch.Generator().manual_seed(0)
    b, h, p, g, n, s = 2, 4, 8, 2, 16, 12
    x = torch.randn(b, s, h, p, generator=gen)
    dt = torch.rand(b, s, h, generator=gen) * 0.3
    A = -torch.rand(h, generator=gen) * 2
    B = torch.randn(b, s, g, n, generator=gen)
    C = torch.randn(b, s, g, n, generator=gen)
    D = torch.randn(h, generator=gen)
    y_full, _ = ssd_scan_ref(x, dt, A, B, C, D)
    _, state = ssd_scan_ref(x[:, :8], dt[:, :8], A, B[:, :8], C[:, :8], D)
    mine, ref = state.clone().contiguous(), state.clone()
    for t in range(8, s):
        y_k = selective_state_update(mine, x[:, t], dt[:, t], A, B[:, t], C[:, t], D)
        y_r = selective_state_update_ref(ref, x[:, t], dt[:, t], A, B[:, t], C[:, t], D)
        torch.testing.assert_close(y_k, y_r, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y_k, y_full[:, t], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)

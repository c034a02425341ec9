"""Triton chunked SSD forward (interpreted without a GPU) against the recurrence."""

import pytest
import torch

from meshplan.kernels.reference import ssd_scan_ref
from meshplan.kernels.ssd import ssd_chunked


@pytest.mark.parametrize("s, h, p, g, n, chunk, with_init", [(64, 2, 16, 1, 16, 32, False), (50, 4, 16, 2, 16, 16, True),
                                                              (96, 2, 32, 2, 32, 32, True)])
def test_triton_ssd_matches_the_recurrence(s, h, p, g, n, chunk, with_init):
    gen = torch.Generator().manual_seed(s + h)
    x = torch.randn(2, s, h, p, generator=gen)
    dt = torch.rand(2, s, h, generator=gen) * 0.2
    A = -torch.rand(h, generator=gen) * 3
    B = torch.randn(2, s, g, n, generator=gen)
    C = torch.randn(2, s, g, n, generator=gen)
    D = torch.randn(h, generator=gen)
    h0 = torch.randn(2, h, p, n, generator=gen) if with_init else None
    y_ref, st_ref = ssd_scan_ref(x.double(), dt.double(), A.double(), B.double(), C.double(), D.double(),
                                 initial_state=h0.double() if with_init else None)
    y, st = ssd_chunked(x, dt, A, B, C, D, initial_state=h0, chunk=chunk)
    torch.testing.assert_close(y.double(), y_ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(st.double(), st_ref, rtol=2e-3, atol=2e-3)

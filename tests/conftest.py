"""Session-wide test settings: without a GPU, Triton kernels run under its interpreter. This must be
set before anything imports triton, so it lives here rather than in a test module."""

import os

if not os.environ.get("CUDA_VISIBLE_DEVICES_FOR_TESTS"):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_gpu = False
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture
def poison_empty(monkeypatch):
    """torch.empty / torch.empty_like hand out NaN-filled floats and 0x5A-filled integers, so a kernel
    that leaves an element of its output unwritten fails the comparison that follows."""
    import torch

    real_empty, real_like = torch.empty, torch.empty_like

    def poisoned(t):
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(0x5A)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poisoned(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poisoned(real_like(*a, **k)))

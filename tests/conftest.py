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

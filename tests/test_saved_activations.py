"""What autograd really saves (saved_tensors_hooks, by storage, parameters excluded) against the
memory model's activation term, for the plain dense and Mamba-2 layers the executor runs."""

from dataclasses import replace

import pytest
import torch

from meshplan.costmodel.memory import saved_activation_bytes
from meshplan.costmodel.options import MemoryOptions
from meshplan.executor.blocks import Stack
from meshplan.executor.saved import count_saved_bytes
from meshplan.layout import Layout
from meshplan.models import dense, mamba2

_GQA = dense("gqa", 256, 2, 8, 2, 768, 1000)
MODELS = {
    "dense-mha": dense("mha", 256, 2, 8, 8, 1024, 1000),
    "dense-gqa": _GQA,
    # Qwen3's per-head query/key norms: the core keeps their outputs, they keep the projection's q and k
    "dense-qk-norm": replace(_GQA, name="qk-norm", attention=replace(_GQA.attention, qk_norm=2 * 32)),
    "mamba2": mamba2("m2", 128, 2, 1000, d_state=16, headdim=16, ngroups=2),
}
CASES = [
    (name, rc, flash)
    for name in ("dense-mha", "dense-gqa", "dense-qk-norm")
    for rc, flash in [("none", True), ("none", False), ("selective", False), ("full", True)]
] + [("mamba2", "none", True), ("mamba2", "full", True)]


@pytest.mark.parametrize("name, recompute, flash", CASES)
def test_saved_bytes_match_activation_term(name, recompute, flash):
    torch.manual_seed(0)
    model = MODELS[name]
    batch, seq = 2, 64
    stack = Stack(model, model.layers, recompute=recompute, flash=flash)
    x = torch.randn(batch, seq, model.d_model, requires_grad=True)
    with count_saved_bytes(list(stack.parameters())) as counted:
        y = stack(x)
    y.square().mean().backward()  # the graph really is used: backward must run from what was saved
    opts = MemoryOptions(act_dtype="fp32", recompute=recompute, flash_attention=flash)
    predicted, _ = saved_activation_bytes(model, Layout(), seq, batch, opts)
    assert counted["bytes"] > 0
    assert abs(counted["bytes"] - predicted) / predicted < 0.05, (counted, predicted)
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_mamba2_recompute_gives_the_same_gradients_as_plain_autograd():
    import torch.nn.functional as F

    from meshplan.executor.blocks import Mamba2Block, mamba2_mixer

    torch.manual_seed(0)
    block = Mamba2Block(MODELS["mamba2"]).double()
    x = torch.randn(2, 32, 128, dtype=torch.float64, requires_grad=True)
    block(x).sum().backward()
    fused = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    block.zero_grad()
    x2 = x.detach().clone().requires_grad_(True)
    zxbcdt = F.linear(block.norm(x2), block.in_proj)
    out, _ = mamba2_mixer(
        zxbcdt,
        block.conv_w,
        block.conv_b,
        block.dt_bias,
        block.a_log,
        block.d_skip,
        block.norm_w,
        block.out_proj,
        block.dims,
    )
    (x2 + out).sum().backward()
    plain = [p.grad for p in block.parameters()] + [x2.grad]
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b)

"""A layer built from its sublayers (meshplan/executor/layouts/layer.py), on one rank: the Layer of a dense
reference layer (attention, then the MLP) and of a Mamba-2 one (its mixer) computes the plain reference
block — output, input and weight gradients, and a decoded token after a prefill — and its `index` names
every reference weight once. The sharded forms on 2 and 4 ranks are checked in
tests/test_executor_distributed.py."""

import pytest
import torch

from meshplan.executor.blocks import Stack
from meshplan.executor.comm import Mesh
from meshplan.executor.layouts.layer import Layer, build_layer
from meshplan.executor.parallelize import keep_caches
from meshplan.layout import Layout
from meshplan.models import dense, mamba2

MODELS = {
    "dense": dense("tiny-gqa", 64, 1, 8, 4, 128, 100),
    "mamba2": mamba2("tiny-m2", 32, 1, 100, d_state=8, headdim=8, ngroups=1),
}
SLOTS = {"dense": ("attention", "mlp"), "mamba2": ("mixer",)}


@pytest.mark.parametrize("family", list(MODELS))
def test_one_rank_layer_is_the_reference_layer(family):
    torch.manual_seed(0)
    ref = Stack(MODELS[family], 1).double().layers[0]
    seq = 16
    layer = build_layer(ref, Mesh(Layout(), 0, 1, {}), seq, torch.arange(seq), attention_only=family == "dense")
    assert isinstance(layer, Layer) and layer.slots == SLOTS[family]
    # Every local weight is one whole reference weight, each named once.
    refs = dict(ref.named_parameters())
    assert sorted(r for r, _, _ in layer.index.values()) == sorted(refs)
    assert {n for n, _ in layer.named_parameters()} == set(layer.index)

    x = torch.randn(2, seq + 1, MODELS[family].d_model, dtype=torch.float64)
    xs, xr = x[:, :seq].clone().requires_grad_(), x[:, :seq].clone().requires_grad_()
    y, y_ref = layer(xs), ref(xr)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    (y * y).sum().backward()
    (y_ref * y_ref).sum().backward()
    torch.testing.assert_close(xs.grad, xr.grad, rtol=0, atol=1e-11)
    params = dict(layer.named_parameters())
    for local, (ref_name, _, _) in layer.index.items():
        torch.testing.assert_close(params[local].grad, refs[ref_name].grad, rtol=0, atol=1e-10)

    # Prefill seq tokens, then decode the next one: the reference's output at that position.
    keep_caches([layer], True)
    with torch.no_grad():
        layer(x[:, :seq])
        keep_caches([layer], False)
        token = layer.decode(x[:, seq:])
        torch.testing.assert_close(token, ref(x)[:, seq:], rtol=0, atol=1e-12)

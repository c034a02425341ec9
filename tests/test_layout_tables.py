"""The executor's weight-split tables (meshplan/executor/layouts/splits.py) against the cost model's
`Sharding`: the elements a rank holds of every weight, summed over the model, equal memory.local_params
for each layout the tables serve — so that what the executor keeps is what the memory model counts.
(That each table cuts the right rows is checked by the distributed tests, which match the sharded
modules against the single process.)"""

from dataclasses import replace

import pytest
import torch

from meshplan.costmodel.axes import sharding_for
from meshplan.costmodel.memory import local_params
from meshplan.costmodel.options import CostOptions
from meshplan.executor.blocks import DenseLayer
from meshplan.executor.layouts.splits import WHOLE, contiguous_splits, dense_splits, mamba2_splits, vocab_split
from meshplan.executor.layouts.tsp_mamba import SPLIT
from meshplan.executor.model import CausalLM
from meshplan.layout import parse_layout
from meshplan.models import dense, mamba2

_QK = dense("qk-norm", 64, 2, 8, 2, 192, 96)
DENSE_MODELS = [
    dense("mha", 64, 2, 8, 8, 256, 96),
    dense("gqa", 64, 2, 8, 2, 192, 96),
    dense("gelu", 64, 2, 4, 4, 256, 96, gated=False),
    dense("tied", 64, 2, 8, 4, 128, 96, tied=True),
    replace(_QK, attention=replace(_QK.attention, qk_norm=2 * 8)),  # Qwen3's per-head query/key norms, whole
]
MAMBA_MODELS = [
    mamba2("m2-one-group", 64, 2, 96, d_state=16, headdim=16, ngroups=1),
    mamba2("m2-four-groups", 64, 2, 96, d_state=16, headdim=16, ngroups=4),
]


def _layer_table(layer, layout):
    """(the layer's table, the axis degree) as the executor picks them for `layout`."""
    if isinstance(layer, DenseLayer):
        degree = layout.tsp if layout.tsp > 1 else layout.tp
        q_w, kv_w = layer.heads * layer.head_dim, layer.kv_heads * layer.head_dim
        return dense_splits(q_w, kv_w, layer.w_down.shape[1], layer.gated, layer.qk_norms is not None), degree
    if layout.tsp > 1:
        shapes = {name: tuple(getattr(layer, name).shape) for name, _ in SPLIT}
        return {
            "norm.weight": WHOLE,
            **contiguous_splits(shapes, dict(SPLIT)),
        }, layout.tsp
    di, ng, ds, nh, _ = layer.dims
    return mamba2_splits(di, ng, ds, nh, layout.tpssm), layout.tpssm


def _held(model, layout) -> int:
    """Elements one rank holds of the whole model under the executor's tables (every pipeline stage's
    share counted once, pp = 1)."""
    ref = CausalLM(model, n_layers=model.layers)
    params = dict(ref.named_parameters())
    total = 0
    for i, layer in enumerate(ref.stack.layers):
        table, degree = _layer_table(layer, layout)
        total += sum(
            split.local_numel(tuple(params[f"stack.layers.{i}.{name}"].shape), degree) for name, split in table.items()
        )
    columns = layout.tsp > 1
    degree = layout.tsp if columns else max(layout.tp, layout.tpssm)
    matrix = vocab_split(model.vocab, model.d_model, columns).local_numel((model.vocab, model.d_model), degree)
    ends = 1 if model.tied_embeddings else 2
    return total + ends * matrix + params["head.final_norm.weight"].numel()


@pytest.mark.parametrize("model", DENSE_MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("text", ["tp=2", "tp=4", "tsp=2", "tsp=4", "tp=2,sp=2"])
def test_dense_tables_hold_what_sharding_counts(model, text):
    layout = parse_layout(text)
    if layout.tsp > 1 and not (model.mlp.gated or model.mlp.relu2):
        pytest.skip("TSP's ring runs gated and squared-ReLU MLPs (executor.support refuses others)")
    want = local_params(model, sharding_for(layout, CostOptions()), embeddings=True)
    assert _held(model, layout) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("model", MAMBA_MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("text", ["tpssm=2", "tpssm=4", "tsp=2", "tsp=4", "tpssm=2,sp=2"])
def test_mamba2_tables_hold_what_sharding_counts(model, text):
    """Including TP-SSM's replicated B/C projections when one group spans the ranks."""
    layout = parse_layout(text)
    want = local_params(model, sharding_for(layout, CostOptions()), embeddings=True)
    assert _held(model, layout) == pytest.approx(want, rel=1e-12)


def test_a_split_keeps_every_row_once_across_the_ranks():
    split = dense_splits(48, 16, 64, gated=True)["w_qkv"]
    kept = torch.cat([split.indices(4, r) for r in range(4)])
    assert sorted(kept.tolist()) == list(range(80))
    # Rank 1 of 4 keeps the second quarter of each of Q, K and V, not a contiguous block.
    assert split.indices(4, 1).tolist() == list(range(12, 24)) + list(range(52, 56)) + list(range(68, 72))

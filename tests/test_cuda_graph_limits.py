"""Which steps the executor captures as a CUDA graph (meshplan.executor.graphs.limits): training steps
without pipeline stages, ZeRO, experts or the int8 all-reduce; everything else says why not in one line,
naming the field."""

import pytest

from meshplan.executor import graphs
from meshplan.layout import parse_layout
from meshplan.models import PRESETS


@pytest.mark.parametrize("layout", ["tp=1", "tp=2", "sp=2", "dp=2", "dp=2,tp=2"])
def test_dense_training_steps_are_captured(layout):
    assert graphs.limits(parse_layout(layout), PRESETS["dense-7b"], "train", "cuda:0") is None


@pytest.mark.parametrize("layout", ["tp=1", "sp=2", "dp=2"])
def test_mamba2_training_steps_without_a_tensor_axis_are_captured(layout):
    assert graphs.limits(parse_layout(layout), PRESETS["mamba2-130m"], "train", "cuda:0") is None


@pytest.mark.parametrize(
    "layout, model, mode, device, field",
    [
        ("tp=1", "dense-7b", "train", "cpu", "device"),
        ("tp=1", "dense-7b", "decode", "cuda:0", "mode"),
        ("tp=1", "dense-7b", "prefill", "cuda:0", "mode"),
        ("pp=2", "dense-7b", "train", "cuda:0", "layout"),
        ("dp=2,zero=1", "dense-7b", "train", "cuda:0", "layout"),
        ("tsp=2", "dense-7b", "train", "cuda:0", "layout"),
        ("tpssm=2", "mamba2-130m", "train", "cuda:0", "layout"),
        ("tp=2", "mamba2-130m", "train", "cuda:0", "layout"),
        ("tp=1", "zamba2-7b", "train", "cuda:0", "model"),
        ("tp=1", "mixtral-8x7b", "train", "cuda:0", "model"),
    ],
)
def test_other_steps_say_why_not(layout, model, mode, device, field):
    reason = graphs.limits(parse_layout(layout), PRESETS[model], mode, device)
    assert reason is not None and reason.startswith(f"{field}: ") and "\n" not in reason


def test_int8_allreduce_is_not_captured():
    reason = graphs.limits(parse_layout("tpssm=2"), PRESETS["mamba2-130m"], "train", "cuda:0", int8_allreduce=True)
    assert reason is not None and reason.startswith("int8_allreduce: ")

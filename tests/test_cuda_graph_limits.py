"""Which steps the executor captures as a CUDA graph (meshplan.executor.graphs.limits): one GPU's
training step without experts; everything else says why not in one line, naming the field."""

import pytest

from meshplan.executor import graphs
from meshplan.layout import parse_layout
from meshplan.models import PRESETS


@pytest.mark.parametrize("preset", ["dense-7b", "mamba2-130m"])
def test_one_gpu_training_step_is_captured(preset):
    assert graphs.limits(parse_layout("tp=1"), PRESETS[preset], "train", "cuda:0") is None


@pytest.mark.parametrize(
    "layout, model, mode, device, field",
    [
        ("tp=1", "dense-7b", "train", "cpu", "device"),
        ("tp=1", "dense-7b", "decode", "cuda:0", "mode"),
        ("tp=1", "dense-7b", "prefill", "cuda:0", "mode"),
        ("tp=2", "dense-7b", "train", "cuda:0", "layout"),
        ("dp=2", "dense-7b", "train", "cuda:0", "layout"),
        ("tp=1", "mixtral-8x7b", "train", "cuda:0", "model"),
    ],
)
def test_other_steps_say_why_not(layout, model, mode, device, field):
    reason = graphs.limits(parse_layout(layout), PRESETS[model], mode, device)
    assert reason is not None and reason.startswith(f"{field}: ") and "\n" not in reason

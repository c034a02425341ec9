"""The launch floor's kernel counts (meshplan/costmodel/blocks/launches.py) against the profiled steps
they come from: a mixture of experts' 2-layer step on one GPU and under expert parallelism."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.costmodel.blocks.launches import step_kernels_per_block
from meshplan.layout import parse_layout
from meshplan.models import PRESETS

PROFILE = Path(__file__).resolve().parent.parent / "benchmarks/results/s22-h200x4/profile-moe-h200x4-s22.json"


def _step_kernels(model, layout) -> float:
    return sum(n * step_kernels_per_block(kind, "train", layout) for kind, n in model.block_invocations())


def _profiled() -> dict:
    runs = json.loads(PROFILE.read_text())["runs"]
    return {(r["model"], r["layout"]): r["measured"]["phases_s"]["kernels_per_step"] for r in runs}


@pytest.mark.parametrize(
    "name", ["validation-moe-h200x2-s20-single-profile.json", "validation-moe-h100-s20-qknorm-single-profile.json"]
)
def test_mixtral_step_counts_what_other_machines_profiled(name):
    # The count was read off the 4 × H200 profile; an H100 and another 2 × H200 machine profiled the same step.
    runs = json.loads((PROFILE.parent.parent / name).read_text())["runs"]
    profiled = next(r for r in runs if r["model"] == "mixtral-8x7b/2L")["measured"]["phases_s"]["kernels_per_step"]
    model = replace(PRESETS["mixtral-8x7b"], layers=2)
    assert _step_kernels(model, parse_layout("single")) == pytest.approx(profiled, rel=0.01)


@pytest.mark.parametrize("layout", ["dp=2,ep=2", "dp=4,ep=4", "dp=2,tp=2,ep=2"])
@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_the_floor_never_counts_more_than_was_launched(name, layout):
    # The counts leave out what data parallelism adds to the optimizer's kernels and Qwen3's q/k norms:
    # a floor, within a fifth of the profiled count.
    model = replace(PRESETS[name], layers=2)
    profiled = _profiled()[(f"{name}/2L", layout)]
    counted = _step_kernels(model, parse_layout(layout))
    assert 0.8 * profiled <= counted <= profiled
    assert counted > _step_kernels(model, parse_layout("single"))  # expert parallelism launches more

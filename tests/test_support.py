"""What the executor runs (meshplan.executor.support): `execute` refuses the rest in one line before
launching anything, and `recommend` marks it and names the fastest mesh it can run."""

import json

import pytest
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.executor.support import unsupported
from meshplan.layout import parse_layout
from meshplan.models import PRESETS

runner = CliRunner()


@pytest.mark.parametrize(
    "model, layout, needle",
    [
        ("mamba2-2.7b", "tsp=3", "tsp=3 must divide"),
        ("llama3-8b", "dp=2,pp=2,tsp=2,zero=2", "without tsp or tpssm"),
        ("dense-7b", "pp=3", "does not divide"),
        ("llama3-8b", "dp=2,tsp=4,zero=3", "zero=2 or below"),
        ("zamba2-7b", "tsp=2", "shared blocks on dp, tp (tpssm), sp and pp, not tsp=2"),
        ("zamba2-7b", "pp=3", "over two pipeline stages, not pp=3"),
        ("zamba2-7b", "dp=2,pp=2,zero=2", "execute zero=1"),
        ("zamba2-7b", "dp=2,sp=2,zero=3", "zero=2 or below"),
        ("mamba2-2.7b", "dp=2,zero=3", "tied embedding for ZeRO 3"),
        ("mamba2-2.7b", "dp=2,pp=2,zero=2", "execute zero=1"),
        # Qwen3's query/key norm scales: partial gradients over tp, summed once a step
        ("qwen3-30b-a3b", "dp=2,pp=2,tp=2,ep=2,etp=1,zero=2", "query/key norm gradients over tp"),
    ],
)
def test_unsupported_names_the_field_and_the_way_out(model, layout, needle):
    reason = unsupported(parse_layout(layout), PRESETS[model])
    assert reason is not None and needle in reason and reason.split(":")[0] in ("layout", "model")
    assert "\n" not in reason


@pytest.mark.parametrize(
    "model, layout",
    [
        ("llama3-8b", "tsp=8"),
        ("llama3-8b", "dp=2,tp=4"),
        ("mamba2-2.7b", "sp=8"),
        ("mamba2-2.7b", "tsp=8"),
        ("mamba2-2.7b", "dp=2,tsp=4"),
        ("mamba2-2.7b", "dp=2,tpssm=2,sp=2"),
        ("llama3-8b", "dp=4,tsp=2,zero=2"),
        ("mamba2-2.7b", "dp=2,tpssm=2,zero=1"),
        ("llama3-8b", "dp=2,sp=2,zero=2"),
        ("llama3-8b", "dp=2,tp=4,zero=3"),
        ("llama3-8b", "pp=2,tp=4"),
        ("mamba2-2.7b", "dp=2,pp=2,tpssm=2,zero=1"),
        ("llama3-8b", "dp=2,pp=2,tp=2,zero=2"),
        ("qwen3-30b-a3b", "dp=2,pp=2,tp=2,ep=2,etp=1,zero=1"),
        ("qwen3-30b-a3b", "dp=2,tp=2,ep=2,etp=1,zero=2"),
        ("zamba2-7b", "dp=2,sp=4,zero=2"),
        ("zamba2-7b", "dp=2,tpssm=2,sp=2,zero=1"),
    ],
)
def test_what_the_executor_runs(model, layout):
    assert unsupported(parse_layout(layout), PRESETS[model]) is None


def test_whole_model_needs_even_vocab_and_column_splits():
    from meshplan.models import dense

    odd = dense("odd-vocab", 64, 2, 8, 8, 128, 50257)  # GPT-2's vocabulary
    assert "pad vocab_size to a multiple of 2" in unsupported(parse_layout("tp=2"), odd)
    assert unsupported(parse_layout("tp=2"), odd, whole=False) is None  # the layers alone split no vocabulary
    assert "must divide hidden 60" in unsupported(
        parse_layout("tsp=8"), dense("h60", 60, 2, 4, 4, 128, 96, head_dim=16)
    )


def test_execute_refuses_before_launching():
    r = runner.invoke(
        app,
        ["execute", "--model", "mamba2-2.7b", "--layout", "tsp=3", "--seq", "64", "--nproc", "3", "--device", "cpu"],
    )
    assert r.exit_code == 2 and r.output.startswith("error: layout: tsp=3 does not divide mamba2-2.7b's Mamba-2 heads")
    assert len(r.output.strip().splitlines()) == 1


def test_recommend_marks_what_execute_cannot_run():
    args = ["recommend", "--model", "mamba2-2.7b", "--cluster", "h200-8", "--seq", "128k"]
    rows = json.loads(runner.invoke(app, args + ["--json", "--top", "65"]).stdout)
    assert any(not r["executable"] for r in rows) and any(r["executable"] for r in rows)
    assert all(r["executable"] == (r["not_executed"] is None) for r in rows)
    text = " ".join(runner.invoke(app, args).stdout.split())  # rich wraps the paragraph
    if not rows[0]["executable"]:
        best = next(r for r in rows if r["executable"])
        assert "meshplan execute cannot check" in text and f"The fastest it runs is {best['layout']}" in text


def test_a_gpu_run_is_predicted_for_its_own_gpu():
    """execute on an H100 was compared with an H200's time: the worker now takes the preset of the GPU
    torch names (an H200's where none matches)."""
    from meshplan.executor.worker import gpu_preset

    assert gpu_preset("NVIDIA H100 80GB HBM3") == "h100-sxm-8"
    assert gpu_preset("NVIDIA H200") == "h200-8"
    assert gpu_preset("NVIDIA A100-SXM4-80GB") == "a100-sxm-8"
    assert gpu_preset("Tesla T4") == "h200-8"

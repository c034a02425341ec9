"""Pipelines as production stacks run them, a fixed global batch, stacks, `meshplan predict`, and the
public test set: hand-computed cases, properties, and one-line errors."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.costmodel.collectives import Comm
from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.pipeline import (
    in_flight_chunks,
    interleaved_memory_factor,
    pipeline_passes,
    pipeline_stages,
    validate_batch,
)
from meshplan.costmodel.stacks import STACKS
from meshplan.costmodel.step import as_stack_runs, estimate_step
from meshplan.errors import MeshplanError
from meshplan.layout import Layout
from meshplan.models import gpt
from meshplan.topologies import load_cluster

runner = CliRunner()
GPT = gpt("gpt-1b", 2048, 24, 16, 51200, 2048)


def test_bubble_by_hand():
    # Even stages of 1 s (1/3 forward, 2/3 backward), 8 micro-batches: (m + p − 1)·t = 11 s, bubble 3/11
    # (Narayanan et al. 2021 §2.2.1).
    f, b = [1 / 3] * 4, [2 / 3] * 4
    passes = pipeline_passes(f, b, 8, 1)
    assert passes.total_s == pytest.approx(11.0) and passes.bubble_fraction == pytest.approx(3 / 11)
    assert not passes.simulated
    # Interleaved, 2 chunks a rank: the fill is (p − 1)/v stages: 8 + 1.5.
    passes = pipeline_passes(f, b, 8, 2)
    assert passes.total_s == pytest.approx(9.5) and passes.bubble_fraction == pytest.approx(1.5 / 9.5)
    # A head of 0.5 s on the last stage makes it the slowest: 8 × 1.5 + 3 × 1.
    assert pipeline_passes(f, b, 8, 1, 0.2, 0.3).total_s == pytest.approx(15.0)
    # One micro-batch through 2 stages of 8 chunks: it visits the 16 chunks in turn, 2 s in all; each
    # rank computes 1 s of it — a 50% bubble, not (p − 1)/(v·m + p − 1) = 1/9.
    passes = pipeline_passes([1 / 3] * 2, [2 / 3] * 2, 1, 8)
    assert passes.total_s == pytest.approx(2.0) and passes.bubble_fraction == pytest.approx(0.5)
    assert passes.simulated


def test_slow_first_stage_hides_the_fill():
    """p = 2, m = 2, stage 0 takes 2 s forward and 2 s backward, stage 1 1 s and 1 s. Rank 0 warms up with
    F0 [0, 2], runs F1 [2, 4] while rank 1 runs F0 [2, 3] and B0 [3, 4], then B0 [4, 6] and B1 [6, 8]
    (rank 1: F1 [4, 5], B1 [5, 6]): 8 s, rank 0 never idle. The closed form's m·max + (sum − max) says 10."""
    passes = pipeline_passes([2.0, 1.0], [2.0, 1.0], 2, 1)
    assert passes.simulated
    assert passes.total_s == pytest.approx(8.0)
    assert passes.bubble_s == pytest.approx(0.0)
    assert passes.critical_stage == 0


def test_uneven_stages():
    # 126 layers on 16 stages: the first and last one layer fewer (the 405B production split).
    assert pipeline_stages(126, 16) == (7,) + (8,) * 14 + (7,)
    assert pipeline_stages(10, 4) == (2, 3, 3, 2)
    assert pipeline_stages(8, 4) == (2, 2, 2, 2)
    assert pipeline_stages(5, 2) == (3, 2)
    assert pipeline_stages(12, 3, (3, 5, 4)) == (3, 5, 4)
    with pytest.raises(MeshplanError, match="adds up to 11"):
        pipeline_stages(12, 3, (3, 4, 4))


def test_interleaved_memory_factor_by_hand():
    # Korthikanti et al. 2022 §4.2.3: first stage 1 + (p − 1)/(p·v) times 1F1B's p micro-batches.
    for p, v in ((8, 3), (35, 3), (4, 2)):
        chunks = in_flight_chunks(0, p, 10 * p, v)
        assert chunks / v == pytest.approx(p * interleaved_memory_factor(p, v))
    # Fewer micro-batches than stages: only those are in flight.
    assert in_flight_chunks(0, 8, 3, 1) == 3 and in_flight_chunks(7, 8, 30, 1) == 1


def test_interleaved_first_stage_activations_grow_by_the_factor():
    layout = Layout(pp=4, tp=2)
    base = CostOptions(global_batch=32)
    inter = CostOptions(global_batch=32, schedule="interleaved", virtual_stages=3)
    a = memory_per_gpu(GPT, layout, 2048, 1, base).per_gpu_bytes["activations"]
    b = memory_per_gpu(GPT, layout, 2048, 1, inter).per_gpu_bytes["activations"]
    boundary = 2048 * 2048 * 2  # one stage output (bf16), held per chunk in flight, + the gradient received
    layers_a, layers_b = a - boundary * (4 + 1), b - boundary * (in_flight_chunks(0, 4, 32, 3) + 1)
    assert layers_b / layers_a == pytest.approx(interleaved_memory_factor(4, 3), rel=1e-9)


def test_accumulation_steps_from_the_global_batch():
    assert CostOptions(global_batch=512).steps_for(dp=32, pp=1, micro_batch=2) == 8
    assert CostOptions().steps_for(dp=32, pp=4, micro_batch=1) == 16  # no global batch: 4·pp
    with pytest.raises(MeshplanError, match="not divisible by dp × micro-batch"):
        validate_batch(24, 1, 32, 2, 500, 1)
    with pytest.raises(MeshplanError, match="does not divide a stage's"):
        validate_batch(24, 4, 1, 1, 8, 4)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([1, 2]))
def test_fixed_global_batch_makes_dp_change_steps_not_tokens(dp, micro_batch, pp):
    cluster = load_cluster("a100-sxm-8", 2)
    tp = 16 // (dp * pp)
    if tp > 16 or GPT.attention.heads % tp:
        return
    opts = CostOptions(global_batch=64, stack="megatron")
    est = estimate_step(GPT, Layout(dp=dp, pp=pp, tp=tp), 2048, micro_batch, opts, cluster)
    assert est.tokens_per_step == 64 * 2048  # the batch is the user's, whatever the mesh
    assert est.microbatches == 64 // (dp * micro_batch)


def test_stack_overlap_rules():
    grad = Comm("all_reduce", "dp", 1e9, 8, phase="step", overlap="backward")
    tp = Comm("all_reduce", "tp", 1e8, 8, block="mlp")
    assert as_stack_runs(grad, STACKS["megatron-2021"]).overlap == "none"  # Korthikanti §6: not overlapped
    assert as_stack_runs(grad, STACKS["megatron"]).overlap == "backward"
    assert as_stack_runs(tp, STACKS["megatron"]).overlap == "tp"
    assert as_stack_runs(tp, STACKS["meshplan"]).overlap == "none"
    cluster = load_cluster("h100-sxm-8", 2)
    layout = Layout(dp=2, tp=8)
    steps = {
        s: estimate_step(GPT, layout, 2048, 1, CostOptions(stack=s, global_batch=16), cluster)
        for s in ("megatron", "megatron-2021")
    }
    assert steps["megatron"].exposed_comm_s < steps["megatron-2021"].exposed_comm_s


@pytest.mark.parametrize(
    "args, message",
    [
        (["--layout", "pp=64", "--nodes", "8"], "pp=64 exceeds"),
        (["--layout", "dp=2,pp=4,tp=2", "--nodes", "2", "--global-batch", "7"], "not divisible by dp × micro-batch"),
        (["--layout", "pp=16", "--nodes", "2", "--virtual-stages", "4"], "does not divide a stage's 2 layers"),
        (["--layout", "tp=8", "--stack", "megatronn"], "--stack: unknown 'megatronn'"),
        (["--layout", "tp=8", "--nodes", "2"], "uses 8 GPUs but cluster"),
        (["--layout", "pp=2,tp=4", "--stage-layers", "30,3"], "adds up to 33 layers"),
    ],
)
def test_predict_bad_input_is_one_line(args, message):
    r = runner.invoke(app, ["predict", "--model", "dense-7b", "--cluster", "h100-sxm-8", "--seq", "4k", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and len(r.output.strip().splitlines()) == 1


def test_predict_json_keys_and_uneven_pipeline():
    r = runner.invoke(
        app,
        [
            "predict",
            "--model",
            "dense-7b",
            "--cluster",
            "h100-sxm-8",
            "--nodes",
            "6",
            "--layout",
            "dp=2,pp=3,tp=8,zero=1",
            "--seq",
            "4k",
            "--global-batch",
            "64",
            "--micro-batch",
            "2",
            "--tp-sequence-parallel",
            "--recompute",
            "selective",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {
        "layout",
        "fits",
        "total_bytes",
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "hfu",
        "tflops_per_gpu",
        "exposed_comm_s",
        "bubble_fraction",
        "memory_bytes",
        "stack",
        "microbatches",
    } <= set(out)
    assert out["stage_layers"] == [11, 11, 10] and out["microbatches"] == 16 and out["stack"] == "megatron"
    assert out["tokens_per_step"] == 64 * 4096
    assert 0 < out["bubble_fraction"] < 1 and 0 < out["mfu"] <= out["hfu"] < 1


def test_recommend_fixed_global_batch_searches_knobs():
    r = runner.invoke(
        app,
        [
            "recommend",
            "--model",
            str(_gpt_config()),
            "--cluster",
            "a100-sxm-8",
            "--nodes",
            "2",
            "--seq",
            "2048",
            "--global-batch",
            "64",
            "--json",
            "--top",
            "40",
        ],
    )
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert rows and all(row["knobs"]["micro_batch"] in (1, 2, 4, 8, 16) for row in rows)
    # Every ranked mesh carries the same 64 sequences a step: DP changes the accumulation steps.
    assert all(row["microbatches"] * row["knobs"]["micro_batch"] * int(_dp(row["layout"])) == 64 for row in rows)
    bad = runner.invoke(app, ["recommend", "--model", "dense-7b", "--cluster", "h200-8", "--fixed", "dropout"])
    assert bad.exit_code == 2 and "--fixed: unknown knob 'dropout'" in bad.output


def _dp(layout: str) -> int:
    parts = dict(p.split("=") for p in layout.split(",") if "=" in p)
    return int(parts.get("dp", 1))


def _gpt_config(tmp=[]):  # noqa: B006 (a cache of the file written once)
    import tempfile
    from pathlib import Path

    if not tmp:
        path = Path(tempfile.mkdtemp()) / "config.json"
        path.write_text(
            json.dumps(
                {
                    "model_type": "gpt2",
                    "n_embd": 2048,
                    "n_layer": 24,
                    "n_head": 16,
                    "n_positions": 2048,
                    "vocab_size": 51200,
                }
            )
        )
        tmp.append(path)
    return tmp[0]


def test_stages_sum_their_own_layers():
    """A hybrid's stages are priced by the blocks their layers run, not as shares of an average layer:
    Zamba2-7B with its 13 shared-block invocations all in the first 13 layers puts them all on the
    first of 2 stages, which then sets the pipeline's pace."""
    from dataclasses import replace

    from meshplan.models import PRESETS

    base = PRESETS["zamba2-7b"]
    front = replace(base, hybrid_layer_ids=tuple(range(13)))
    assert list(front.stage_block_counts((41, 40))) == [
        {"mamba2": 41, "attention": 13, "mlp": 13, "hybrid_proj": 13},
        {"mamba2": 40},
    ]
    assert base.stage_block_counts((41, 40))[0]["attention"] == 6  # layers 5, 11, …, 36: spread evenly
    assert not base.uniform_layers and PRESETS["dense-7b"].uniform_layers
    opts = CostOptions(stack="megatron", global_batch=16)
    cluster = load_cluster("h100-sxm-8", 2)
    spread = estimate_step(base, Layout(dp=1, pp=2, tpssm=8), 4096, 1, opts, cluster)
    lumped = estimate_step(front, Layout(dp=1, pp=2, tpssm=8), 4096, 1, opts, cluster)
    # Same FLOPs, but the lumped model's first stage holds every shared-block invocation.
    assert lumped.step_time_s > spread.step_time_s * 1.05
    one = estimate_step(front, Layout(dp=2, tpssm=8), 4096, 1, opts, cluster)
    assert one.step_time_s == pytest.approx(
        estimate_step(base, Layout(dp=2, tpssm=8), 4096, 1, opts, cluster).step_time_s
    )


def test_a_stage_holds_its_own_layers_weights():
    """Zamba2-7B with every shared-block layer among the first 13 of 81: on 2 stages the first holds
    the shared block (both copies its layers invoke) and 13 projections besides its 41 Mamba-2 layers,
    the second only its 40 Mamba-2 layers — by hand, against the parameters memory puts on each."""
    from dataclasses import replace

    from meshplan.costmodel.memory import _own_shares
    from meshplan.models import PRESETS

    model = replace(PRESETS["zamba2-7b"], hybrid_layer_ids=tuple(range(13)))
    opts = CostOptions(stack="megatron")
    mamba, proj = model.mamba2.param_count(), model.hybrid_proj_params()
    block = model.attention.param_count() + model.mlp.param_count()
    first, _ = _own_shares(model, (41, 40), 0, opts)
    second, _ = _own_shares(model, (41, 40), 1, opts)
    assert first * model.layer_params() == pytest.approx(41 * mamba + 13 * proj + model.shared_blocks * block)
    assert second * model.layer_params() == pytest.approx(40 * mamba)
    # The memory model reports the heavier stage.
    mem = memory_per_gpu(model, Layout(pp=2, tpssm=8), 4096, 1, CostOptions(stack="megatron", global_batch=8))
    assert mem.pipeline_stage == "first"

"""Pipelines as production lays them out (issue #33): Megatron-Core's layout string, first/last stage
layers and the embedding and loss counted as layers — chunks of unequal size, hand-computed and held to
the schedule simulator."""

import pytest

from meshplan.costmodel.axes import plan_context
from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.pipeline import (
    in_flight_chunks,
    in_flight_peak,
    parse_pipeline_layout,
    pipeline_passes,
    stage_layout,
    validate_batch,
)
from meshplan.costmodel.pipeline_sim import simulate
from meshplan.costmodel.step import estimate_step, step_floor_s
from meshplan.errors import MeshplanError
from meshplan.layout import Layout
from meshplan.models import gpt
from meshplan.predict import predict
from meshplan.topologies import load_cluster

GPT = gpt("gpt-1b", 2048, 24, 16, 51200, 2048)
GPT126 = gpt("gpt-126L", 1024, 126, 8, 32000, 4096)


def interleaved(v: int, **kw) -> CostOptions:
    return CostOptions(schedule="interleaved", virtual_stages=v, stack="megatron", **kw)


def test_126_layers_pp8_vpp8_with_the_embedding_and_loss_as_layers():
    # 126 + 2 = 128 = 8 ranks × 8 chunks × 2 layers: every chunk 2 "layers", rank 0's first one decoder
    # layer and the embedding, rank 7's last one decoder layer and the loss.
    placed = stage_layout(126, 8, interleaved(8, account_for_embedding=True, account_for_loss=True))
    assert placed.stage_layers == (15,) + (16,) * 6 + (15,)
    assert placed.chunk_layers == ((1,) + (2,) * 7,) + ((2,) * 8,) * 6 + ((2,) * 7 + (1,),)
    # Without them the even split 15, 16 × 6, 15 cannot be cut in 8 chunks: refused, naming the fix.
    with pytest.raises(MeshplanError, match="does not divide a stage's 15 layers.*--account-for-embedding"):
        validate_batch(126, 8, 1, 1, 0, 8, opts=interleaved(8))


def test_layout_string_grammar_and_rank_order():
    stages = parse_pipeline_layout("Et*3|(tt|)*29,m|L")
    assert stages == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    # 32 stages on pp 8: stage k is chunk k // 8 of rank k % 8; 61 decoder layers and one MTP layer.
    placed = stage_layout(62, 8, interleaved(4, pipeline_layout="Et*3|(tt|)*29,m|L"), mtp_layers=1)
    assert placed.chunk_layers[0] == (3, 2, 2, 2)
    assert placed.chunk_layers[6] == (2, 2, 2, 1)  # stage 30: the MTP layer
    assert placed.chunk_layers[7] == (2, 2, 2, 0)  # stage 31: the loss alone
    assert placed.stage_layers == (9,) + (8,) * 5 + (7, 6)


@pytest.mark.parametrize(
    "layout, v, match",
    [
        ("Et*3|tx|t*3L", 1, "unknown character 'x'"),
        ("Et*6|t*6|t*6|t*6L", 1, "has 4 stages but pp × virtual stages = 2 × 1 = 2; use --virtual-stages 2"),
        ("Et*6|t*6|t*6L", 2, "has 3 stages but pp × virtual stages = 2 × 2 = 4; give"),
        ("Et*6|t*6|t*6|t*5L", 2, "places 23 decoder layers.*model has 24.*exactly once"),
        ("t*6|Et*6|t*6|t*6L", 2, "the embedding E must open the first stage"),
        ("Et*6|t*6|t*6L|t*6", 2, "the loss L must close the last stage"),
    ],
)
def test_layout_string_errors_name_the_field_and_the_fix(layout, v, match):
    with pytest.raises(MeshplanError, match=match):  # the grammar when the options are built, the rest per plan
        opts = CostOptions(schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v, pipeline_layout=layout)
        stage_layout(24, 2, opts)


def test_option_pairs_megatron_refuses():
    with pytest.raises(MeshplanError, match="Megatron-Core refuses the pair"):
        CostOptions(first_stage_layers=4, account_for_loss=True)
    with pytest.raises(MeshplanError, match="--pipeline-layout places every layer"):
        CostOptions(pipeline_layout="Et|tL", account_for_embedding=True)
    with pytest.raises(MeshplanError, match="--stage-layers gives every stage's layers"):
        CostOptions(stage_layers=(12, 12), pipeline_layout="Et*12|t*12L")
    with pytest.raises(MeshplanError, match="do not split evenly over pp=8"):
        stage_layout(126, 8, CostOptions(account_for_embedding=True))


def test_first_and_last_stage_layers_split_the_rest_evenly():
    # 126 = 16 + 6 × 16 + 14 (Megatron's --decoder-first/last-pipeline-num-layers): each rank's two chunks
    # are equal, so the schedule is the one of equal chunks.
    placed = stage_layout(126, 8, interleaved(2, first_stage_layers=16, last_stage_layers=14))
    assert placed.stage_layers == (16,) * 7 + (14,) and not placed.uneven_chunks
    placed = stage_layout(24, 4, CostOptions(last_stage_layers=3))  # 21 over 3 ranks
    assert placed.stage_layers == (7, 7, 7, 3)
    with pytest.raises(MeshplanError, match="leave 20 of the 24 decoder layers for 3"):
        stage_layout(24, 4, CostOptions(first_stage_layers=4))
    with pytest.raises(MeshplanError, match="does not divide a stage's 7 layers"):
        stage_layout(24, 4, interleaved(2, last_stage_layers=3))


def test_unequal_chunks_by_hand():
    """p = 2, v = 2, m = 2. Rank 0's chunks take 1 and 2 s forward, rank 1's 2 and 1 (the backward twice
    that). Rank 0 warms up with all four forwards (Megatron's (p − r − 1)·2 + (v − 1)·p = 4 = m·v): F00
    [0, 1], F10 [1, 2], F01 [3, 5] (after rank 1's F00 [1, 3]), F11 [5, 7] (after F10 [3, 5]). Rank 1:
    F01 [5, 6], B01 [6, 8], F11 [8, 9], B11 [9, 11]; rank 0: B01 [8, 12], B11 [12, 16]; rank 1: B00
    [12, 16], B10 [16, 20]; rank 0: B00 [16, 18], B10 [20, 22]. 22 s, each rank busy 18 s. Chunks of
    1.5 s on both would take m·t + (p − 1)·t/v = 18 + 4.5 = 22.5 s."""
    f, b = ((1.0, 2.0), (2.0, 1.0)), ((2.0, 4.0), (4.0, 2.0))
    passes = pipeline_passes([3.0, 3.0], [6.0, 6.0], 2, 2, chunk_fwd_s=f, chunk_bwd_s=b)
    assert passes.total_s == pytest.approx(22.0) and passes.busy_s == pytest.approx(18.0) and passes.simulated
    assert simulate([list(x) for x in f], [list(x) for x in b], 2, chunks=2).total_s == pytest.approx(22.0)
    assert pipeline_passes([3.0, 3.0], [6.0, 6.0], 2, 2).total_s == pytest.approx(22.5)
    # A head on the last chunk of the last rank is simulated there.
    with_head = pipeline_passes([3.0, 3.0], [6.0, 6.0], 2, 2, 0.5, 1.0, chunk_fwd_s=f, chunk_bwd_s=b)
    head = simulate([[1.0, 2.0], [2.0, 1.5]], [[2.0, 4.0], [4.0, 3.0]], 2, chunks=2)
    assert with_head.total_s == pytest.approx(head.total_s)


def test_in_flight_activations_of_unequal_chunks_by_hand():
    # The p = 2, v = 2, m = 2 schedule above: rank 0 runs its four forwards first (1 + 1 + 2 + 2 = 6);
    # rank 1 holds F00, F10, F01 (2 + 2 + 1 = 5), frees B01, adds F11: 5 again.
    assert in_flight_peak(0, 2, 2, (1.0, 2.0)) == 6
    assert in_flight_peak(1, 2, 2, (2.0, 1.0)) == 5
    # 126 layers on pp 8, vpp 8, m 16: rank 0 warms up 7·2 + 7·8 = 70 chunks and holds 71 — group 0's
    # 64 (8 micro-batches × 8 chunks: 8 of 1 layer, 56 of 2) and 7 of group 1's first chunk: 127 layers;
    # rank 1 holds 69 chunks of 2: 138 layers, the most.
    assert in_flight_peak(0, 8, 16, (1,) + (2,) * 7) == 127
    assert in_flight_peak(1, 8, 16, (2,) * 8) == 138 == 2 * in_flight_chunks(1, 8, 16, 8)


def test_a_layout_string_of_the_even_split_prices_as_today():
    cluster = load_cluster("a100-sxm-8", 2)
    layout = Layout(dp=2, pp=4, tp=2)
    even = interleaved(2, global_batch=16)
    text = "Et*3|" + "t*3|" * 6 + "t*3L"
    laid = interleaved(2, global_batch=16, pipeline_layout=text)
    a, b = estimate_step(GPT, layout, 2048, 1, even, cluster), estimate_step(GPT, layout, 2048, 1, laid, cluster)
    assert a.step_time_s == b.step_time_s and a.bubble_s == b.bubble_s and not b.chunk_layers
    assert (
        memory_per_gpu(GPT, layout, 2048, 1, even).total_bytes == memory_per_gpu(GPT, layout, 2048, 1, laid).total_bytes
    )
    # One layer moved from rank 0's first chunk to rank 3's last: priced by the simulator, stages 5, 6, 6, 7.
    moved = interleaved(2, global_batch=16, pipeline_layout="Et*2|" + "t*3|" * 6 + "t*4L")
    c = estimate_step(GPT, layout, 2048, 1, moved, cluster)
    assert c.stage_layers == (5, 6, 6, 7) and c.chunk_layers[0] == (2, 3) and c.pipeline_simulated
    assert c.step_time_s > a.step_time_s  # the last rank, with the head, got heavier
    assert step_floor_s(plan_context(GPT, layout, 2048, 1, moved), cluster) <= c.step_time_s


def test_predict_expresses_126_layers_on_pp8_with_8_virtual_stages():
    cluster = load_cluster("h100-sxm-8", 8)
    layout = Layout(dp=2, pp=8, tp=4, zero=1)
    opts = interleaved(8, global_batch=64, account_for_embedding=True, account_for_loss=True)
    result = predict(GPT126, cluster, layout, 4096, 1, opts)
    out = result.as_dict()
    assert out["stage_layers"] == [15] + [16] * 6 + [15]
    assert out["chunk_layers"][0] == [1] + [2] * 7 and out["chunk_layers"][7] == [2] * 7 + [1]
    assert out["pipeline_simulated"] and 0 < out["bubble_fraction"] < 7 / (8 * 32) * 1.5
    # The busiest rank's activations: a middle rank's 69 chunks of 2 layers in flight (above).
    assert result.memory.pipeline_stage.startswith("stage ")


def test_predict_cli_takes_a_layout_string_and_refuses_a_bad_one_in_one_line():
    from typer.testing import CliRunner

    from meshplan.cli import app

    base = ["predict", "--model", "llama3-8b", "--cluster", "h100-sxm-8", "--layout", "pp=4,tp=2", "--seq", "4096"]
    base += ["--global-batch", "8", "--virtual-stages", "2"]
    ok = CliRunner().invoke(app, base + ["--pipeline-layout", "Et*3|t*4|t*4|t*4|t*4|t*4|t*4|t*5L"])
    assert ok.exit_code == 0, ok.output
    assert "rank 0 [3, 4]" in ok.output and "rank 3 [4, 5]" in ok.output
    bad = CliRunner().invoke(app, base + ["--pipeline-layout", "Et*8|t*8|t*8|t*8L"])
    assert bad.exit_code == 2 and "has 4 stages but pp × virtual stages = 4 × 2 = 8" in bad.output

"""The public test set: every row with a measured figure is predicted, and the A100 GEMM rate in
meshplan/hardware.py is what Korthikanti et al. 2022 Table 4 gives (its calibration rows)."""

import pytest
from benchmark_scripts import load

from meshplan import hardware


def test_every_published_row_is_predicted():
    pr = load("published_runs")
    rows = pr.load_rows()
    results = pr.evaluate(rows)
    assert len(results) == len(rows) > 100
    assert all(r["predicted"] > 0 and r["published"] > 0 for r in results)
    ids = [r["id"] for r in results]
    assert len(ids) == len(set(ids))
    # Korthikanti's activation memory (Table 2 / Fig. 1 / Fig. 7) follows from the saved-tensor list.
    memory = [r for r in results if r["metric"] in ("activations_gib", "activations_percent_of_tp")]
    assert memory and all(abs(r["relative_error"]) < 0.02 for r in memory)


def test_a100_rate_is_the_table4_fit():
    pr = load("published_runs")
    assert pr.fit_a100(pr.load_rows()) == pytest.approx(hardware.A100_GEMM_EFFICIENCY, abs=0.002)


def test_paper_flops_formulas_by_hand():
    pr = load("published_runs")
    # Narayanan Eq. 3 at 1T (B 3072, s 2048, l 128, h 25600, V 51200).
    f = pr.paper_flops("narayanan_eq3", 3072, 2048, 128, 25600, 51200)
    assert f == pytest.approx(96 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600)))
    assert pr.paper_flops("korthikanti_eq7", 1, 2048, 1, 6144, 0) == pytest.approx(
        72 * 2048 * 6144**2 * (1 + 2048 / (6 * 6144))
    )


def test_every_miss_is_explained():
    pr = load("published_runs")
    results = pr.evaluate(pr.load_rows())
    unexplained = [r["id"] for r in results if not r["within"] and r["role"] == "test" and not r["why_missed"]]
    assert not unexplained, f"misses without an entry in benchmarks/published/misses.toml: {unexplained}"


def test_llama_rows_are_the_presets_shapes_on_their_stated_mesh():
    """A row giving kv_heads builds the Llama decoder (its 8B row counts exactly the llama3-8b preset's
    parameters), cp becomes the sequence axis beside tp and pp, the production pipeline split is passed
    as Megatron states it, and tokens/s/GPU is the global batch's tokens over the step and the GPUs."""
    from meshplan.models import PRESETS

    pr = load("published_runs")
    rows = {r["id"]: r for r in pr.load_rows()}
    eight = rows["nemo2407-llama3-8b-fp8"]
    assert pr.model_of(eight).param_count() == PRESETS["llama3-8b"].param_count()
    assert str(pr.layout_of(eight)) == "dp=4,sp=2,zero=1"
    big = rows["nemo2511-llama31-405b-fp8"]
    assert str(pr.layout_of(big)) == "dp=8,pp=8,tp=8,sp=2,zero=1"
    opts = pr.base_options(big, virtual_stages=8, schedule="interleaved")
    assert opts.account_for_embedding and opts.account_for_loss and opts.grad_dtype == "bf16"
    assert opts.precision == "fp8" and opts.fp8_param_gather
    p = pr.predict_row(big)
    tokens = pr.predicted_value(big, p)
    assert tokens == pytest.approx(512 * 8192 / p["estimate"].step_time_s / 1024)
    # 128 units (126 layers + embedding + loss) in 64 chunks: the first and last chunk hold one layer
    assert p["estimate"].chunk_layers[0][0] == 1 and p["estimate"].chunk_layers[-1][-1] == 1

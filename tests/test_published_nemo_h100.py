"""NeMo 24.07's H100 rows (benchmarks/published/nemo_h100.toml): the transcription is self-consistent — each
row's model TFLOP/s/GPU is its tokens/s/GPU times the korthikanti_eq7 FLOPs a token (NeMo's GPT-3 formula,
V = 51,200), to the table's rounding."""

import pytest
from benchmark_scripts import load


def test_nemo_h100_tflops_are_tokens_times_the_formula():
    pr = load("published_runs")
    rows = [r for r in pr.load_rows() if r.source == "nemo_h100.toml"]
    assert len(rows) == 4
    for r in rows:
        per_token = pr.paper_flops(r["flops_formula"], 1, r["seq"], r["layers"], r["hidden"], r["vocab"]) / r["seq"]
        assert per_token * r["tokens_per_s_per_gpu"] / 1e12 == pytest.approx(r["measured"], abs=1.0), r["id"]
        assert r["precision"] == "fp8" and r["stack"] == "megatron"

"""NeMo 24.07's H100 rows (benchmarks/published/nemo_h100.toml): the transcription is self-consistent — each
row's model TFLOP/s/GPU is its tokens/s/GPU times the korthikanti_eq7 FLOPs a token (NeMo's GPT-3 formula,
V = 51,200), to the table's rounding."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("published_runs", ROOT / "benchmarks" / "published_runs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_runs"] = module
    spec.loader.exec_module(module)
    return module


def test_nemo_h100_tflops_are_tokens_times_the_formula():
    pr = _script()
    rows = [r for r in pr.load_rows() if r.source == "nemo_h100.toml"]
    assert len(rows) == 4
    for r in rows:
        per_token = pr.paper_flops(r["flops_formula"], 1, r["seq"], r["layers"], r["hidden"], r["vocab"]) / r["seq"]
        assert per_token * r["tokens_per_s_per_gpu"] / 1e12 == pytest.approx(r["measured"], abs=1.0), r["id"]
        assert r["precision"] == "fp8" and r["stack"] == "megatron"

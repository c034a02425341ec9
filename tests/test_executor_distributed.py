"""Every layout on gloo processes against a single-process float64 run of the same weights (training,
prefill, and decode after prefill):
outputs, input gradients and each rank's weight-gradient shard; counted collective bytes equal to
the cost model's schedule, per kind and axis; saved activations within 5% of the memory model.
One spawn per (family, world size) runs all its layouts, bounded by a timeout."""

from collections import defaultdict

import pytest

from meshplan.executor.check import check_layout
from meshplan.executor.distributed import run_distributed
from meshplan.layout import parse_layout
from meshplan.models import dense, mamba2

DENSE = dense("tiny-gqa", 64, 2, 8, 4, 128, 100)
MAMBA_ONE_GROUP = mamba2("tiny-m2", 32, 2, 100, d_state=8, headdim=8, ngroups=1)
MAMBA_FOUR_GROUPS = mamba2("tiny-m2-g4", 32, 2, 100, d_state=8, headdim=8, ngroups=4)

CASES = {
    ("dense", 2): (DENSE, ["tp=2", "sp=2", "tsp=2"]),
    ("dense", 4): (DENSE, ["tp=4", "sp=4", "tsp=4", "tp=2,sp=2"]),
    ("mamba2", 2): (MAMBA_ONE_GROUP, ["tpssm=2", "sp=2"]),
    ("mamba2", 4): (MAMBA_ONE_GROUP, ["tpssm=4", "sp=4", "tpssm=2,sp=2"]),
    ("mamba2-groups", 4): (MAMBA_FOUR_GROUPS, ["tpssm=4", "tpssm=2"]),
}


def _run_all(rank, world, model, layouts, seq, batch):
    out = []
    for text in layouts:
        layout = parse_layout(text)
        for mode in ("train", "prefill", "decode"):
            if layout.world_size == world:
                out.append((text, mode, check_layout(rank, world, model, layout, seq, batch, mode)))
    return out


@pytest.mark.parametrize("family, world", list(CASES))
def test_layouts_match_single_process_and_the_cost_model(family, world):
    model, layouts = CASES[(family, world)]
    # tpssm=2 on 4 processes needs dp; keep only meshes of exactly `world` ranks.
    layouts = [x for x in layouts if parse_layout(x).world_size == world]
    per_rank = run_distributed(_run_all, world, model, layouts, 16, 2, timeout_s=240)
    for i, (text, mode, _) in enumerate(per_rank[0]):
        results = [r[i][2] for r in per_rank]
        for r in results:
            assert r["max_out_err"] < 1e-10, (text, mode, r)
            if mode == "train":
                assert r["max_grad_x_err"] < 1e-10, (text, r)
                assert r["max_weight_grad_rel_err"] < 1e-9, (text, r)
                assert abs(r["saved_bytes"] - r["predicted_saved_bytes"]) <= 0.05 * r["predicted_saved_bytes"], (text, r)
        counted = defaultdict(float)
        for r in results:
            for key, value in r["counts"].items():
                counted[key] += value / len(results)
        predicted = results[0]["predicted_counts"]
        assert set(counted) == set(predicted), (text, mode, dict(counted), predicted)
        for key, value in predicted.items():
            assert counted[key] == pytest.approx(value, rel=1e-12), (text, mode, key, dict(counted), predicted)

"""The whole model — token embedding, layers, final norm, LM head and cross-entropy — on every layout,
in gloo processes, against the single-process float64 model that takes torch's cross-entropy over
all of its logits: the loss, every weight's gradient (embedding and head included), ZeRO's optimizer
step, the next token's log-probabilities after a prefill and each decoded token; the collective bytes
equal to the cost model's schedule with its embedding and loss terms, per kind and axis; the saved
activations within 5% of the memory model's (layers, head and the loss's fp32 logits)."""

from dataclasses import replace

import pytest

from meshplan.executor.check import mean_counts
from meshplan.executor.check_model import check_model
from meshplan.executor.distributed import run_distributed
from meshplan.layout import parse_layout
from meshplan.models import dense, mamba2

DENSE = dense("tiny-lm", 64, 2, 8, 4, 128, 100)
TIED = dense("tiny-lm-tied", 64, 2, 8, 4, 128, 100, tied=True)
# Qwen3's per-head query/key norms (a head_dim scale each, whole on every rank)
QK_NORM = replace(DENSE, name="tiny-lm-qk-norm", attention=replace(DENSE.attention, qk_norm=2 * 8))
MAMBA = mamba2("tiny-m2-lm", 32, 2, 100, d_state=8, headdim=8, ngroups=1)  # tied, as state-spaces' are

CASES = {
    ("dense", 2): (DENSE, ["tp=2", "sp=2", "tsp=2", "dp=2,zero=1", "dp=2,zero=2", "dp=2,zero=3", "pp=2"]),
    ("tied", 2): (TIED, ["tp=2", "tsp=2", "pp=2", "dp=2,zero=1"]),
    ("qk-norm", 2): (QK_NORM, ["tp=2", "sp=2", "tsp=2", "dp=2,zero=3", "pp=2"]),
    ("mamba2", 2): (MAMBA, ["tpssm=2", "sp=2", "tsp=2", "dp=2,zero=2", "pp=2"]),
    ("dense", 4): (DENSE, ["tp=2,sp=2", "dp=2,tsp=2,zero=1", "pp=2,tp=2", "dp=2,pp=2,zero=1"]),
    ("mamba2", 4): (MAMBA, ["tpssm=2,sp=2", "pp=2,tpssm=2"]),
}


def _run_all(rank, world, model, layouts, seq, batch):
    return [
        (text, mode, check_model(rank, world, model, parse_layout(text), seq, batch, mode))
        for text in layouts
        for mode in ("train", "prefill", "decode")
    ]


@pytest.mark.parametrize("family, world", list(CASES))
def test_whole_model_matches_single_process_and_the_cost_model(family, world):
    model, layouts = CASES[(family, world)]
    per_rank = run_distributed(_run_all, world, model, layouts, 16, 2, timeout_s=300)
    for i, (text, mode, _) in enumerate(per_rank[0]):
        results = [r[i][2] for r in per_rank]
        for r in results:
            if mode == "train":
                assert r.get("loss_err", 0.0) < 1e-12, (text, r)
                assert r["max_weight_grad_rel_err"] < 1e-9, (text, r)
                if "zero" in text:
                    assert r["max_weight_after_step_rel_err"] < 1e-12, (text, r)
                assert abs(r["saved_bytes"] - r["predicted_saved_bytes"]) <= 0.05 * r["predicted_saved_bytes"], (
                    text,
                    r,
                )
            else:
                assert r["max_out_err"] < 1e-10, (text, mode, r)
        # The loss was checked on every rank that holds the head (one per pipeline).
        assert sum("loss_err" in r for r in results) >= (world // parse_layout(text).pp if mode == "train" else 0)
        counted = mean_counts(results)
        predicted = results[0]["predicted_counts"]
        assert set(counted) == set(predicted), (text, mode, counted, predicted)
        for key, value in predicted.items():
            assert counted[key] == pytest.approx(value, rel=1e-12), (text, mode, key, counted, predicted)


def _run_packed(rank, world, model, layouts, seq, batch):
    return [
        (text, mode, check_model(rank, world, model, parse_layout(text), seq, batch, mode, packed=True))
        for text in layouts
        for mode in ("train", "prefill", "decode")
    ]


@pytest.mark.parametrize(
    "world, layouts", [(2, ["tpssm=2", "sp=2", "tsp=2", "pp=2", "dp=2,zero=1"]), (4, ["sp=4", "tsp=4", "tpssm=2,sp=2"])]
)
def test_packed_documents_in_mamba2_match_single_process(world, layouts):
    """Rows that pack several documents (executor.check_model.packed_documents: one continuing across a
    shard boundary and ending inside the next shard, one starting exactly at a shard boundary, a last
    document shorter than the conv window): no state or conv tap crosses a boundary on any layout —
    the loss, gradients and log-probs equal the single process run with seq_idx."""
    per_rank = run_distributed(_run_packed, world, MAMBA, layouts, 16, 2, timeout_s=300)
    for i, (text, mode, _) in enumerate(per_rank[0]):
        for r in (ranks[i][2] for ranks in per_rank):
            if mode == "train":
                assert r.get("loss_err", 0.0) < 1e-12, (text, r)
                assert r["max_weight_grad_rel_err"] < 1e-9, (text, r)
            else:
                assert r["max_out_err"] < 1e-10, (text, mode, r)


def _run_poisoned(rank, world, model, layouts, seq, batch):
    """_run_all's training checks with torch.empty handing out NaN (in this worker process): a buffer
    row the backward leaves unwritten — TSP writes each hop's weight gradients straight into theirs —
    turns the gradients NaN."""
    import torch

    real_empty, real_like = torch.empty, torch.empty_like

    def poisoned(t):
        return t.fill_(float("nan")) if t.dtype.is_floating_point else t

    torch.empty = lambda *a, **k: poisoned(real_empty(*a, **k))
    torch.empty_like = lambda *a, **k: poisoned(real_like(*a, **k))
    try:
        return [(text, check_model(rank, world, model, parse_layout(text), seq, batch, "train")) for text in layouts]
    finally:
        torch.empty, torch.empty_like = real_empty, real_like


@pytest.mark.parametrize("world, model, layouts", [(2, TIED, ["tsp=2"]), (4, DENSE, ["tsp=4", "dp=2,tsp=2,zero=1"])])
def test_tsp_writes_every_row_of_its_gradient_buffers(world, model, layouts):
    per_rank = run_distributed(_run_poisoned, world, model, layouts, 16, 2, timeout_s=300)
    for rank_results in per_rank:
        for text, r in rank_results:
            assert r["max_weight_grad_rel_err"] < 1e-9, (text, r)
            assert r.get("loss_err", 0.0) < 1e-12, (text, r)

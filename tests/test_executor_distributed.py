"""Every layout on gloo processes against a single-process float64 run of the same weights (training,
prefill, and decode after prefill):
outputs, input gradients and each rank's weight-gradient shard; counted collective bytes equal to
the cost model's schedule, per kind and axis; saved activations within 5% of the memory model.
One spawn per (family, world size) runs all its layouts, bounded by a timeout."""

import pytest

from meshplan.executor.check import check_layout, mean_counts
from meshplan.executor.distributed import run_distributed
from meshplan.layout import grad_group, parse_layout
from meshplan.models import dense, mamba2

DENSE = dense("tiny-gqa", 64, 2, 8, 4, 128, 100)
MAMBA_ONE_GROUP = mamba2("tiny-m2", 32, 2, 100, d_state=8, headdim=8, ngroups=1)
MAMBA_FOUR_GROUPS = mamba2("tiny-m2-g4", 32, 2, 100, d_state=8, headdim=8, ngroups=4)

CASES = {
    ("dense", 2): (DENSE, ["tp=2", "sp=2", "tsp=2", "dp=2", "dp=2,zero=1", "dp=2,zero=2", "dp=2,zero=3", "pp=2"]),
    ("dense", 4): (
        DENSE,
        [
            "tp=4",
            "sp=4",
            "tsp=4",
            "tp=2,sp=2",
            "dp=2,tp=2",
            "dp=2,tsp=2,zero=1",
            "dp=2,sp=2,zero=2",
            "pp=2,tp=2",
            "dp=2,pp=2,zero=1",
            "pp=2,sp=2",
            "dp=2,pp=2,zero=2",
            "dp=2,pp=2,zero=3",
        ],
    ),
    ("mamba2", 2): (MAMBA_ONE_GROUP, ["tpssm=2", "sp=2", "tsp=2", "dp=2", "dp=2,zero=2", "dp=2,zero=3", "pp=2"]),
    ("mamba2", 4): (
        MAMBA_ONE_GROUP,
        ["tpssm=4", "sp=4", "tsp=4", "tpssm=2,sp=2", "dp=2,sp=2", "dp=2,tpssm=2,zero=2", "pp=2,tpssm=2"],
    ),
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
                if "zero" in text:  # ZeRO's sharded Adam step lands where one process's lands
                    assert r["max_weight_after_step_rel_err"] < 1e-12, (text, r)
                assert abs(r["saved_bytes"] - r["predicted_saved_bytes"]) <= 0.05 * r["predicted_saved_bytes"], (
                    text,
                    r,
                )
                if parse_layout(text).pp == 1:
                    # Gradient all-reduces (dp, sp) start inside the backward: every later layer's has
                    # begun by the time the backward reaches the stack's input. (Under pipeline stages
                    # they wait for the last micro-batch.)
                    later = r["grad_reductions_of_later_layers"]
                    assert (later > 0) == (grad_group(parse_layout(text))[1] > 1), (text, r)
                    assert r["grad_reductions_before_input_grad"] >= later, (text, r)
        counted = mean_counts(results)
        predicted = results[0]["predicted_counts"]
        assert set(counted) == set(predicted), (text, mode, counted, predicted)
        for key, value in predicted.items():
            assert counted[key] == pytest.approx(value, rel=1e-12), (text, mode, key, counted, predicted)


def _int8_case(rank, world, model):
    return [
        check_layout(rank, world, model, parse_layout("tpssm=2"), 16, 2, mode, True) for mode in ("train", "prefill")
    ]


def test_tpssm_int8_allreduce_is_close_and_moves_what_the_model_says():
    model = mamba2("tiny-m2-int8", 64, 2, 100, d_state=8, headdim=8, ngroups=1)
    per_rank = run_distributed(_int8_case, 2, model, timeout_s=120)
    for i in range(2):
        results = [r[i] for r in per_rank]
        for r in results:
            # int8 with a scale per 128 values: ~1/254 of each group's largest value per rounding, twice.
            assert r["max_out_rel_err"] < 3e-2, r
        counted = mean_counts(results)
        assert counted == pytest.approx(results[0]["predicted_counts"], rel=1e-12)
        # Two ranks: the int8 tensors are all-gathered and summed, with no all-to-all.
        assert "all_gather/tpssm" in counted and "all_to_all/tpssm" not in counted


def _quantized_vs_bf16(rank, world, numel):
    import torch

    from meshplan.executor.comm import all_reduce, build_mesh, quantized_all_reduce
    from meshplan.layout import Layout

    mesh = build_mesh(Layout(tp=world))
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(numel, generator=gen) * (1 + rank)
    exact = all_reduce(mesh, x.double().clone(), "tp")
    bf16 = all_reduce(mesh, x.bfloat16().clone(), "tp").double()
    int8 = quantized_all_reduce(mesh, x.clone(), "tp").double()
    scale = exact.abs().max().item()
    return {
        "int8_err": (int8 - exact).abs().max().item() / scale,
        "bf16_err": (bf16 - exact).abs().max().item() / scale,
    }


@pytest.mark.parametrize("world", [2, 3, 4])  # 2: the all-gather path; 3 and 4: all-to-all, then all-gather
def test_quantized_all_reduce_error_against_exact_and_bf16(world):
    results = run_distributed(_quantized_vs_bf16, world, 128 * 64 + 5, timeout_s=120)  # not a multiple: padded
    for r in results:
        # Each rank's quantization and the re-quantization each err by at most half a step of a group
        # (max|x| / 254); against the summed magnitude that stays under a few percent.
        assert r["int8_err"] < 0.03, r
        assert r["bf16_err"] < 0.01, r


def _two_steps(rank, world, model, layout_text):
    import torch

    from meshplan.executor.blocks import Stack
    from meshplan.executor.comm import build_mesh
    from meshplan.executor.parallelize import GradientSync, parallelize, run_layers

    torch.manual_seed(0)
    ref = Stack(model, model.layers).double()
    mesh = build_mesh(parse_layout(layout_text))
    layers = parallelize(ref, mesh, 16)
    names = {id(p): f"{i}.{n}" for i, layer in enumerate(layers) for n, p in layer.named_parameters()}
    sync = GradientSync(layers, mesh)
    fired = []
    for p in layers.parameters():
        p.register_post_accumulate_grad_hook(lambda p: fired.append(names[id(p)]))
    x = torch.randn(2, 16, model.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    grads = []
    for _ in range(2):
        run_layers(layers, x).sum().backward()
        sync.finish()
        grads.append([p.grad.clone() for p in layers.parameters()])
        for p in layers.parameters():
            p.grad = None
    return {
        "first_step_ready": fired[: len(fired) // 2],
        "adopted": [names[id(p)] for p in sync.order],
        "same_grads": all(torch.equal(a, b) for a, b in zip(*grads)),
    }


def test_gradient_sync_adopts_the_first_steps_ready_order():
    per_rank = run_distributed(_two_steps, 2, DENSE, "dp=2", timeout_s=120)
    for r in per_rank:
        # From the second step the all-reduces go in the order the gradients became ready (here the
        # MLP's before the attention's, the second layer's before the first's), the same on both ranks,
        # and the reduced gradients do not change with it.
        assert r["adopted"] == per_rank[0]["first_step_ready"]
        assert (
            r["adopted"].index("1.mlp.w_down")
            < r["adopted"].index("1.attention.w_qkv")
            < r["adopted"].index("0.mlp.w_down")
        )
        assert r["same_grads"]


def test_gradient_sync_does_not_keep_the_layers_alive():
    import gc
    import weakref

    from torch import nn

    from meshplan.executor.comm import Mesh
    from meshplan.executor.parallelize import GradientSync
    from meshplan.layout import Layout

    layers = nn.ModuleList([nn.Linear(4, 4)])
    sync = GradientSync(layers, Mesh(Layout(dp=2), 0, 2, {}))
    assert sync.order  # hooks are registered on every weight
    weight = weakref.ref(layers[0].weight)
    del layers, sync
    gc.collect()
    assert weight() is None


def test_zero3_weights_do_not_keep_the_layers_alive():
    import gc
    import weakref

    from torch import nn

    from meshplan.executor.comm import Mesh
    from meshplan.executor.zero3 import ShardedWeights
    from meshplan.layout import Layout

    layers = nn.ModuleList([nn.Linear(4, 4)])
    ShardedWeights(layers, Mesh(Layout(dp=2, zero=3), 0, 2, {"dp": _Axis1()}))
    assert layers[0].weight.untyped_storage().nbytes() == 0  # given back until a forward gathers it
    weight = weakref.ref(layers[0].weight)
    del layers
    gc.collect()
    alive = weight() is not None  # (a weight with no storage is not printed)
    assert not alive


class _Axis1:
    """A dp axis of two ranks, this one the first, with no process group (nothing is sent here)."""

    size, rank, ranks, group = 2, 0, [0, 1], None

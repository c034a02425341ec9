"""The executor's mixture of experts (issue #32, first slice): the single-process MoE MLP against
transformers' MixtralSparseMoeBlock with the same weights, and expert parallelism (dp=2, ep=2) on gloo
processes against the single-process float64 stack — loss, outputs, input and every weight's gradient
(the experts' gathered from both ranks) — with the all-to-all bytes counted equal to what the routing
sent, and the cost model's per-layer all-to-all bytes equal to that count under an even routing."""

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.schedule import step_schedule
from meshplan.executor.blocks import MoEMLP, Stack
from meshplan.executor.comm import build_mesh
from meshplan.executor.distributed import run_distributed
from meshplan.executor.layouts.ep import ExpertParallelMoE
from meshplan.executor.layouts.layer import build_layer
from meshplan.executor.parallelize import GradientSync, run_layers
from meshplan.layout import parse_layout
from meshplan.models import MoeSpec, dense, moe

MIXTRAL = moe(dense("tiny-mixtral", 64, 2, 8, 4, 128, 100), MoeSpec(64, 4, 2, 128))


def test_moe_mlp_matches_transformers_mixtral_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    ours = MoEMLP(MIXTRAL)
    config = MixtralConfig(hidden_size=64, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2)
    theirs = MixtralSparseMoeBlock(config).eval()
    with torch.no_grad():
        theirs.gate.weight.copy_(ours.w_router)
        theirs.experts.gate_up_proj.copy_(ours.w_gate_up)
        theirs.experts.down_proj.copy_(ours.w_down)
    x = torch.randn(2, 16, 64)
    want = theirs(ours.mlp_norm(x))
    torch.testing.assert_close(ours(x), want, rtol=1e-5, atol=1e-5)


def _ep_case(rank, world, model, layout_text, seq, batch):
    """One training step of the stack under the layout, this rank on its own `batch` sequences, beside
    the float64 single-process stack on all dp · batch of them (its loss the mean of the ranks')."""
    layout = parse_layout(layout_text)
    torch.manual_seed(0)
    ref = Stack(model, model.layers).double()
    dp = layout.dp
    x = torch.randn(dp * batch, seq, model.d_model, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(dp * batch, seq, model.d_model, dtype=torch.float64)
    y_ref = run_layers(ref.layers, x)
    loss_ref = (y_ref * weight).sum() / dp
    loss_ref.backward()

    mesh = build_mesh(layout)
    layers = nn.ModuleList(build_layer(r, mesh, seq, torch.arange(seq), True) for r in ref.layers)
    mine = slice(mesh.axis("dp").rank * batch, (mesh.axis("dp").rank + 1) * batch)
    xs = x.detach()[mine].clone().requires_grad_()
    sync = GradientSync(layers, mesh)
    y = run_layers(layers, xs)
    loss = (y * weight[mine]).sum()  # GradientSync takes the mean of the dp ranks' gradients
    loss.backward()
    sync.finish()
    total = loss.detach().clone()
    dist.all_reduce(total)
    total /= dp

    errs = {}
    for layer, ref_layer in zip(layers, ref.layers):
        ref_params = dict(ref_layer.named_parameters())
        for local, (name, dim, idx) in layer.index.items():
            p, want = layer.get_parameter(local), ref_params[name].grad
            want = want if dim is None else want.index_select(dim, idx)
            errs[local] = max(errs.get(local, 0.0), ((p.grad - want).abs().max() / want.abs().max()).item())
    # The experts' gradients of both ranks gathered, against the reference's whole.
    expert_err = 0.0
    ep = mesh.axis("ep")
    for layer, ref_layer in zip(layers, ref.layers):
        for local, name in (("w_gate_up", "w_gate_up"), ("w_down", "w_down")):
            g = getattr(layer.mlp, local).grad.contiguous()
            parts = [torch.empty_like(g) for _ in range(ep.size)]
            dist.all_gather(parts, g, group=ep.group)
            want = getattr(ref_layer.moe, name).grad
            expert_err = max(expert_err, ((torch.cat(parts) - want).abs().max() / want.abs().max()).item())
    moes = [m for m in layers.modules() if isinstance(m, ExpertParallelMoE)]
    return {
        "loss_err": abs(total.item() - loss_ref.item()) / abs(loss_ref.item()),
        "max_out_err": (y.detach() - y_ref.detach()[mine]).abs().max().item(),
        "max_grad_x_err": (xs.grad / dp - x.grad[mine]).abs().max().item(),
        "max_weight_grad_rel_err": max(errs.values()),
        "expert_grad_rel_err": expert_err,
        "counts": dict(mesh.counts),
        "sent_rows": [m.sent_rows for m in moes],
        "received_rows": [m.received_rows for m in moes],
    }


def test_expert_parallel_stack_matches_single_process_and_counts_its_all_to_alls():
    seq, batch, layout_text = 16, 2, "dp=2,ep=2"
    per_rank = run_distributed(_ep_case, 2, MIXTRAL, layout_text, seq, batch, timeout_s=240)
    h, k, element = MIXTRAL.d_model, MIXTRAL.moe.top_k, 8  # float64
    for r in per_rank:
        assert r["loss_err"] < 1e-12, r
        assert r["max_out_err"] < 1e-10, r
        assert r["max_grad_x_err"] < 1e-10, r
        assert r["max_weight_grad_rel_err"] < 1e-9, r
        assert r["expert_grad_rel_err"] < 1e-9, r
        # Every layer: dispatch and the combine's gradient send this rank's T_d·k copies; combine and the
        # dispatch's gradient send back what arrived here, whatever the routing made of it.
        assert all(rows == batch * seq * k for rows in r["sent_rows"])
        rows = sum(r["sent_rows"]) + sum(r["received_rows"])
        assert r["counts"]["all_to_all/ep"] == 2 * rows * h * element, r["counts"]
        assert set(r["counts"]) <= {"all_to_all/ep", "all_reduce/dp"}, r["counts"]
    # The cost model's four all-to-alls a layer, each T_d·k·h elements (fp32 here: ×2 for float64),
    # assume an even routing: each rank receives what it sends. Real routing is not even, but what the
    # ranks receive sums to what they send, so the ranks' mean count is the cost model's exactly.
    model = replace(MIXTRAL, param_dtype="fp32")
    opts = CostOptions(mode="train", act_dtype="fp32", grad_dtype="fp32")
    schedule = step_schedule(model, parse_layout(layout_text), seq, batch, opts, embeddings=False)
    predicted = sum(c.message_bytes * c.count for c in schedule.per_block["experts"] if c.kind == "all_to_all")
    mean = sum(r["counts"]["all_to_all/ep"] for r in per_rank) / len(per_rank)
    assert 2 * predicted * MIXTRAL.layers == mean


def test_expert_gradients_are_summed_over_the_expert_data_parallel_ranks():
    """dp=4, ep=2 on four gloo processes: two expert-parallel groups of two, each expert held by two ranks
    (edp = 2) whose gradients are summed between them — every gradient equals the float64 single-process
    stack's on all sixteen sequences, and the experts' reduction runs over edp, the rest over dp."""
    seq, batch = 8, 2
    per_rank = run_distributed(_ep_case, 4, MIXTRAL, "dp=4,ep=2", seq, batch, timeout_s=300)
    for r in per_rank:
        assert r["loss_err"] < 1e-12, r
        assert r["max_grad_x_err"] < 1e-10, r
        assert r["max_weight_grad_rel_err"] < 1e-9, r
        assert r["expert_grad_rel_err"] < 1e-9, r
        assert {"all_to_all/ep", "all_reduce/dp", "all_reduce/edp"} <= set(r["counts"]), r["counts"]


def test_expert_splits_keep_gate_and_up_rows_together():
    """etp=2 of an FFN of 4: rank 1 keeps gate rows 2, 3 and the matching up rows 6, 7 of [gate; up], and
    down's columns 2, 3 — its SwiGLU pairs each gate column with its own up column; ungated (Nemotron-H's
    squared ReLU) the up rows 2, 3 alone."""
    from meshplan.executor.layouts.splits import expert_splits

    gated, plain = expert_splits(4, gated=True), expert_splits(4, gated=False)
    assert gated["w_gate_up"].dim == 1 and gated["w_down"].dim == 2
    assert gated["w_gate_up"].indices(2, 1).tolist() == [2, 3, 6, 7]
    assert gated["w_down"].indices(2, 1).tolist() == [2, 3]
    assert plain["w_gate_up"].indices(2, 1).tolist() == [2, 3]


def test_each_copy_reaches_each_expert_shard_as_many_times_as_its_gradient_is_scaled():
    """tp=2 with etp=1 (and ep): both tensor ranks dispatch each copy to whole experts — twice; etp = tp:
    once per FFN slice; tp=4, etp=2: the two tensor ranks on each etp rank — twice; an etp group that
    gathers (over dp or sp ranks): every dispatch, tp of them; no expert axes: once."""
    from meshplan.executor.layouts.ep import copies_per_shard

    assert copies_per_shard(2, 1, True) == 2 and copies_per_shard(2, 2, True) == 1
    assert copies_per_shard(4, 2, True) == 2 and copies_per_shard(1, 2, True, gather=True) == 1
    assert copies_per_shard(2, 4, True, gather=True) == 2 and copies_per_shard(1, 1, False) == 1


def _uneven_rows(rank, world):
    from meshplan.executor.comm import GatherRows, ScatterRows

    mesh = build_mesh(parse_layout("sp=2,etp=2"))
    rows = [3, 1]  # rank 0 holds three rows, rank 1 one
    x = torch.full((rows[rank], 2), float(rank + 1), dtype=torch.float64, requires_grad=True)
    gathered = GatherRows.apply(x, mesh, "etp", rows)
    back = ScatterRows.apply(gathered * (rank + 1), mesh, "etp", rows)  # Σ_r (r + 1) · x = 3x
    back.sum().backward()
    return gathered.detach().tolist(), back.detach().tolist(), x.grad.tolist(), dict(mesh.counts)


def test_uneven_rows_gather_and_reduce_scatter_back():
    """The etp group's arrived copies differ in number: every rank gathers all of them rank-major, and the
    reduce-scatter sums each rank's rows over the group back onto it (the gather's gradient); counted as
    the all-gather's output and the reduce-scatter's input, 4 rows of 2 float64 each way."""
    per_rank = run_distributed(_uneven_rows, 2, timeout_s=120)
    for rank, (gathered, back, grad, counts) in enumerate(per_rank):
        assert gathered == [[1.0, 1.0]] * 3 + [[2.0, 2.0]]
        assert back == [[3.0 * (rank + 1)] * 2] * [3, 1][rank]
        # d back / d x through both: Σ_r (r + 1) = 3 for every element
        assert grad == [[3.0, 3.0]] * [3, 1][rank]
        assert counts == {"all_gather/etp": 2 * 4 * 2 * 8, "reduce_scatter/etp": 2 * 4 * 2 * 8}

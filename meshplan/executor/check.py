"""One rank's check of a layout against the single-process reference (used by tests and CPU runs):
outputs, input and weight gradients, collective bytes against the cost model, saved activations
against the memory model."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from meshplan.costmodel.memory import saved_activation_bytes
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.schedule import step_schedule
from meshplan.executor.blocks import Stack
from meshplan.executor.comm import build_mesh, shard_of
from meshplan.executor.layouts.common import select
from meshplan.executor.optim import MixedAdam, make_optimizer
from meshplan.executor.parallelize import (
    GradientSync,
    keep_caches,
    parallelize,
    run_layers,
    shard_weights,
    share_final_states,
    stage_of,
    token_positions,
)
from meshplan.executor.pipeline import Pipeline, stage_slice, through
from meshplan.executor.saved import count_saved_bytes
from meshplan.layout import Layout
from meshplan.models import ModelSpec


def mean_counts(results: list[dict]) -> dict[str, float]:
    """Each rank's counted bytes ("counts", by kind/axis) averaged over the ranks: what the cost model's
    per-rank schedule predicts."""
    out: dict[str, float] = defaultdict(float)
    for r in results:
        for key, value in r["counts"].items():
            out[key] += value / len(results)
    return dict(out)


def _mine(sync: GradientSync, p, whole):
    """What this rank holds of p's summed gradient: all of it, or under ZeRO its shard (and the same
    slice of `whole`)."""
    if not sync.zero:
        return whole
    shard = sync.shard(p)
    if whole is p.grad:  # ZeRO 2 and 3 have dropped it: None
        return shard
    return _slice_of(sync, whole, p)


def _slice_of(sync: GradientSync, whole, p):
    """This rank's ZeRO slice of `whole`, cut as weight p's states are (GradientSync.group_of)."""
    _, n, rank = sync.group_of(p)
    return shard_of(whole, n, rank)


def _max_rel_err(layers, ref_layers, pick) -> float:
    """Largest relative difference between each local weight's quantity and the reference's:
    `pick(local weight, the reference's matching slice, that slice's gradient) -> (got, want)`."""
    errs = []
    for layer, ref_layer in zip(layers, ref_layers):
        ref_params = dict(ref_layer.named_parameters())
        for name, p in layer.named_parameters():
            ref_name, dim, idx = layer.index[name]
            full = ref_params[ref_name]
            want = select(full.detach(), dim, idx)
            grad = None if full.grad is None else select(full.grad, dim, idx)
            got, want = pick(p, want, grad)
            errs.append((got - want).abs().max().item() / (want.abs().max().item() + 1e-30))
    # NaN, where any weight's is: Python's max would drop it behind a finite one, and a check would pass
    return math.nan if any(math.isnan(e) for e in errs) else max(errs)


def check_layout(
    rank: int,
    world: int,
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    mode: str = "train",
    int8_allreduce: bool = False,
) -> dict:
    """With pipeline stages a training step runs the cost model's micro-batches of `batch` sequences
    each; the reference runs them all at once."""
    from dataclasses import replace

    model = replace(model, param_dtype="fp32")  # the run is float64: predictions in fp32, scaled by 2 below
    if mode == "decode":
        return _check_decode(rank, model, layout, seq, batch)
    opts = CostOptions(mode=mode, act_dtype="fp32", grad_dtype="fp32", int8_allreduce=int8_allreduce)
    train = mode == "train"
    m = opts.microbatches_for(layout.pp) if train else 1
    torch.manual_seed(0)
    ref = Stack(model, model.layers).double()
    x = torch.randn(m * batch, seq, model.d_model, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(m * batch, seq, model.d_model, dtype=torch.float64)
    y_ref = run_layers(ref.layers, x)
    (y_ref * weight).sum().backward()

    mesh = build_mesh(layout)
    layers, ref_layers, pipe = _stage(model, mesh, seq, ref, int8_allreduce)
    pos = token_positions(mesh, seq, ref)
    mb = [slice(i * batch, (i + 1) * batch) for i in range(m)]
    xs = [x.detach()[s][:, pos].clone().requires_grad_(train) for s in mb]
    result: dict = {"rank": rank}
    if train:
        params = list(layers.parameters())
        weights = shard_weights(layers, mesh)
        sync = GradientSync(layers, mesh, weights)
        if pipe is None:
            started = []  # gradient all-reduces begun when the backward reaches the input
            xs[0].register_hook(lambda g: started.append(sync.started))
            with count_saved_bytes(params) as saved:
                y = run_layers(layers, xs[0])
            (y * weight[:, pos]).sum().backward()
            result["grad_reductions_before_input_grad"] = started[0]
            result["grad_reductions_of_later_layers"] = sum(
                1 for p in sync.order if all(p is not q for q in layers[0].parameters())
            )
            outs, grads = [y.detach()], [xs[0].grad]
        else:
            with count_saved_bytes(params) as saved:  # one micro-batch through this stage, on its own
                run_layers(layers, xs[0].detach().requires_grad_())
            mesh.reset_counts()  # (its collectives are not the step's)
            grads, outs = pipe.train(xs, [weight[s][:, pos] for s in mb], sync)
        sync.finish()
        result["saved_bytes"] = saved["bytes"]
        result["max_grad_x_err"] = max(
            [(g - x.grad[s][:, pos]).abs().max().item() for g, s in zip(grads, mb)], default=0.0
        )
        result["max_weight_grad_rel_err"] = _max_rel_err(
            layers, ref_layers, lambda p, want, grad: (_mine(sync, p, p.grad), _mine(sync, p, grad))
        )
        if sync.zero:  # the sharded step against MixedAdam's on the reference's whole gradients
            opt = make_optimizer(layers.parameters(), sync)
            opt.step()
            MixedAdam(ref.parameters()).step()
            result["max_weight_after_step_rel_err"] = _max_rel_err(
                layers,
                ref_layers,
                lambda p, want, grad: (weights.shard(p), _slice_of(sync, want, p)) if weights else (p, want),
            )
    else:
        shard_weights(layers, mesh)
        with torch.no_grad():
            y = through(layers, pipe, xs[0])
        outs = [] if y is None else [y]
    errs = [(y.detach() - y_ref.detach()[s][:, pos]).abs().max().item() for y, s in zip(outs, mb)]
    result["max_out_err"] = max(errs, default=0.0)
    result["max_out_rel_err"] = result["max_out_err"] / y_ref.detach().abs().max().item()
    result["counts"] = dict(mesh.counts)
    # The reference runs in float64: scale the fp32 predictions by 2 (every counted tensor is float64).
    schedule = step_schedule(model, layout, seq, batch, opts, embeddings=False)
    # Every float the run moves is float64, twice the fp32 prediction; int8 payloads (and their fp32
    # scales) are the same size in any run.
    predicted = schedule.bytes_by_kind_and_axis(message=True)
    result["predicted_counts"] = {
        k: v if k.startswith(("all_to_all", "all_gather")) and int8_allreduce else 2 * v for k, v in predicted.items()
    }
    if train:
        result["predicted_saved_bytes"] = (
            2 * saved_activation_bytes(model, layout, seq, batch, opts, layers_fraction=1 / layout.pp)[0]
        )
    return result


def _stage(model: ModelSpec, mesh, seq: int, ref: Stack, int8_allreduce: bool = False):
    """This rank's sharded layers (its pipeline stage's, cut from a stack built like `ref`), the
    reference layers they come from, and the pipeline (None without pp)."""
    torch.manual_seed(0)
    stack = stage_of(Stack(model, model.layers).double(), mesh)  # the same weights as ref's
    cut = stage_slice(model.layers, mesh.layout.pp, mesh.axis("pp").rank) if mesh.layout.pp > 1 else slice(None)
    layers = parallelize(stack, mesh, seq, int8_allreduce)
    return layers, list(ref.layers)[cut], Pipeline(layers, mesh, run_layers) if mesh.layout.pp > 1 else None


DECODE_STEPS = 3


def _check_decode(rank: int, model: ModelSpec, layout: Layout, seq: int, batch: int) -> dict:
    """Prefill `seq` tokens, then decode DECODE_STEPS more one at a time; each decoded output against
    the single-process forward over all seq + DECODE_STEPS tokens."""
    torch.manual_seed(0)
    ref = Stack(model, model.layers).double()
    total = seq + DECODE_STEPS
    x = torch.randn(batch, total, model.d_model, dtype=torch.float64)
    with torch.no_grad():
        y_ref = run_layers(ref.layers, x)
    mesh = build_mesh(layout)
    layers, _, pipe = _stage(model, mesh, seq, ref)
    shard_weights(layers, mesh)  # ZeRO 3: its hooks gather the weights around each use
    pos = token_positions(mesh, seq, ref)
    keep_caches(layers, True)
    with torch.no_grad():
        through(layers, pipe, x[:, :seq][:, pos])
    keep_caches(layers, False)
    share_final_states(layers)
    mesh.reset_counts()
    errs = []
    for i in range(DECODE_STEPS):
        h = through(layers, pipe, x[:, seq + i : seq + i + 1], lambda layer, h: layer.decode(h))
        if h is not None:
            errs.append((h - y_ref[:, seq + i : seq + i + 1]).abs().max().item())
    opts = CostOptions(mode="decode", act_dtype="fp32", grad_dtype="fp32")
    schedule = step_schedule(model, layout, seq, batch, opts, embeddings=False)
    return {
        "rank": rank,
        "max_out_err": max(errs, default=0.0),
        "counts": {k: v / DECODE_STEPS for k, v in mesh.counts.items()},
        "predicted_counts": {k: 2 * v for k, v in schedule.bytes_by_kind_and_axis(message=True).items()},
    }

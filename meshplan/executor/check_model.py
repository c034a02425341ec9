"""One rank's check of the whole model (tokens → loss) on a layout against the single-process float64
reference (meshplan.executor.model.CausalLM, torch's own cross-entropy over all the logits): the
loss, every weight's gradient (embedding and head included) and the optimizer step; the next token's
log-probabilities after a prefill and after each decoded token; collective bytes against the cost
model's schedule with its embedding and loss terms; saved activations against the memory model."""

from __future__ import annotations

from dataclasses import replace

import torch

from meshplan.costmodel.axes import sharding_for
from meshplan.costmodel.axes.pp import stream_width
from meshplan.costmodel.memory import head_activation_bytes, loss_logits_bytes, saved_activation_bytes
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.schedule import step_schedule
from meshplan.executor.check import _max_rel_err, _mine, _slice_of
from meshplan.executor.checkpoint import load_into
from meshplan.executor.comm import build_mesh
from meshplan.executor.layouts.vocab import ParallelHead
from meshplan.executor.model import CausalLM, synthetic_tokens
from meshplan.executor.optim import MixedAdam, make_optimizer
from meshplan.executor.parallelize import (
    GradientSync,
    keep_caches,
    parallelize_model,
    run_layers,
    set_documents,
    shard_weights,
    share_final_states,
    unique_params,
)
from meshplan.executor.pipeline import Pipeline, through
from meshplan.executor.saved import count_saved_bytes
from meshplan.layout import Layout
from meshplan.models import ModelSpec

DECODE_STEPS = 3


def packed_documents(batch: int, seq: int) -> torch.Tensor:
    """(batch, seq) document ids for the packed checks, for seq 16 and shards of 8 or 4: row 0 has a
    document that continues into the second half and ends inside it, and a last document shorter
    than the conv window; row 1 starts a document exactly at the half."""
    rows = [[0] * 6 + [1] * 5 + [2] * 3 + [3] * 2, [0] * 6 + [1] * 2 + [2] * 3 + [3] * 5]
    ids = torch.tensor([rows[i % 2] for i in range(batch)])
    if ids.shape[1] != seq:
        raise ValueError(f"packed_documents is written for seq 16, not {seq}")
    return ids


def _build(model: ModelSpec, layout: Layout, seq: int, batch: int, t_local: int, weights: str | None = None):
    """The reference, this rank's modules (cut from a model built with the same weights), the
    reference modules they come from, and the pipeline (None without pp). `weights`: a checkpoint
    folder both read, the reference whole and each module its own slices."""
    torch.manual_seed(0)
    ref = CausalLM(model).double()
    mesh = build_mesh(layout)
    torch.manual_seed(0)
    mods = parallelize_model(CausalLM(model).double(), mesh, seq)
    if weights is not None:
        load_into([ref], weights, model)
        load_into(mods, weights, model)
    pp = layout.pp
    ref_mods = [ref.get_submodule(m.origin) for m in mods]  # the reference module each came from
    like = torch.empty(batch, t_local, stream_width(model), dtype=torch.float64)  # Zamba2's: its embeddings too
    pipe = Pipeline(mods, mesh, run_layers, like=like) if pp > 1 else None
    return ref, mesh, mods, ref_mods, pipe


def _predicted_counts(model, layout, seq, batch, opts) -> dict:
    # Every float the run moves is float64: twice the fp32 prediction.
    return {
        k: 2 * v for k, v in step_schedule(model, layout, seq, batch, opts).bytes_by_kind_and_axis(message=True).items()
    }


def check_model(
    rank: int,
    world: int,
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    mode: str = "train",
    *,
    weights: str | None = None,
    packed: bool = False,
) -> dict:
    """`weights`: a checkpoint folder (executor.checkpoint) instead of the seeded random weights; the
    result then also holds the reference's mean loss ("ref_loss") for a check against another library.
    `packed`: each row holds several documents (packed_documents), which the Mamba-2 blocks keep apart."""
    model = replace(model, param_dtype="fp32")
    opts = CostOptions(mode=mode, act_dtype="fp32", grad_dtype="fp32")
    if mode == "decode":
        return _check_decode(rank, model, layout, seq, batch, opts, weights, packed)
    train = mode == "train"
    m = opts.microbatches_for(layout.pp) if train else 1
    tokens, labels = synthetic_tokens(model.vocab, m * batch, seq, generator=torch.Generator().manual_seed(1))
    ref, mesh, mods, ref_mods, pipe = _build(model, layout, seq, batch, seq // layout.token_shard_degree, weights)
    head = mods[-1] if isinstance(mods[-1], ParallelHead) else None
    mb = [slice(i * batch, (i + 1) * batch) for i in range(m)]
    docs = packed_documents(batch, seq) if packed else None  # every micro-batch packs alike
    set_documents(mods, docs)
    ref_docs = docs.repeat(m, 1) if packed else None
    result: dict = {"rank": rank}
    if train:
        ref_losses = ref.token_losses(tokens, labels, ref_docs)
        ref_losses.mean().backward()
        result["ref_loss"] = float(ref_losses.mean())
        weights = shard_weights(mods, mesh)
        sync = GradientSync(mods, mesh, weights, tied=model.tied_embeddings)
        params = unique_params(mods)
        if head is not None:
            head.scale = 1.0 / (m * batch * seq)
        if pipe is None:
            head.labels = [labels[mb[0]]]
            with count_saved_bytes(params) as saved:
                loss = run_layers(mods, tokens[mb[0]])
            loss.backward()
            losses = [loss.detach()]
        else:
            # One micro-batch through this stage on its own, for its saved bytes (not the step's traffic).
            inp = tokens[mb[0]] if pipe.first else pipe.like.clone().normal_().requires_grad_()
            if head is not None:
                head.labels = [labels[mb[0]]]
            with count_saved_bytes(params) as saved:
                run_layers(mods, inp)
            mesh.reset_counts()
            if head is not None:
                head.labels = [labels[s] for s in mb]
            ones = [torch.ones((), dtype=torch.float64)] * m
            _, losses = pipe.train([tokens[s] for s in mb], ones, sync)
        sync.finish()
        if head is not None:
            want = ref_losses.detach()[:, head.positions].sum() / (m * batch * seq)
            result["loss_err"] = abs(float(sum(losses)) - float(want))
        result["saved_bytes"] = saved["bytes"]
        result["max_weight_grad_rel_err"] = _max_rel_err(
            mods, ref_mods, lambda p, want, grad: (_mine(sync, p, p.grad), _mine(sync, p, grad))
        )
        if sync.zero:
            make_optimizer(mods.parameters(), sync).step()
            MixedAdam(ref.parameters()).step()
            result["max_weight_after_step_rel_err"] = _max_rel_err(
                mods,
                ref_mods,
                lambda p, want, grad: (weights.shard(p), _slice_of(sync, want, p)) if weights else (p, want),
            )
        sh = sharding_for(layout, opts)
        layers_saved = saved_activation_bytes(model, layout, seq, batch, opts, layers_fraction=1 / layout.pp)[0]
        ends = (
            head_activation_bytes(model, sh, seq, batch, opts) + loss_logits_bytes(model, sh, seq, batch, opts)
            if head is not None
            else 0.0
        )
        result["predicted_saved_bytes"] = 2 * (layers_saved + ends)
    else:
        shard_weights(mods, mesh)
        with torch.no_grad():
            got = through(mods, pipe, tokens)
            want = ref.next_token_logprobs(tokens, ref_docs)
        result["max_out_err"] = _logprob_err(got, want, head)
    result["counts"] = dict(mesh.counts)
    result["predicted_counts"] = _predicted_counts(model, layout, seq, batch, opts)
    return result


def _logprob_err(got, want, head) -> float:
    """Largest difference between a rank's log-probabilities (its vocabulary slice; none on a rank
    that holds no last position) and the reference's."""
    if head is None or got is None or got.numel() == 0:
        return 0.0
    return (got - want[:, head.start : head.start + got.shape[-1]]).abs().max().item()


def _check_decode(
    rank: int,
    model: ModelSpec,
    layout: Layout,
    seq: int,
    batch: int,
    opts: CostOptions,
    weights: str | None = None,
    packed: bool = False,
) -> dict:
    """Prefill `seq` tokens, then decode DECODE_STEPS more one at a time; each step's log-probabilities
    against the reference's over all the tokens so far."""
    tokens, _ = synthetic_tokens(model.vocab, batch, seq + DECODE_STEPS, generator=torch.Generator().manual_seed(1))
    ref, mesh, mods, _, pipe = _build(model, layout, seq, batch, seq // layout.token_shard_degree, weights)
    head = mods[-1] if isinstance(mods[-1], ParallelHead) else None
    shard_weights(mods, mesh)
    docs = packed_documents(batch, seq) if packed else None
    set_documents(mods, docs)
    # The decoded tokens continue the last document.
    all_docs = torch.cat([docs, docs[:, -1:].expand(-1, DECODE_STEPS)], 1) if packed else None
    keep_caches(mods, True)
    with torch.no_grad():
        through(mods, pipe, tokens[:, :seq])
    keep_caches(mods, False)
    share_final_states(mods)
    if pipe is not None:
        pipe.like = torch.empty(batch, 1, stream_width(model), dtype=torch.float64)
    mesh.reset_counts()
    errs = []
    with torch.no_grad():
        for i in range(DECODE_STEPS):
            got = through(mods, pipe, tokens[:, seq + i : seq + i + 1], lambda mod, h: mod.decode(h))
            upto = all_docs[:, : seq + i + 1] if packed else None
            errs.append(_logprob_err(got, ref.next_token_logprobs(tokens[:, : seq + i + 1], upto), head))
    return {
        "rank": rank,
        "max_out_err": max(errs),
        "counts": {k: v / DECODE_STEPS for k, v in mesh.counts.items()},
        "predicted_counts": _predicted_counts(model, layout, seq, batch, opts),
    }

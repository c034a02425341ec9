"""The whole mixture-of-experts model through the executor (issue #32): token embedding, decoder layers
whose MLP is the MoE (Mixtral's routed experts; Qwen2-MoE's shared expert behind its sigmoid gate and
top-k probabilities left un-renormalised), final norm, head and loss, on dp × ep (× pp) in gloo
processes against the single-process float64 model — the loss, every weight's gradient, ZeRO's
optimizer step with the experts' states over edp, the log-probabilities after a prefill and each
decoded token — and the counted bytes equal to the cost model's schedule, per kind and axis; beside a
tensor axis (ep with tp, etp=1), a sequence axis (ep with sp) and under TSP too, and with each expert
split over etp (within the tensor ranks, or over sequence or data ranks). The single-process model
against transformers' MixtralForCausalLM and Qwen2MoeForCausalLM with the same (checkpoint) weights;
`meshplan execute` on a Mixtral checkpoint end to end; what is not run, refused in one line."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.costmodel.options import CostOptions
from meshplan.executor.check import mean_counts
from meshplan.executor.check_model import check_model
from meshplan.executor.checkpoint import load_into
from meshplan.executor.distributed import run_distributed
from meshplan.executor.model import CausalLM
from meshplan.executor.support import unsupported
from meshplan.hf_config import load_model
from meshplan.layout import parse_layout
from meshplan.models import (
    NEMOTRON_H_KINDS,
    PRESETS,
    AttentionSpec,
    Mamba2Spec,
    MlpSpec,
    ModelSpec,
    MoeSpec,
    RopeSpec,
    dense,
    moe,
)

MIXTRAL = moe(dense("tiny-mixtral", 64, 2, 8, 4, 128, 100), MoeSpec(64, 4, 2, 128))
# Qwen2-MoE's shape: a shared expert of 96 behind a sigmoid gate, the top-k probabilities as they are.
QWEN2_MOE = moe(
    dense("tiny-qwen2-moe", 64, 2, 8, 4, 128, 100),
    MoeSpec(64, 4, 2, 64, shared_ffn=96, shared_gate=True, norm_topk=False),
)
# Qwen3-MoE's shape: more, narrower experts, the top-k probabilities renormalised, no shared expert, and
# an RMS norm of each query and key head (a head_dim scale each) before the rotary.
_QWEN3_DENSE = dense("tiny-qwen3-moe", 64, 2, 8, 4, 128, 100)
QWEN3_MOE = moe(replace(_QWEN3_DENSE, attention=replace(_QWEN3_DENSE.attention, qk_norm=2 * 8)), MoeSpec(64, 8, 2, 32))
# Nemotron-H's shape (tests/test_nemotron_h_executor.py holds it against transformers): one block a
# layer — Mamba-2, attention without rotary positions, a squared-ReLU MLP, an MoE of ungated squared-ReLU
# experts with a shared expert behind the sigmoid router of two expert groups (one searched), its
# weights renormalised and scaled.
NEMOTRON_H = ModelSpec(
    name="tiny-nemotron-h",
    family="mixed",
    d_model=64,
    layers=6,
    vocab=64,
    mamba2=Mamba2Spec(64, d_state=16, expand=2, headdim=16, ngroups=2, d_conv=4, chunk_size=8, d_inner_width=128),
    attention=AttentionSpec(64, 4, 2, 16, 64),
    mlp=MlpSpec(64, 96, gated=False, relu2=True),
    moe=MoeSpec(64, 8, 2, 32, gated=False, shared_ffn=48, score="sigmoid", expert_groups=2, routed_scaling=2.5),
    layer_kinds=tuple(NEMOTRON_H_KINDS[c] for c in "M*E-EM"),
    rope=RopeSpec(kind="none"),
)
ALL_MODES = ("train", "prefill", "decode")
# (processes, model, [(layout, modes)]): dp=2,ep=2 holds each expert on one rank (edp = 1); dp=2 (no ep)
# every expert on both; dp=4,ep=2
# on two (edp = 2), whose gradients — and under ZeRO optimizer states — are summed and split there.
CASES = {
    "mixtral-2": (
        2,
        MIXTRAL,
        # dp=2 without ep: every rank holds every expert, whose gradients are summed over dp as any weight's
        [("dp=2,ep=2", ALL_MODES), ("dp=2,ep=2,zero=1", ("train",)), ("dp=2", ("train",)), ("dp=2,zero=1", ("train",))],
    ),
    "qwen2-moe-4": (
        4,
        QWEN2_MOE,
        [("dp=4,ep=2", ALL_MODES), ("dp=4,ep=2,zero=2", ("train",)), ("dp=2,pp=2,ep=2,zero=1", ("train",))],
    ),
    # Beside a tensor axis (etp=1: each tensor rank routes all its tokens to whole experts; the shared
    # expert split as a dense MLP), a sequence axis (each rank routes its own tokens) and TSP (the router
    # streamed around its ring).
    "mixtral-tp-sp-tsp-2": (
        2,
        MIXTRAL,
        [("tp=2,ep=2,etp=1", ALL_MODES), ("sp=2,ep=2", ALL_MODES), ("tsp=2,ep=2", ALL_MODES)],
    ),
    "qwen2-moe-tp-sp-4": (
        4,
        QWEN2_MOE,
        [
            ("dp=2,tp=2,ep=2,etp=1", ALL_MODES),
            ("dp=2,tp=2,ep=2,etp=1,zero=1", ("train",)),
            ("tp=2,sp=2,ep=2,etp=1", ("train",)),
            # TSP streams the shared expert around its ring as a dense MLP, its sigmoid gate's columns too
            ("dp=2,tsp=2,ep=2", ("train", "decode")),
        ],
    ),
    # Qwen3-MoE's query/key norms: whole on every rank; their gradients summed over tp (each tensor rank's
    # from its heads, before ZeRO's reductions), over tsp (each rank's from its tokens) and over dp / sp.
    "qwen3-moe-2": (
        2,
        QWEN3_MOE,
        [
            ("dp=2,ep=2", ALL_MODES),
            ("tp=2,ep=2,etp=1", ALL_MODES),
            ("sp=2,ep=2", ("train",)),
            ("tsp=2,ep=2", ALL_MODES),
            ("pp=2", ("train", "decode")),
        ],
    ),
    "qwen3-moe-tp-sp-tsp-4": (
        4,
        QWEN3_MOE,
        [
            ("dp=2,tp=2,ep=4,etp=1", ALL_MODES),
            ("dp=2,tp=2,ep=2,etp=1,zero=2", ("train",)),
            ("dp=2,sp=2,ep=4", ALL_MODES),
            ("tsp=4,ep=4", ("train", "prefill")),
            ("dp=2,tsp=2,ep=2,zero=1", ("train",)),
        ],
    ),
    # Expert tensor parallelism (issue #32): each expert's [gate; up] rows and down columns split over
    # etp. Within the tensor ranks (tp=2: etp = tp by default; tp=4 with etp=2) the etp ranks route the
    # same tokens and all-reduce the partial outputs of their copies; over sp or dp ranks (sp=2,etp=2,
    # dp=2,etp=2; tp=2 with etp=4 reaching over dp) each gathers the group's copies and reduce-scatters
    # the outputs; etp=1 beside tp without ep keeps every expert whole on every tensor rank.
    "mixtral-etp-2": (
        2,
        MIXTRAL,
        [("tp=2", ALL_MODES), ("tp=2,etp=1", ("train",)), ("sp=2,etp=2", ALL_MODES), ("dp=2,etp=2", ("train",))],
    ),
    "qwen3-moe-etp-4": (
        4,
        QWEN3_MOE,
        [
            ("dp=2,tp=2,ep=2", ALL_MODES),
            ("dp=2,tp=2,ep=2,zero=1", ("train",)),
            ("tp=4,ep=2,etp=2", ("train", "decode")),
            ("dp=4,ep=2,etp=2,zero=2", ("train",)),
            ("dp=2,tp=2,etp=4", ("train",)),
            ("pp=2,tp=2", ("train",)),
        ],
    ),
    "qwen2-moe-etp-4": (
        4,
        QWEN2_MOE,
        [
            ("tp=2,sp=2,ep=2", ("train", "prefill")),
            ("dp=2,sp=2,ep=2,etp=2", ("train", "decode")),
            ("dp=4,etp=2,zero=2", ("train",)),  # edp = 2: the experts' gradients reduce-scattered there
        ],
    ),
    "nemotron-h-etp-2": (2, NEMOTRON_H, [("tp=2", ALL_MODES), ("sp=2,etp=2", ("train",))]),
    "nemotron-h-etp-4": (4, NEMOTRON_H, [("dp=2,tp=2,ep=2", ("train", "prefill")), ("dp=4,etp=2,zero=1", ("train",))]),
    # A mixed model (Nemotron-H's layers) on dp × ep: each expert on one rank (ep=2 of 2, ep=4 of 4), on
    # two of four (edp = 2, with ZeRO 2 over it), and every expert on every rank (no ep); beside a tensor
    # axis (the Mamba-2 heads, attention heads, MLP and shared-expert columns split, etp=1), a sequence
    # axis, both, two pipeline stages ("M*E" and "-EM"), and TSP (contiguous token shards, as the Mamba-2
    # blocks need; attention without a rotary; the squared-ReLU MLP, the shared expert and the router
    # streamed around the tsp ring, the routed experts split over ep) alone, beside dp with ZeRO 1 and
    # under two pipeline stages.
    "nemotron-h-2": (
        2,
        NEMOTRON_H,
        [
            ("dp=2,ep=2", ALL_MODES),
            ("dp=2,zero=1", ("train",)),
            ("tp=2,ep=2,etp=1", ALL_MODES),
            ("sp=2,ep=2", ALL_MODES),
            ("tsp=2,ep=2", ALL_MODES),
        ],
    ),
    "nemotron-h-4": (
        4,
        NEMOTRON_H,
        [
            ("dp=4,ep=4", ALL_MODES),
            ("dp=4,ep=2,zero=2", ("train",)),
            ("tp=2,sp=2,ep=2,etp=1", ("train", "prefill")),
            ("dp=2,pp=2,ep=2,zero=1", ("train",)),
            ("dp=2,tsp=2,ep=2,zero=1", ("train",)),
            ("pp=2,tsp=2,ep=2", ("train",)),
        ],
    ),
}
SEQ, BATCH, VOCAB = 16, 2, 64


def _run_all(rank, world, model, cases):
    return [
        (text, mode, check_model(rank, world, model, parse_layout(text), SEQ, BATCH, mode))
        for text, modes in cases
        for mode in modes
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_whole_moe_model_matches_single_process_and_the_cost_model(case):
    world, model, cases = CASES[case]
    per_rank = run_distributed(_run_all, world, model, cases, timeout_s=300)
    for i, (text, mode, _) in enumerate(per_rank[0]):
        results = [r[i][2] for r in per_rank]
        for r in results:
            if mode == "train":
                assert r.get("loss_err", 0.0) < 1e-12, (text, r)
                assert r["max_weight_grad_rel_err"] < 1e-9, (text, r)  # the experts' slices included
                if "zero" in text:
                    assert r["max_weight_after_step_rel_err"] < 1e-12, (text, r)
            else:
                assert r["max_out_err"] < 1e-10, (text, mode, r)
        layout = parse_layout(text)
        assert sum("loss_err" in r for r in results) == (world // layout.pp if mode == "train" else 0)
        # The routing is not even, but what the ranks receive sums to what they send: the ranks' mean
        # all-to-all bytes are the cost model's exactly, and every other collective is per rank.
        counted, predicted = mean_counts(results), results[0]["predicted_counts"]
        assert set(counted) == set(predicted), (text, mode, counted, predicted)
        for key, value in predicted.items():
            assert counted[key] == pytest.approx(value, rel=1e-12), (text, mode, key, counted, predicted)
        # etp ranks of one tensor group all-reduce the partial outputs where the copies were routed: every
        # rank's own T_d·k copies, the prediction on each rank whatever the routing
        if "all_reduce/etp" in predicted:
            assert all(r["counts"]["all_reduce/etp"] == predicted["all_reduce/etp"] for r in results), text
        if mode == "train" and layout.expert_axes and layout.expert_data_degree > 1:
            kinds = ("reduce_scatter/edp", "all_gather/edp") if layout.zero else ("all_reduce/edp",)
            assert all(k in counted for k in kinds), (text, counted)


def _perturbed(model):
    """Norm scales that are not all ones (a norm read from the wrong tensor shows), biases zero (the
    executor's attention has none), in float64, experts run by transformers' eager loop (its grouped
    GEMM takes no float64)."""
    torch.manual_seed(0)
    model = model.double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.config._experts_implementation = "eager"
    return model.eval()


SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=2,
    tie_word_embeddings=False,
    router_jitter_noise=0.0,
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-ckpt")
    torch.manual_seed(0)
    made = {
        "mixtral": MixtralForCausalLM(MixtralConfig(**SHAPE, intermediate_size=48, num_local_experts=4)),
        "qwen2_moe": Qwen2MoeForCausalLM(
            Qwen2MoeConfig(
                **SHAPE,
                intermediate_size=48,
                moe_intermediate_size=24,
                shared_expert_intermediate_size=40,
                num_experts=4,
                norm_topk_prob=False,
            )
        ),
        # Qwen3-MoE: each query and key head RMS-normed (self_attn.q_norm, k_norm) before the rotary
        "qwen3_moe": Qwen3MoeForCausalLM(
            Qwen3MoeConfig(
                **SHAPE,
                head_dim=8,
                intermediate_size=48,
                moe_intermediate_size=24,
                num_experts=4,
                norm_topk_prob=True,
            )
        ),
    }
    out = {}
    for name, model in made.items():
        model = _perturbed(model)
        model.save_pretrained(root / name, max_shard_size="40KB")  # several files and an index
        out[name] = (str(root / name), model)
    return out


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_the_model_reads_a_checkpoint_to_transformers_logits(checkpoints, name):
    """Every weight read once from the per-expert tensors transformers writes; the logits and the loss
    those of transformers' own model (its router's softmax runs in fp32: agreement to ~1e-8)."""
    folder, hf = checkpoints[name]
    spec = load_model(folder)
    assert spec.moe.norm_topk == (name != "qwen2_moe") and bool(spec.moe.shared_ffn) == (name == "qwen2_moe")
    assert spec.attention.qk_norm == (2 * 8 if name == "qwen3_moe" else 0)
    ref = CausalLM(spec).double()
    assert load_into([ref], folder, spec) == sum(p.numel() for p in ref.parameters()) * 8
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids).logits.double()
        got = ref.head.logits(ref.hidden(ids))
        assert (got - want).abs().max().item() < 1e-6 * want.abs().max().item()
        loss = ref.token_losses(ids[:, :-1], ids[:, 1:]).mean().item()
        assert loss == pytest.approx(hf(input_ids=ids, labels=ids).loss.item(), rel=1e-6)


@pytest.mark.parametrize(
    "name, layout, kinds",
    [
        ("mixtral", "dp=2,ep=2,zero=1", {"all_to_all/ep", "reduce_scatter/dp", "all_gather/dp"}),
        # the query/key norms' gradients summed over tp, each tensor rank's from its heads
        ("qwen3_moe", "tp=2,ep=2,etp=1", {"all_to_all/ep", "all_reduce/tp"}),
        # every expert split over etp = tp: each rank reads its FFN slice of [gate; up] and of down
        ("mixtral", "tp=2", {"all_reduce/etp", "all_reduce/tp"}),
    ],
)
def test_execute_trains_a_moe_checkpoint(checkpoints, tmp_path, name, layout, kinds):
    """`meshplan execute` on two gloo processes — Mixtral on dp=2,ep=2 with ZeRO 1, Qwen3-MoE (its
    query/key norms too) on tp=2,ep=2,etp=1: each rank reads its two experts (and its heads) from the
    files; the first batch's loss is transformers' on the same ids, and every collective's bytes equal
    the prediction the run file sets beside them (as the dense path's runs are compared)."""
    folder, hf = checkpoints[name]
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(7))
    np.save(tmp_path / "ids.npy", ids.numpy())
    out = tmp_path / "run.json"
    args = ["execute", "--model", folder, "--weights", folder, "--layout", layout]
    args += ["--seq", str(SEQ), "--batch", str(BATCH), "--nproc", "2", "--steps", "2", "--timeout", "120"]
    res = CliRunner().invoke(app, args + ["--tokens", str(tmp_path / "ids.npy"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads(out.read_text())
    assert run["status"] == "ok" and run["world"] == 2 and run["not_executed"] == []
    measured, predicted = run["measured"], run["predicted"]
    assert measured["comm_bytes"] == predicted["comm_bytes"]
    assert set(measured["comm_bytes"]) == kinds
    assert measured["step_time_s"] > 0 and predicted["peak_bytes"] > 0 and measured["saved_bytes"] > 0
    with torch.no_grad():
        want = hf(input_ids=ids, labels=ids).loss.item()
    assert measured["loss"] == pytest.approx(want, rel=1e-4)  # the run is fp32
    compared = CliRunner().invoke(app, ["compare", str(out), "--json"])
    rows = {row["quantity"]: row for row in json.loads(compared.stdout)["rows"]}
    assert all(rows[f"bytes {kind}"]["ok"] for kind in kinds), rows


@pytest.mark.parametrize(
    "model, layout, options, needle",
    [
        ("mixtral-8x7b", "tpssm=2,ep=2", None, "not with tpssm=2; drop tpssm"),
        ("mixtral-8x7b", "dp=4,ep=2,zero=3", None, "zero=2 or below"),
        ("mixtral-8x7b", "dp=2,ep=2", CostOptions(moe_dispatcher="allgather"), "moe_dispatcher: "),
        ("mixtral-8x7b", "dp=2,ep=2", CostOptions(capacity_factor=1.25), "capacity_factor: "),
        ("deepseek-v3", "dp=8,ep=8", None, "latent attention (MLA)"),
    ],
)
def test_what_the_moe_executor_does_not_run_is_one_line_naming_the_field(model, layout, options, needle):
    reason = unsupported(parse_layout(layout), PRESETS[model], options=options)
    assert reason is not None and needle in reason and "\n" not in reason, reason
    assert reason.split(":")[0] in ("layout", "model", "moe_dispatcher", "capacity_factor")
    with_dense = moe(dense("tiny-dense-first", 64, 2, 8, 4, 128, 100), MoeSpec(64, 4, 2, 128), dense_layer_ids=(0,))
    assert "dense MLPs on layers [0]" in unsupported(parse_layout("dp=2,ep=2"), with_dense)
    # the router's rows ring over tsp in equal shards: 6 experts on tsp=4 would leave two behind
    six = moe(dense("tiny-six-experts", 64, 2, 8, 4, 128, 100), MoeSpec(64, 6, 2, 128))
    assert "tsp=4 must divide tiny-six-experts's 6 experts" in unsupported(parse_layout("tsp=4,ep=2"), six)


@pytest.mark.parametrize(
    "layout",
    [
        "dp=8,ep=8",
        "dp=4,ep=2,zero=2",
        "dp=2,pp=2,ep=2,zero=1",
        "dp=2,ep=2",
        "dp=4,tp=2,ep=8,etp=1",
        "dp=2,sp=2,ep=4",
        "dp=2,tsp=4,ep=8",
        # expert tensor parallelism: within the tensor ranks, over dp or sp ranks, and reaching over both
        "dp=2,tp=2,ep=2",
        "dp=4,tp=2",
        "dp=2,tp=2,etp=1",
        "dp=4,ep=2,etp=2",
        "dp=2,sp=2,ep=2,etp=2,zero=2",
        "dp=4,tp=2,ep=2,etp=4,zero=1",
    ],
)
def test_what_the_moe_executor_runs(layout):
    assert unsupported(parse_layout(layout), PRESETS["mixtral-8x7b"], options=CostOptions()) is None
    assert unsupported(parse_layout(layout), PRESETS["qwen3-30b-a3b"]) is None


def test_shared_experts_run_under_tsp():
    """Behind Qwen2-MoE's sigmoid gate or Nemotron-H's ungated, each streamed around the tsp ring."""
    for model in (QWEN2_MOE, NEMOTRON_H):
        assert unsupported(parse_layout("tsp=2,ep=2"), model) is None
        assert unsupported(parse_layout("dp=2,tsp=2,ep=2,zero=1"), model) is None


def test_etp_under_tsp_is_refused_in_one_line():
    """TSP streams attention's weights and splits the experts by ep alone: `execute` refuses etp there
    before launching anything (the layout's own check), in one line naming the field and the fix."""
    args = ["execute", "--model", "mixtral-8x7b", "--layout", "tsp=2,ep=2,etp=2", "--seq", "64", "--nproc", "2"]
    res = CliRunner().invoke(app, args + ["--device", "cpu"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith("error: layout: under tsp the experts are split by ep alone; leave etp out")


def _packed_copy(folder, out, experts: int):
    """The checkpoint in `folder` with its per-expert tensors packed as transformers 5's modules hold
    them: gate_up_proj (E, 2f, h) = [w1; w3] of each expert, down_proj (E, h, f)."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    index = json.loads((Path(folder) / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for name, file in index.items():
        with safe_open(Path(folder) / file, "pt") as f:
            tensors[name] = f.get_tensor(name)
    packed = {}
    for name in list(tensors):
        if ".experts.0.w1.weight" in name:
            base = name.split(".experts.")[0] + ".experts"
            pick = [[tensors.pop(f"{base}.{e}.w{i}.weight") for e in range(experts)] for i in (1, 3, 2)]
            packed[f"{base}.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(pick[0], pick[1])])
            packed[f"{base}.down_proj"] = torch.stack(pick[2])
    save_file({**{k: v for k, v in tensors.items() if ".experts." not in k}, **packed}, str(out / "model.safetensors"))
    shutil.copy(Path(folder) / "config.json", out / "config.json")


def test_experts_split_over_etp_read_from_per_expert_and_packed_tensors(checkpoints, tmp_path):
    """A rank of ep=2, etp=2 holds experts 2, 3 and of each its FFN's second half: the same slice —
    [gate; up] rows of that half, down's columns — whether the checkpoint stores one tensor an expert
    (as transformers writes Mixtral) or the packed (E, …) ones of transformers 5's modules."""
    from meshplan.executor.checkpoint import Checkpoint, _read_expert_slices, checkpoint_names
    from meshplan.executor.layouts.common import select
    from meshplan.executor.layouts.splits import expert_splits

    folder, hf = checkpoints["mixtral"]
    _packed_copy(folder, tmp_path, 4)
    experts = hf.model.layers[1].mlp.experts  # transformers' own packed weights (E, 2f, h), (E, h, f)
    whole = {"moe.w_gate_up": experts.gate_up_proj.detach(), "moe.w_down": experts.down_proj.detach()}
    mine = torch.tensor([2, 3])
    for name, split in expert_splits(48, gated=True).items():
        dims, idx = (0, split.dim), (mine, split.indices(2, 1))
        want = select(whole[f"moe.{name}"], dims, idx)
        names = checkpoint_names("mixtral", f"stack.layers.1.moe.{name}", False, 4)
        for where in (folder, tmp_path):
            got = _read_expert_slices(Checkpoint(where), names, 4, dims, idx)
            assert torch.equal(got, want), (name, where)

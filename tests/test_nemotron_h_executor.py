"""A Nemotron-H-shaped model through the executor (issue #32): each layer one block behind its own norm
and residual — a Mamba-2 mixer, attention without rotary positions, a squared-ReLU MLP or a mixture of
ungated squared-ReLU experts with a shared expert behind the sigmoid, grouped router — read from a
config.json by meshplan.hf_config and built by the executor's single-process model, against
transformers' own NemotronHForCausalLM holding the same weights (an independent implementation: its
loss, logits and every weight's gradient). The model on dp × ep in gloo processes against the float64
single-process model and the cost model's bytes is a case of tests/test_moe_executor_model.py; what
is not run is refused in one line."""

import json
from dataclasses import replace

import pytest
import torch
from transformers import NemotronHConfig, NemotronHForCausalLM
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.executor.blocks import route
from meshplan.executor.model import CausalLM
from meshplan.executor.support import unsupported
from meshplan.hf_config import load_model
from meshplan.layout import parse_layout
from meshplan.models import PRESETS

# Every block kind, MoE layers both before and after the MLP; two expert groups of four, one searched
# (so the grouped choice matters), the weights renormalised and scaled as Nemotron 3 Nano's router does.
CONFIG = dict(
    vocab_size=64,
    hidden_size=64,
    hybrid_override_pattern="M*E-EM",
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    mamba_num_heads=8,
    mamba_head_dim=16,
    n_groups=2,
    ssm_state_size=16,
    conv_kernel=4,
    chunk_size=8,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=48,
    n_group=2,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    tie_word_embeddings=False,
)
SEQ, BATCH = 16, 2


def _theirs(ours: CausalLM, grads: bool = False) -> dict:
    """transformers' NemotronH state dict holding `ours`'s weights (names from its modeling file); with
    `grads`, their gradients in that layout (the buffer left out)."""

    def of(named):
        return {n: t.grad if grads else t for n, t in named if not grads or t.requires_grad}

    out = {"model.embeddings.weight": ours.embed.weight, "model.norm_f.weight": ours.head.final_norm.weight}
    out = of([*out.items(), ("lm_head.weight", ours.head.weight)])
    for i, layer in enumerate(ours.stack.layers):
        pre, mine = f"model.layers.{i}.", of([*layer.named_parameters(), *layer.named_buffers()])
        kind = CONFIG["hybrid_override_pattern"][i]
        if kind == "M":
            names = {"norm.weight": "norm.weight", "in_proj": "mixer.in_proj.weight", "conv_b": "mixer.conv1d.bias"}
            names |= {"dt_bias": "mixer.dt_bias", "a_log": "mixer.A_log", "d_skip": "mixer.D"}
            names |= {"norm_w": "mixer.norm.weight", "out_proj": "mixer.out_proj.weight"}
            out[pre + "mixer.conv1d.weight"] = mine["conv_w"].unsqueeze(1)
        elif kind == "*":
            q, k, v = mine["w_qkv"].split([64, 32, 32])
            out |= {pre + "mixer.q_proj.weight": q, pre + "mixer.k_proj.weight": k, pre + "mixer.v_proj.weight": v}
            names = {"attn_norm.weight": "norm.weight", "w_o": "mixer.o_proj.weight"}
        elif kind == "-":
            names = {
                "mlp_norm.weight": "norm.weight",
                "w_in": "mixer.up_proj.weight",
                "w_down": "mixer.down_proj.weight",
            }
        else:
            names = {"moe.mlp_norm.weight": "norm.weight", "moe.w_router": "mixer.gate.weight"}
            names |= {"moe.score_bias": "mixer.gate.e_score_correction_bias", "moe.w_gate_up": "mixer.experts.up_proj"}
            names |= {
                "moe.w_down": "mixer.experts.down_proj",
                "moe.w_shared_gate_up": "mixer.shared_experts.up_proj.weight",
            }
            names |= {"moe.w_shared_down": "mixer.shared_experts.down_proj.weight"}
        out |= {pre + theirs: mine[name] for name, theirs in names.items() if name in mine}
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A folder holding CONFIG as a user's config.json."""
    path = tmp_path_factory.mktemp("nemotron-h")
    (path / "config.json").write_text(json.dumps({"model_type": "nemotron_h", **CONFIG}))
    return str(path)


@pytest.fixture(scope="module")
def models(folder):
    """(our spec, our float64 model, transformers' float64 model with the same weights): norm scales and the
    router's correction bias not left at their defaults, so that one read from the wrong tensor shows."""
    spec = load_model(folder)
    torch.manual_seed(0)
    ours = CausalLM(spec).double()
    with torch.no_grad():
        for name, t in list(ours.named_parameters()) + list(ours.named_buffers()):
            if t.dim() == 1 and not name.endswith(("dt_bias", "a_log", "d_skip", "conv_b")):
                t.add_(0.1 * torch.randn_like(t))
    hf = NemotronHForCausalLM(NemotronHConfig(**CONFIG)).double()
    state = _theirs(ours)
    assert set(state) == set(hf.state_dict()), set(hf.state_dict()) ^ set(state)
    hf.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    hf.config._experts_implementation = "eager"  # its grouped GEMM takes no float64
    # transformers' NemotronHMamba2Mixer clamps dt from below at time_step_min (its time_step_limit is
    # (time_step_min, inf), not the config's time_step_limit (0, inf) that mamba_ssm's Mamba2 applies);
    # meshplan's Mamba-2 scan, as mamba_ssm's, does not clamp. Their config's limit here.
    for layer in hf.model.layers:
        if hasattr(layer.mixer, "time_step_limit"):
            layer.mixer.time_step_limit = (0.0, float("inf"))
    return spec, ours, hf.eval()


def test_the_config_reads_as_the_executor_builds_it(models):
    spec, ours, _ = models
    assert spec.family == "mixed" and spec.rope.kind == "none" and spec.mlp.relu2 and not spec.moe.gated
    moe = spec.moe
    assert (moe.score, moe.expert_groups, moe.topk_groups, moe.routed_scaling) == ("sigmoid", 2, 1, 2.5)
    kinds = [type(layer).__name__ for layer in ours.stack.layers]
    assert kinds == ["Mamba2Block", "AttentionLayer", "MoEOnlyLayer", "MlpLayer", "MoEOnlyLayer", "Mamba2Block"]
    # Parameters as the cost model counts them (the correction bias is a buffer, as in transformers)
    assert sum(p.numel() for p in ours.parameters()) == spec.embedding_params() + spec.layer_params()


def test_the_grouped_router_chooses_in_one_group_and_scales_the_weights(models):
    """Two groups of four experts, one searched: a token's two experts share a group (where the plain top
    two often would not), and its weights, renormalised, sum to routed_scaling_factor."""
    spec, ours, _ = models
    moe = ours.stack.layers[2].moe
    xn = torch.randn(256, CONFIG["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    weights, experts = route(xn, moe.w_router, spec.moe, moe.score_bias)
    assert bool((experts[:, 0] // 4 == experts[:, 1] // 4).all())
    assert torch.allclose(weights.sum(-1), torch.full((256,), 2.5, dtype=torch.float64))
    _, plain = route(xn, moe.w_router, replace(spec.moe, expert_groups=1), moe.score_bias)
    assert bool((plain[:, 0] // 4 != plain[:, 1] // 4).any())


def test_the_model_is_transformers_nemotron_h(models):
    """Loss, logits and every weight's gradient those of transformers' NemotronHForCausalLM. Its norms and
    router run in fp32 whatever the model's dtype: agreement to ~1e-7, not float64's."""
    _, ours, hf = models
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    want_logits = hf(input_ids=ids[:, :-1]).logits.double()
    got_logits = ours.head.logits(ours.hidden(ids[:, :-1]))
    assert (got_logits - want_logits).abs().max().item() < 1e-6 * want_logits.abs().max().item()
    hf.zero_grad()
    want = hf(input_ids=ids, labels=ids).loss  # transformers shifts the labels itself
    want.backward()
    ours.zero_grad()
    loss = ours.token_losses(ids[:, :-1], ids[:, 1:]).mean()
    loss.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)  # its loss is fp32
    theirs, grads = dict(hf.named_parameters()), _theirs(ours, grads=True)
    assert set(grads) == set(theirs)  # the correction bias: a buffer on both sides, no gradient
    for name, g in grads.items():
        want = theirs[name].grad
        assert (g - want).abs().max().item() < 1e-5 * want.abs().max().item(), name


@pytest.mark.parametrize(
    "layout, needle",
    [
        ("dp=4,tpssm=2,ep=2", "not tpssm=2; use tp, sp or tsp"),
        ("dp=4,ep=4,zero=3", "zero=2 or below"),
        ("dp=2,pp=3,ep=2", "pp=3 does not divide"),
    ],
)
def test_what_the_executor_does_not_run_of_nemotron_h_is_one_line(layout, needle):
    reason = unsupported(parse_layout(layout), PRESETS["nemotron-3-nano"])
    assert reason is not None and needle in reason and "\n" not in reason, reason
    assert reason.split(":")[0] in ("layout", "model")


def test_mixed_layers_of_several_blocks_are_refused_in_one_line(tmp_path):
    """Granite 4.0-H's layers (a Mamba-2 mixer and an MoE in one layer) are not Nemotron-H's."""
    granite = dict(model_type="granitemoehybrid", vocab_size=64, hidden_size=64, num_hidden_layers=2)
    granite |= dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, num_local_experts=4)
    granite |= dict(num_experts_per_tok=2, shared_intermediate_size=32, layer_types=["mamba", "attention"])
    granite |= dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16)
    (tmp_path / "config.json").write_text(json.dumps(granite))
    reason = unsupported(parse_layout("dp=2,ep=2"), load_model(str(tmp_path)))
    assert reason.startswith("model: the executor builds mixed models of one block a layer") and "\n" not in reason


@pytest.mark.parametrize(
    "layout",
    ["dp=8,ep=8", "dp=4,ep=2,zero=2", "dp=2", "dp=8,ep=4,zero=1", "dp=2,tp=2,ep=4,etp=1", "dp=2,sp=2,ep=4"]
    + ["dp=2,pp=2,ep=4,zero=1", "tp=2,sp=2,ep=4,etp=1", "tsp=2,ep=2", "dp=4,tsp=2,ep=8,zero=1"]
    + ["dp=2,tp=2,ep=2", "dp=2,tp=2,etp=1", "dp=4,ep=2,etp=2"],
)
def test_what_the_executor_runs_of_nemotron_h(layout):
    assert unsupported(parse_layout(layout), PRESETS["nemotron-3-nano"]) is None


def test_execute_runs_a_nemotron_h_config_on_dp_ep_zero(folder, tmp_path):
    """`meshplan execute` on two gloo processes, dp=2,ep=2 with ZeRO 1, from the config.json (random
    weights): nothing of the model left out, and every collective's bytes the prediction's."""
    out = tmp_path / "run.json"
    args = ["execute", "--model", folder, "--nproc", "2"]
    args += ["--layout", "dp=2,ep=2,zero=1", "--seq", str(SEQ), "--batch", str(BATCH), "--steps", "2"]
    res = CliRunner().invoke(app, args + ["--timeout", "120", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads(out.read_text())
    assert run["status"] == "ok" and run["world"] == 2 and run["not_executed"] == []
    measured, predicted = run["measured"], run["predicted"]
    assert measured["comm_bytes"] == predicted["comm_bytes"]
    assert set(measured["comm_bytes"]) == {"all_to_all/ep", "reduce_scatter/dp", "all_gather/dp"}

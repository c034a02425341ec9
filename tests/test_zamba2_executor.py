"""Zamba2 through the executor (issue #32): Mamba-2 layers, some of which first run one of the shared
transformer blocks on concat(hidden, token embeddings) — attention (scores scaled by (head_dim/2)^-½,
rotary with use_mem_rope) then a GeGLU MLP, no residual inside — whose output, through the layer's own
linear, is added to its Mamba-2 block's input; each invocation with its own LoRA adapters on the MLP's
[gate; up] (and on Q, K, V with use_shared_attention_adapter). Read from a config.json by
meshplan.hf_config and built by the executor's single-process model, against transformers' own
Zamba2ForCausalLM holding the same weights (an independent implementation: its loss, logits and
every weight's gradient)."""

import contextlib
import json

import pytest
import torch
from torch import nn
from transformers import Zamba2Config, Zamba2ForCausalLM

from meshplan.executor.blocks import HybridLayer
from meshplan.executor.model import CausalLM
from meshplan.hf_config import load_model

# Two shared copies used in turn by three hybrid layers (the third invokes the first copy again), a
# plain Mamba-2 layer first and between; grouped Mamba-2 B/C; chunks shorter than the sequence.
BASE = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=5,
    layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "hybrid"],
    num_mem_blocks=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=48,
    adapter_rank=4,
    n_mamba_heads=8,
    mamba_ngroups=2,
    mamba_d_state=16,
    mamba_d_conv=4,
    chunk_size=8,
    tie_word_embeddings=True,
    pad_token_id=None,  # no frozen embedding row (nn.Embedding's padding_idx): the executor trains every row
)
# Zamba2-7B's shape of options (no attention adapters, no rotary), and Zamba2-1.2B's (both).
CONFIGS = {
    "7b-like": dict(BASE, use_shared_attention_adapter=False, use_mem_rope=False, hidden_act="gelu"),
    "1.2b-like": dict(BASE, use_shared_attention_adapter=True, use_mem_rope=True, hidden_act="gelu"),
    # Six layers for two pipeline stages: the first copy invoked on both (layers 1 and 5), the second
    # on the second stage alone (layer 3); SwiGLU.
    "6-layer": dict(
        BASE,
        num_hidden_layers=6,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "mamba", "hybrid"],
        use_shared_attention_adapter=True,
        use_mem_rope=True,
        hidden_act="silu",
    ),
}
SEQ, BATCH = 16, 2


def hybrid_ids(config: dict) -> list[int]:
    return [i for i, t in enumerate(config["layers_block_type"]) if t == "hybrid"]


def theirs(ours: CausalLM, config: dict, grads: bool = False) -> dict:
    """transformers' Zamba2 state dict holding `ours`'s weights (names from its modeling file: a tied
    shared block appears under every hybrid layer that invokes it, with every adapter of its copy); with
    `grads`, their gradients in that layout."""

    def of(t):
        return t.grad if grads else t

    out = {"model.embed_tokens.weight": of(ours.embed.weight), "lm_head.weight": of(ours.head.weight)}
    out["model.final_layernorm.weight"] = of(ours.head.final_norm.weight)
    ids, copies = hybrid_ids(config), config["num_mem_blocks"]
    hybrids = [ours.stack.layers[i] for i in ids]
    for i, layer in enumerate(ours.stack.layers):
        hybrid = isinstance(layer, HybridLayer)
        pre = f"model.layers.{i}." + ("mamba_decoder." if hybrid else "")
        mamba = {"in_proj": "in_proj.weight", "conv_b": "conv1d.bias", "dt_bias": "dt_bias", "a_log": "A_log"}
        mamba |= {"d_skip": "D", "norm_w": "norm.weight", "out_proj": "out_proj.weight"}
        out |= {pre + "mamba." + name: of(getattr(layer, mine)) for mine, name in mamba.items()}
        out[pre + "mamba.conv1d.weight"] = of(layer.conv_w).unsqueeze(1)
        out[pre + "input_layernorm.weight"] = of(layer.norm.weight)
        if not hybrid:
            continue
        pre, block = f"model.layers.{i}.", layer.block
        out[pre + "linear.weight"] = of(layer.linear)
        st = pre + "shared_transformer."
        q, k, v = of(block.w_qkv).split([block.heads * block.head_dim, *2 * [block.kv_heads * block.head_dim]])
        out |= {st + "self_attn.q_proj.weight": q, st + "self_attn.k_proj.weight": k, st + "self_attn.v_proj.weight": v}
        out[st + "self_attn.o_proj.weight"] = of(block.w_o)
        out[st + "input_layernorm.weight"] = of(block.attn_norm.weight)
        out[st + "pre_ff_layernorm.weight"] = of(block.mlp_norm.weight)
        out[st + "feed_forward.gate_up_proj.weight"] = of(block.w_in)
        out[st + "feed_forward.down_proj.weight"] = of(block.w_down)
        for n, user in enumerate(hybrids):  # every adapter of this copy, each in its invocation's slot
            if n % copies != layer.copy:
                continue
            ff = f"{st}feed_forward.gate_up_proj_adapter_list.{n}."
            out |= {ff + "0.weight": of(user.mlp_adapter_down), ff + "1.weight": of(user.mlp_adapter_up)}
            if config["use_shared_attention_adapter"]:
                downs = of(user.qkv_adapter_down).chunk(3)
                for part, down, up in zip("qkv", downs, (user.q_adapter_up, user.k_adapter_up, user.v_adapter_up)):
                    at = f"{st}self_attn.linear_{part}_adapter_list.{n}."
                    out |= {at + "0.weight": down, at + "1.weight": of(up)}
    return out


def _folder(tmp_path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "zamba2", **config}))
    return str(tmp_path)


def models(tmp_path, name: str):
    """(config, our spec, our float64 model, transformers' float64 model with the same weights): norm
    scales not left at their ones, so that one read from the wrong tensor shows."""
    config = CONFIGS[name]
    spec = load_model(_folder(tmp_path, config))
    torch.manual_seed(0)
    ours = CausalLM(spec).double()
    with torch.no_grad():
        for pname, t in ours.named_parameters():
            if t.dim() == 1 and not pname.endswith(("dt_bias", "a_log", "d_skip", "conv_b")):
                t.add_(0.1 * torch.randn_like(t))
    hf = Zamba2ForCausalLM(Zamba2Config(**config)).double()
    state = theirs(ours, config)
    assert set(state) == set(hf.state_dict()), set(hf.state_dict()) ^ set(state)
    hf.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    # transformers' Zamba2MambaMixer clamps dt from below at time_step_min (its time_step_limit);
    # meshplan's Mamba-2 scan, as mamba_ssm's Mamba2 with the default dt_limit, does not clamp.
    for layer in hf.model.layers:
        mixer = layer.mamba_decoder.mamba if hasattr(layer, "mamba_decoder") else layer.mamba
        mixer.time_step_limit = (0.0, float("inf"))
    return config, spec, ours, hf.eval()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_config_reads_as_the_executor_builds_it(tmp_path, name):
    config, spec, ours, _ = models(tmp_path, name)
    ids = hybrid_ids(config)
    assert spec.family == "hybrid" and spec.hybrid_layer_ids == tuple(ids)
    assert spec.mlp.geglu == (config["hidden_act"] == "gelu")
    assert (spec.rope.kind == "none") == (not config["use_mem_rope"])
    layers = ours.stack.layers
    kinds = [type(layer).__name__ for layer in layers]
    assert kinds == ["HybridLayer" if i in ids else "Mamba2Block" for i in range(len(layers))]
    # the k-th hybrid layer invokes copy k mod num_mem_blocks, the same object each time
    for k, i in enumerate(ids):
        assert layers[i].block is ours.stack.shared[k % config["num_mem_blocks"]]
    # Parameters as the cost model counts them: each shared copy once, each invocation's linear and adapters
    assert sum(p.numel() for p in ours.parameters()) == spec.embedding_params() + spec.layer_params()


@contextlib.contextmanager
def fp32_casts_kept_float64():
    """transformers' Zamba2 runs its norms (Zamba2RMSNorm, Zamba2RMSNormGated: `.to(torch.float32)`), its
    eager softmax (dtype=torch.float32) and its Mamba-2 scan (mamba2_chunk_scan: `.float()`) in fp32
    whatever the model's dtype; inside this context those casts of a float64 tensor keep it float64
    (the rotary's angles, `.to(device=…, dtype=torch.float)`, stay fp32, as the executor's Rotary
    computes them). Outside it the two models agree to fp32's rounding (measured: logits 2-4e-6,
    gradients 7e-6 and 4e-5 relative)."""
    real_float, real_to, real_softmax = torch.Tensor.float, torch.Tensor.to, nn.functional.softmax

    def to(t, *args, **kwargs):
        if t.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32 and "device" not in kwargs:
                kwargs["dtype"] = torch.float64
        return real_to(t, *args, **kwargs)

    def softmax(x, *args, dtype=None, **kwargs):
        return real_softmax(x, *args, dtype=None if x.dtype == torch.float64 else dtype, **kwargs)

    torch.Tensor.float = lambda t, *a, **k: t if t.dtype == torch.float64 else real_float(t, *a, **k)
    torch.Tensor.to, nn.functional.softmax = to, softmax
    try:
        yield
    finally:
        torch.Tensor.float, torch.Tensor.to, nn.functional.softmax = real_float, real_to, real_softmax


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loss_logits_and_every_gradient_match_transformers(tmp_path, name):
    """float64 (fp32_casts_kept_float64): transformers' loss and logits, and every weight's gradient (a
    shared copy's summed over its invocations, as transformers' tied Parameter sums them), to 1e-10
    relative (measured: 2e-14 and 1e-13)."""
    config, spec, ours, hf = models(tmp_path, name)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config["vocab_size"], (BATCH, SEQ + 1), generator=g)
    tokens, labels = ids[:, :-1], ids[:, 1:]
    loss = ours.token_losses(tokens, labels).mean()
    loss.backward()
    with fp32_casts_kept_float64():
        out = hf(input_ids=tokens)
        ref_loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten())
        ref_loss.backward()
    logits = ours.head.logits(ours.hidden(tokens)).detach()
    logit_err = float((logits - out.logits).abs().max() / out.logits.abs().max())
    assert logit_err <= 1e-10
    assert abs(float(loss) - float(ref_loss)) <= 1e-12 * abs(float(ref_loss))
    named = dict(hf.named_parameters(remove_duplicate=False))
    mine = theirs(ours, config, grads=True)
    worst = 0.0
    for key, grad in mine.items():
        ref = named[key].grad
        err = float((grad - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        worst = max(worst, err)
        assert err <= 1e-10, (key, err)
    print(f"{name}: loss {float(loss):.9f} vs {float(ref_loss):.9f}, logits {logit_err:.1e}, gradients {worst:.1e}")


# The 1.2b-like shape as a spec (load_model of CONFIGS["1.2b-like"]), for the gloo cases.
def tiny_zamba2(tmp_path_factory, name: str = "1.2b-like"):
    return load_model(_folder(tmp_path_factory.mktemp(name), CONFIGS[name]))


# (processes, [(layout, mode, packed)]): data parallel, ZeRO 1 and 2, sequence parallel (the Mamba-2
# recurrence handed along the sp ranks, the shared attention's K/V gathered over them), tensor parallel
# (tp or tpssm: the same split), both; packed documents; a prefill and decoded tokens (each invocation
# of a shared attention with its own KV cache).
DIST = {
    2: [
        ("dp=2", "train", False),
        ("dp=2,zero=1", "train", False),
        ("sp=2", "train", False),
        ("sp=2", "train", True),
        ("tp=2", "train", False),
        ("tpssm=2", "train", True),
        ("dp=2", "decode", False),
        ("sp=2", "prefill", True),
        ("sp=2", "decode", True),
        ("tp=2", "prefill", False),
        ("tp=2", "decode", False),
    ],
    4: [
        ("dp=2,sp=2", "train", False),
        ("dp=2,sp=2,zero=2", "train", True),
        ("tp=2,sp=2", "train", True),
        ("dp=2,tpssm=2,zero=1", "train", False),
        ("tp=2,sp=2", "decode", False),
    ],
}
# Two pipeline stages of the 6-layer model (the stages send the embeddings beside the hidden states;
# the copy invoked on both has its gradients summed over pp), alone and beside dp with ZeRO 1, tp, sp.
PIPELINE = {
    2: [("pp=2", "train", False), ("pp=2", "prefill", True), ("pp=2", "decode", False)],
    4: [
        ("dp=2,pp=2,zero=1", "train", False),
        ("pp=2,tp=2", "train", True),
        ("pp=2,sp=2", "train", True),
        ("pp=2,sp=2", "decode", True),
    ],
}


def _run_all(rank, world, model, cases):
    from meshplan.executor.check_model import check_model
    from meshplan.layout import parse_layout

    return [
        (text, check_model(rank, world, model, parse_layout(text), SEQ, BATCH, mode, packed=packed))
        for text, mode, packed in cases
    ]


@pytest.mark.parametrize("name, world", [("1.2b-like", 2), ("1.2b-like", 4), ("6-layer", 2), ("6-layer", 4)])
def test_zamba2_on_gloo_matches_float64_and_the_cost_models_bytes(tmp_path_factory, name, world):
    """Each layout against the float64 single-process model — the loss, every weight's gradient (each
    shared copy's summed over its invocations on a rank, then over the gradient group), ZeRO's step;
    the next token's log-probabilities after a prefill and each decoded token — every collective's
    bytes equal to the cost model's schedule, per kind and axis, and the saved activations within 1% of
    the memory model's (measured: -0.03% dp, -0.4% sp, -0.04% tp)."""
    from meshplan.executor.check import mean_counts
    from meshplan.executor.distributed import run_distributed

    cases = (DIST if name == "1.2b-like" else PIPELINE)[world]
    model = tiny_zamba2(tmp_path_factory, name)
    per_rank = run_distributed(_run_all, world, model, cases, timeout_s=300)
    for i, (text, mode, packed) in enumerate(cases):
        results = [r[i][1] for r in per_rank]
        for r in results:
            if mode != "train":
                assert r["max_out_err"] < 1e-10, (text, mode, packed, r)
                continue
            assert r.get("loss_err", 0.0) < 1e-12, (text, packed, r)
            assert r["max_weight_grad_rel_err"] < 1e-9, (text, packed, r)
            if "pp" not in text:  # (check_model predicts a stage's share as 1/pp of the layers': even stages)
                assert r["saved_bytes"] == pytest.approx(r["predicted_saved_bytes"], rel=0.01), (text, r)
            if "zero" in text:
                assert r["max_weight_after_step_rel_err"] < 1e-12, (text, r)
        counted, predicted = mean_counts(results), results[0]["predicted_counts"]
        assert counted == pytest.approx(predicted, rel=1e-12), (text, counted, predicted)


def test_execute_trains_a_zamba2_config_end_to_end(tmp_path):
    """`meshplan execute` on a Zamba2 config.json, two gloo processes on sp=2 (ids from a .npy: the CLI
    takes packed documents for models without attention only): it runs, nothing of the model is left
    out, and every collective's bytes equal the prediction the run file sets beside them."""
    import numpy as np
    from typer.testing import CliRunner

    from meshplan.cli import app

    folder = _folder(tmp_path, CONFIGS["1.2b-like"])
    ids = torch.randint(0, 64, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(7)).numpy()
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "run.json"
    args = ["execute", "--model", folder, "--layout", "sp=2", "--seq", str(SEQ), "--batch", str(BATCH)]
    args += ["--nproc", "2", "--steps", "2", "--timeout", "300", "--tokens", str(tmp_path / "ids.npy")]
    res = CliRunner().invoke(app, args + ["--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads(out.read_text())
    assert run["status"] == "ok" and run["world"] == 2 and run["not_executed"] == []
    measured, predicted = run["measured"], run["predicted"]
    assert measured["comm_bytes"] == predicted["comm_bytes"]
    assert set(measured["comm_bytes"]) == {"all_gather/sp", "reduce_scatter/sp", "send_recv/sp", "all_reduce/sp"}


@pytest.mark.parametrize(
    "layout, whole, needle",
    [
        ("tsp=2", True, "not tsp=2; use tp or sp"),
        ("pp=5", True, "over two pipeline stages, not pp=5; use pp=2"),
        ("dp=2,zero=3", True, "zero=2 or below"),
        ("sp=2", False, "in the whole model only"),
    ],
)
def test_what_the_executor_does_not_run_is_one_line_naming_the_field(tmp_path_factory, layout, whole, needle):
    from meshplan.executor.support import unsupported
    from meshplan.layout import parse_layout

    reason = unsupported(parse_layout(layout), tiny_zamba2(tmp_path_factory), whole=whole)
    assert reason is not None and needle in reason and "\n" not in reason, reason
    assert reason.split(":")[0] in ("layout", "model", "--layers-only")


def test_adapter_down_grads_on_the_tensor_axis_by_hand():
    """Zamba2-7B on tp=2: each of its 13 invocations' rank-128 gate/up adapter has its 128 × 3584 down
    projection whole on both ranks, its gradient summed over tp once a step — 13 · 128 · 3584 fp32
    elements; prefill moves none of it. With attention adapters, the three
    128 × 7168 downs of Q, K, V beside it."""
    from dataclasses import replace

    from meshplan.costmodel.options import CostOptions
    from meshplan.costmodel.schedule import step_schedule
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS

    model = PRESETS["zamba2-7b"]
    train = CostOptions(mode="train", grad_dtype="fp32")

    def adapter_bytes(model, opts):
        schedule = step_schedule(model, parse_layout("tp=2"), 4096, 1, opts)
        comms = [*schedule.per_step, *schedule.per_block.get("hybrid_proj", ())]
        return sum(c.message_bytes_per_rank for c in comms if c.what == "adapter down-projection grads")  # × count

    assert adapter_bytes(model, train) == 13 * 128 * 3584 * 4
    assert adapter_bytes(replace(model, attention_adapters=True), train) == 13 * (128 * 3584 + 3 * 128 * 7168) * 4
    assert adapter_bytes(model, CostOptions(mode="prefill")) == 0


def test_what_a_tensor_rank_holds_of_the_hybrid_projections_by_hand():
    """Zamba2-7B on tp=2: each of the 13 invocations' 3584 × 3584 linear and 128 × 3584 adapter down
    projection stay whole on both ranks (their up projections, 28672 × 128, split), so a rank holds half
    of them more than an even split: 13 · (3584² + 128 · 3584) / 2 parameters."""
    from meshplan.costmodel.axes import sharding_for
    from meshplan.costmodel.blocks.hybrid_proj import tensor_replicated_hybrid_params
    from meshplan.costmodel.memory import local_params
    from meshplan.costmodel.options import MemoryOptions
    from meshplan.layout import parse_layout
    from meshplan.models import PRESETS

    model = PRESETS["zamba2-7b"]
    extra = 13 * (3584 * 3584 + 128 * 3584) / 2
    assert tensor_replicated_hybrid_params(model, 2) == extra
    assert tensor_replicated_hybrid_params(model, 1) == 0
    tp, sp = (sharding_for(parse_layout(text), MemoryOptions()) for text in ("tp=2", "sp=2"))
    even = (model.param_count() - model.norm_params()) / 2 + model.norm_params()
    assert local_params(model, tp) == pytest.approx(even + extra, rel=1e-12)
    assert local_params(model, sp) == model.param_count()


def test_pipeline_stages_of_a_zamba2_by_hand(tmp_path_factory):
    """The 6-layer model on pp=2 (three layers a stage): copy 0 is invoked on both stages (layers 1, 5),
    copy 1 on the second (layer 3). A copy is 3·64·64 (Q, K, V) + 32·64 (O) + 64 (its norm) attention
    weights and 96·32 + 32·48 + 32 MLP weights: 19,040; the one held twice has its gradient summed over
    pp once a step (fp32: 19,040 · 4 bytes on each of the two ranks), and a rank holds on average half
    a copy more than the model's parameters / 2. A stage sends each token's hidden state and its
    embeddings: 2 · 32 fp32 values, forward and backward."""
    from meshplan.costmodel.axes import sharding_for
    from meshplan.costmodel.axes.pp import shared_copy_holders, shared_copy_params
    from meshplan.costmodel.memory import mean_local_params
    from meshplan.costmodel.options import CostOptions
    from meshplan.costmodel.schedule import step_schedule
    from meshplan.layout import parse_layout

    model = tiny_zamba2(tmp_path_factory, "6-layer")
    copy = 3 * 64 * 64 + 32 * 64 + 64 + 96 * 32 + 32 * 48 + 32
    assert shared_copy_holders(model, 2) == (2, 1) and shared_copy_holders(model, 1) == ()
    assert shared_copy_params(model, 1) == copy == 19040
    assert shared_copy_params(model, 2) == (copy - 96) / 2 + 96  # tp=2: the norms whole
    opts = CostOptions(mode="train", act_dtype="fp32", grad_dtype="fp32")
    schedule = step_schedule(model, parse_layout("pp=2"), SEQ, BATCH, opts)
    summed = [c for c in schedule.per_step if c.what.startswith("shared block copies")]
    assert [(c.kind, c.axis, c.message_bytes_per_rank) for c in summed] == [("all_reduce", "pp", copy * 4)]
    sends = [c for c in schedule.per_microbatch if c.kind == "send_recv"]
    assert {c.message_bytes for c in sends} == {BATCH * SEQ * 2 * 32 * 4} and len(sends) == 2
    tied = model.vocab * model.d_model  # the head's copy of the tied embedding on the last stage
    sh = sharding_for(parse_layout("pp=2"), opts)
    assert mean_local_params(model, sh, 2) == (model.param_count() + tied + copy) / 2


def test_a_new_prefill_forgets_the_caches_hybrid_layers_lent_their_shared_attention():
    """parallelize.drop_caches, before each timed prefill, also drops the KV cache a hybrid layer keeps
    for the shared attention it invokes (ParallelHybridLayer.kv_state): kept, the previous prefill's
    caches stood beside the new ones until each was replaced (a review finding)."""
    from torch import nn

    from meshplan.executor.parallelize import drop_caches

    holder = nn.Module()
    holder.kv_state = (torch.zeros(2), 7)
    drop_caches(nn.ModuleList([nn.Sequential(holder)]))
    assert holder.kv_state == (None, 0)

"""The cost model on the families issue #31 reads: multi-head latent attention priced by hand (its
weights on a tensor rank, its projections, its latent KV cache, what training saves, its core and its
decode), a mixed model's layers checked in one line each, and every new family — DeepSeek, gpt-oss,
Granite-MoE, Granite 4.0-H, Nemotron-H, Jamba — priced end to end (memory, step time, the CLI), finite,
positive and within the rules costmodel/invariants.py checks on every estimate."""

import json
import math
from dataclasses import replace

import pytest
from test_hf_families import SHAPE_CASES
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.costmodel.axes import sharding_for
from meshplan.costmodel.blocks import BLOCKS, BlockCompute, block_saved
from meshplan.costmodel.blocks.attention import DECODE_ATTENTION_HBM_FRACTION
from meshplan.costmodel.device import Device
from meshplan.costmodel.memory import local_params, memory_per_gpu
from meshplan.costmodel.options import CostOptions, MemoryOptions
from meshplan.costmodel.stacks import STACKS
from meshplan.costmodel.step import estimate_step
from meshplan.errors import MeshplanError
from meshplan.executor.support import unsupported
from meshplan.hf_config import model_from_hf_config
from meshplan.layout import Layout, parse_layout, validate_layout
from meshplan.models import PRESETS, AttentionSpec, Mamba1Spec, Mamba2Spec, MlpSpec, ModelSpec, MoeSpec
from meshplan.topologies import load_cluster

runner = CliRunner()
V3 = PRESETS["deepseek-v3"]
MLA = V3.attention  # 128 heads; q_lora 1536, kv_lora 512, nope 128, rope 64, v 128; hidden 7168


def test_mla_weights_on_a_tensor_rank():
    """tp=8: the down-projections to the latents (7168 × (1536 + 512 + 64)) and every norm whole on each
    rank, the up- and output projections an eighth (Megatron-Core's MLASelfAttention); by hand, per
    layer and with the experts, dense MLPs and vocabulary as under plain TP (the 58 MoE layers' routers,
    256 × 7168, whole on every rank as Megatron-Core's TopKRouter keeps them)."""
    down = 7168 * (1536 + 512 + 64)
    q_b, kv_b, o = 1536 * 128 * 192, 512 * 128 * (128 + 128), 128 * 128 * 7168
    norms = 7168 + 1536 + 512  # the pre-norm and the two latent norms
    assert MLA.param_count() == down + q_b + kv_b + o + norms
    assert MLA.down_projection_params() == down
    sh = sharding_for(Layout(tp=8), MemoryOptions())
    attention = 61 * (down + (q_b + kv_b + o) / 8 + norms)
    others = V3.layer_params() - 61 * MLA.param_count()
    other_norms = V3.norm_params(embeddings=False) - 61 * (MLA.hidden + MLA.norm_extra)
    whole = other_norms + 58 * 256 * 7168
    want = attention + (others - whole) / 8 + whole
    assert local_params(V3, sh, embeddings=False) == pytest.approx(want, rel=1e-12)


def test_mla_projections_on_a_tensor_rank():
    """(n, k) of each projection: the down-projections whole, q_b, kv_b and o an eighth of the heads;
    on one rank they are the attention's weights but its norms."""
    gemms = BLOCKS["attention"].gemms(V3, 8)
    assert gemms == [(1536, 7168), (128 * 192 / 8, 1536), (576, 7168), (128 * 256 / 8, 512), (7168, 128 * 128 / 8)]
    whole = sum(n * k for n, k in BLOCKS["attention"].gemms(V3, 1))
    assert whole == MLA.param_count() - MLA.hidden - MLA.norm_extra
    plain_q = replace(V3, attention=replace(MLA, q_lora_rank=0))
    assert BLOCKS["attention"].gemms(plain_q, 8)[0] == (128 * 192 / 8, 7168)


def test_mla_caches_its_latent_whole_on_every_tensor_rank():
    """Inference keeps (kv_lora_rank + rope) = 576 elements a token and layer, on every tensor rank — a
    57th of the 2 · 128 · 192 = 49,152 a plain cache of its up-projected K and V would hold."""
    seq, opts = 8192, CostOptions(mode="prefill")
    want = 61 * seq * 576 * 2  # bf16
    for layout in (Layout(tp=8), Layout(dp=8)):
        assert memory_per_gpu(V3, layout, seq, 1, opts).per_gpu_bytes["kv_cache"] == pytest.approx(want, rel=1e-9)
    assert MLA.kv_cache_width == 576 and not MLA.kv_cache_split_by_heads
    # A sequence split divides it by the ranks' share of the tokens.
    sp = memory_per_gpu(V3, Layout(sp=8), seq, 1, opts).per_gpu_bytes["kv_cache"]
    assert sp == pytest.approx(want / 8, rel=1e-9)


def test_mla_training_saves_the_up_projected_k_and_v():
    """Training keeps K (128 heads of 192) and V (128 of 128) as the up-projections write them, the
    latents before and after their norms, and the output (128 · 128)."""
    saved = {s.name: s for s in block_saved("attention", V3, MemoryOptions())}
    e = 2
    assert saved["k"].bytes_per_token == e * 128 * 192 and saved["v"].bytes_per_token == e * 128 * 128
    assert saved["q"].bytes_per_token == e * 128 * 192 and saved["attn_out"].bytes_per_token == e * 128 * 128
    assert saved["kv_latent"].bytes_per_token == e * 576 and saved["kv_latent_normed"].bytes_per_token == e * 512
    assert saved["q_latent"].bytes_per_token == saved["q_latent_normed"].bytes_per_token == e * 1536
    assert {saved[n].split for n in ("kv_latent", "q_latent")} == {"hidden"}  # whole on each tensor rank
    assert {saved[n].split for n in ("q", "k", "v", "attn_out")} == {"heads"}


def test_mla_core_and_decode_count_their_own_widths():
    """The core: QKᵀ over heads of 192, PV over heads of 128 — 4·t·s·(128·(192 + 128)/2) FLOPs; decode
    with the up-projections absorbed reads the 576-wide latent of every cached token, once."""
    assert MLA.core_width == 128 * (192 + 128) / 2
    dev = Device.of(load_cluster("h100-sxm-8"), STACKS["megatron"])
    sh = sharding_for(Layout(tp=8), MemoryOptions())
    t, s = 4096.0, 4096
    _, flops = BLOCKS["attention"].core_s(V3, t, s, sh, 2, dev, causal_fraction=0.5, zigzag=0)
    assert flops == pytest.approx(4 * t * s * MLA.core_width / 8 * 0.5)
    # Decode replaces the core's time of the projections' BlockCompute it is given.
    decoded = BLOCKS["attention"].decode(BlockCompute(0.0, 0.0, 0.0, 0.0, 0.0), V3, 8, 32768, sh, MemoryOptions(), dev)
    read_s = 8 * 32768 * 576 * 2 / (dev.rated_hbm * DECODE_ATTENTION_HBM_FRACTION)
    assert decoded.attn_fwd_s == pytest.approx(read_s)


def _mixed(**changes) -> ModelSpec:
    fields = {
        "name": "m",
        "family": "mixed",
        "d_model": 256,
        "layers": 3,
        "vocab": 1000,
        "mamba2": Mamba2Spec(256, d_state=16, headdim=32),
        "attention": AttentionSpec(256, 4, 2, 64, 256),
        "mlp": MlpSpec(256, 512, gated=False),
        "moe": MoeSpec(256, 8, 2, 128, gated=False, shared_ffn=256),
        "layer_kinds": (("mamba2",), ("router", "experts", "shared_expert"), ("attention", "mlp")),
    }
    return ModelSpec(**{**fields, **changes})


def test_a_mixed_model_sums_its_layers():
    m = _mixed()
    want = m.mamba2.param_count() + m.moe.param_count() + m.attention.param_count() + m.mlp.param_count()
    assert m.layer_params() == want
    assert m.block_invocations()[0] == ("mamba2", 1)  # in the order the layers run them
    assert m.active_param_count() == m.param_count() - 6 * m.moe.expert_params()
    assert m.mamba_layers == 1 and m.attention_layers == 1 and not m.uniform_layers


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"layer_kinds": (("mamba2",), ("attention",))}, "layer_kinds has 2 layers but layers is 3"),
        ({"layer_kinds": (("mamba2",), (), ("mlp",))}, "layer_kinds[1] is empty"),
        ({"layer_kinds": (("mamba2",), ("conv",), ("mlp",))}, "layer_kinds[1] names unknown block kind 'conv'"),
        ({"mlp": None}, "layer_kinds[2] runs mlp but the model has no mlp spec"),
        ({"layer_kinds": (("mamba2",), ("experts",), ("mlp",))}, "a mixture of experts is a router and its"),
        ({"mamba1": Mamba1Spec(256)}, "Mamba-2 or Mamba-1 blocks, not both"),
        ({"family": "moe", "moe": MoeSpec(256, 8, 2, 128)}, "layer_kinds lists a mixed model's layers"),
        ({"mtp_layers": 1}, "mtp_layers (1) are the last layers of a dense or moe model"),
    ],
)
def test_a_mixed_models_layers_are_checked_in_one_line(changes, message):
    with pytest.raises(MeshplanError) as err:
        _mixed(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)


def _family_models(tmp_path) -> dict:
    """A small config of each new family, read as a user's config.json would be."""
    out = {}
    for case in ("deepseek_v3", "deepseek_v2-lite", "gpt_oss", "granitemoeshared", "granitemoehybrid", "nemotron_h"):
        path = tmp_path / f"{case}.json"
        path.write_text(json.dumps({"model_type": case.split("-")[0], **SHAPE_CASES[case]}))
        out[case] = model_from_hf_config(path)
    jamba = {**SHAPE_CASES["jamba"], "num_attention_heads": 8, "num_key_value_heads": 8}  # tp=8 divides them
    (tmp_path / "jamba.json").write_text(json.dumps({"model_type": "jamba", **jamba}))
    out["jamba"] = model_from_hf_config(tmp_path / "jamba.json")
    return out


LAYOUTS = ("dp=8", "dp=4,tp=2", "dp=4,sp=2", "dp=4,ep=4", "dp=4,pp=2", "pp=2,tp=2,sp=2", "dp=2,tp=2,ep=2,zero=1")


@pytest.mark.parametrize("mode", ["train", "prefill", "decode"])
def test_every_new_family_is_priced_end_to_end(tmp_path, mode):
    """Memory and step time on eight GPUs under each layout the model admits: finite and positive (the
    estimate's own rules are checked as it is made, costmodel/invariants.py)."""
    cluster = load_cluster("h100-sxm-8")
    # Megatron-SP on: training a mixture of experts under tp needs it (axes.ep.violation)
    opts = CostOptions(mode=mode, global_batch=16 if mode == "train" else 0, tp_sequence_parallel=True)
    priced = {}
    for name, model in _family_models(tmp_path).items():
        for text in LAYOUTS:
            layout = parse_layout(text)
            try:
                validate_layout(layout, model, 8)
            except MeshplanError:
                continue  # refused in one line (ep on a model without experts, tp beyond the heads)
            est = estimate_step(model, layout, 2048, 1, opts, cluster)
            mem = memory_per_gpu(model, layout, 2048, 1, opts)
            assert math.isfinite(est.step_time_s) and est.step_time_s > 0, (name, text)
            assert est.tokens_per_s > 0 and 0 < est.mfu <= 1, (name, text)
            assert mem.total_bytes > 0 and all(v >= 0 for v in mem.per_gpu_bytes.values()), (name, text)
            priced[name] = priced.get(name, 0) + 1
    assert len(priced) == 7 and min(priced.values()) >= 4, priced


def test_the_executor_refuses_latent_attention_in_one_line(tmp_path):
    dense_mla = model_from_hf_config(
        _write(tmp_path, {"model_type": "deepseek_v3", **SHAPE_CASES["deepseek_v3-all-dense"]})
    )
    assert dense_mla.family == "dense" and dense_mla.attention.mla
    reason = unsupported(Layout(dp=2), dense_mla)
    assert "latent attention (MLA)" in reason and "\n" not in reason


def _write(tmp_path, raw):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    "model, layout",
    [
        ("deepseek-v3", "dp=8,pp=16,ep=8"),
        ("deepseek-v3-mtp", "dp=8,pp=16,ep=8"),
        ("nemotron-3-nano", "dp=64,tpssm=2,ep=8"),
        ("qwen3-235b-a22b", "dp=16,pp=4,tp=2,ep=16"),
    ],
)
def test_predict_answers_for_the_moe_presets(model, layout):
    r = runner.invoke(
        app,
        ["predict", "--model", model, "--cluster", "h100-sxm-8", "--nodes", "16", "--layout", layout]
        + ["--seq", "4k", "--global-batch", "256", "--json"],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["step_time_s"] > 0 and out["total_bytes"] > 0 and 0 < out["mfu"] < 1


def test_recommend_and_predict_take_a_new_family_config(tmp_path):
    path = str(_write(tmp_path, {"model_type": "nemotron_h", **SHAPE_CASES["nemotron_h"]}))
    r = runner.invoke(app, ["recommend", "--model", path, "--cluster", "h100-sxm-8", "--nodes", "2"] + ["--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(
        app, ["predict", "--model", path, "--cluster", "h100-sxm-8", "--layout", "dp=4,tsp=2", "--seq", "4k"]
    )
    assert r.exit_code == 2 and "does not split" in r.output and "add ep" in r.output  # one line, no traceback

"""--precision fp8 (issue #33): Transformer Engine's FP8 as Megatron-Core runs it, each effect held to
hand arithmetic on the dense 7B (h 4096, 32 layers, MHA, gated F 16384, V 32000) — the linear GEMMs' time,
the FP8 weight copies, the saved GEMM inputs, the FP8 parameter all-gather — and the Blackwell presets
(specification, not measurement) with `recommend` on 9 GB200 NVL72 racks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib
from typer.testing import CliRunner

from meshplan import hardware
from meshplan.cli import app
from meshplan.costmodel.axes import sharding_for
from meshplan.costmodel.blocks import BLOCKS
from meshplan.costmodel.compute import logits_compute
from meshplan.costmodel.device import Device, gemm_time_s, linear_gemm_time_s
from meshplan.costmodel.invariants import InvariantError, check_device
from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.schedule import step_schedule
from meshplan.costmodel.stacks import STACKS, stack_at
from meshplan.costmodel.step import estimate_step
from meshplan.errors import MeshplanError
from meshplan.hf_config import load_model
from meshplan.layout import parse_layout
from meshplan.models import PRESETS
from meshplan.predict import predict
from meshplan.topologies import load_cluster

MODEL = PRESETS["dense-7b"]
H, L, F = MODEL.d_model, MODEL.layers, MODEL.mlp.ffn_hidden
# Weights an FP8 GEMM reads, a layer: QKV + output projection (MHA: 4h²) and the gated MLP (3·h·F)
FP8_WEIGHTS_A_LAYER = 4 * H * H + 3 * H * F
SEQ = 4096


def _opts(**kw) -> CostOptions:
    return CostOptions(stack="megatron", grad_dtype="fp32", tp_sequence_parallel=False, **kw)


def test_bf16_is_the_stack_itself():
    """The default changes nothing: the same Stack object, a Device at bf16 with no FP8 speed-up."""
    assert stack_at("megatron") is STACKS["megatron"] and _opts().stack_spec is STACKS["megatron"]
    dev = Device.of(load_cluster("h100-sxm-8"), STACKS["megatron"])
    assert dev.precision == "bf16" and linear_gemm_time_s(4096, 4096, 4096, 2, dev) == gemm_time_s(
        4096, 4096, 4096, 2, dev
    )


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"precision": "fp4"}, "--precision"),
        ({"precision": "fp8", "stack": "meshplan"}, "--stack meshplan"),
        ({"precision": "fp8", "stack": "megatron-2021"}, "--stack megatron-2021"),
        ({"fp8_param_gather": True}, "--fp8-param-gather"),
        ({"precision": "mxfp8", "fp8_param_gather": True}, "--fp8-param-gather"),
    ],
)
def test_bad_precision_is_one_line_naming_the_field(kw, field):
    kw = {"stack": "megatron", **kw}
    with pytest.raises(MeshplanError) as err:
        CostOptions(**kw)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_fp8_needs_the_gpu_to_have_it():
    with pytest.raises(MeshplanError, match="fp8_tflops"):  # the A100 preset has no FP8 peak
        Device.of(load_cluster("a100-sxm-8"), stack_at("megatron", "fp8"))
    with pytest.raises(MeshplanError, match="MXFP8"):  # MXFP8 is Blackwell's
        Device.of(load_cluster("h100-sxm-8"), stack_at("megatron", "mxfp8"))
    args = ["predict", "--model", "dense-7b", "--cluster", "h100-sxm-8", "--layout", "tp=8", "--seq", "4096"]
    r = CliRunner().invoke(app, args + ["--precision", "fp4"])
    assert r.exit_code == 2 and "--precision" in r.output


def test_linear_gemms_run_at_the_measured_fp8_rate():
    """On an H100 an FP8 linear GEMM takes 1/1.763 of its bf16 time (rates-h100.json's median); the
    output head's GEMM and the router's stay bf16."""
    h100 = load_cluster("h100-sxm-8")
    bf16, fp8 = Device.of(h100, STACKS["megatron"]), Device.of(h100, stack_at("megatron", "fp8"))
    assert fp8.fp8_speedup == hardware.FP8_GEMM_SPEEDUP_H100 == 1.763 and fp8.rates_note == ""
    sh = sharding_for(parse_layout("tp=1"), _opts())
    tokens = SEQ
    mlp_bf16 = BLOCKS["mlp"].gemm_s(MODEL, tokens, sh, 2, bf16)
    mlp_fp8 = BLOCKS["mlp"].gemm_s(MODEL, tokens, sh, 2, fp8)
    # fc1 (2F × h) and fc2 (h × F) over 4096 tokens: 2·t·3·h·F FLOPs at 0.679 × 989.4 TFLOP/s (× 1.763)
    flops = 2 * tokens * 3 * H * F
    assert mlp_bf16 == pytest.approx(flops / (989.4e12 * 0.679))
    assert mlp_fp8 == pytest.approx(flops / (989.4e12 * 0.679 * 1.763))
    assert logits_compute(MODEL, tokens, sh, 2, fp8) == logits_compute(MODEL, tokens, sh, 2, bf16)
    assert BLOCKS["router"].fp8_gemms is False


def test_step_is_faster_and_mfu_stays_against_the_bf16_peak():
    h100 = load_cluster("h100-sxm-8")
    layout = parse_layout("tp=8")
    bf16 = estimate_step(MODEL, layout, SEQ, 1, _opts(), h100)
    fp8 = estimate_step(MODEL, layout, SEQ, 1, _opts(precision="fp8"), h100)
    assert fp8.step_time_s < bf16.step_time_s
    # the same model FLOPs over the same bf16 peak: MFU moves with the step time alone
    assert fp8.mfu * fp8.step_time_s == pytest.approx(bf16.mfu * bf16.step_time_s)
    assert fp8.breakdown["logits_compute_s"] == bf16.breakdown["logits_compute_s"]


def test_memory_fp8_copies_and_saved_inputs_by_hand():
    """tp=2 without Megatron-SP, one sequence of 4096: TE keeps an FP8 copy and its transpose of every
    linear weight (2 B a weight, /T), and saves the GEMM inputs in 1 byte, not 2: QKV's and fc1's inputs
    (h wide, whole on each tensor rank: −1 B each) and fc2's (F/T: −1 B), while the out-projection keeps
    an FP8 copy of the core's output beside it (+1 B, h/T)."""
    layout, T = parse_layout("tp=2"), 2
    bf16 = memory_per_gpu(MODEL, layout, SEQ, 1, _opts())
    fp8 = memory_per_gpu(MODEL, layout, SEQ, 1, _opts(precision="fp8"))
    assert fp8.per_gpu_bytes["fp8_weights"] == pytest.approx(2 * L * FP8_WEIGHTS_A_LAYER / T, abs=1)
    assert bf16.per_gpu_bytes["fp8_weights"] == 0
    assert fp8.per_gpu_bytes["parameters"] == bf16.per_gpu_bytes["parameters"]
    saved_delta = L * SEQ * (-H - H + H / T - F / T)
    assert fp8.per_gpu_bytes["activations"] - bf16.per_gpu_bytes["activations"] == pytest.approx(saved_delta, abs=2)


def test_fp8_param_gather_keeps_weights_in_fp8_by_hand():
    """--fp8-param-gather: the linear weights are FP8 parameters (1 B, not 2) with their transpose
    beside them (1 B)."""
    layout, T = parse_layout("tp=2"), 2
    fp8 = memory_per_gpu(MODEL, layout, SEQ, 1, _opts(precision="fp8"))
    gathered = memory_per_gpu(MODEL, layout, SEQ, 1, _opts(precision="fp8", fp8_param_gather=True))
    weights = L * FP8_WEIGHTS_A_LAYER / T
    assert gathered.per_gpu_bytes["parameters"] == pytest.approx(fp8.per_gpu_bytes["parameters"] - weights, abs=2)
    assert gathered.per_gpu_bytes["fp8_weights"] == pytest.approx(weights, abs=1)


def _param_all_gather(opts: CostOptions) -> float:
    sched = step_schedule(MODEL, parse_layout("dp=2,zero=1"), SEQ, 1, opts)
    (gather,) = [c for c in sched.per_step if c.what == "updated params all-gather"]
    return gather.message_bytes


def test_fp8_param_gather_moves_one_byte_a_linear_weight():
    """The distributed optimizer's all-gather of updated parameters: 2 B a parameter in bf16 (and under
    plain fp8); the linear weights' share of the parameters at 1 B with --fp8-param-gather."""
    bf16 = _param_all_gather(_opts())
    assert bf16 == MODEL.param_count() * 2
    assert _param_all_gather(_opts(precision="fp8")) == bf16
    share = L * FP8_WEIGHTS_A_LAYER / MODEL.param_count()
    assert _param_all_gather(_opts(precision="fp8", fp8_param_gather=True)) == pytest.approx(
        MODEL.param_count() * (2 - share)
    )


def test_fp8_rate_is_capped_by_the_fp8_peak():
    dev = Device(1e15, 4e12, gemm_efficiency=0.8, precision="fp8", fp8_speedup=3.0, fp8_peak_flops=2e15)
    with pytest.raises(InvariantError, match="FP8 peak"):
        check_device(dev)
    check_device(Device(1e15, 4e12, gemm_efficiency=0.8, precision="fp8", fp8_speedup=2.0, fp8_peak_flops=2e15))


# -- Blackwell ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "preset, gpus, bf16, fp8", [("dgx-b200-8", 8, 2250e12, 4500e12), ("gb200-nvl72", 72, 2500e12, 5e15)]
)
def test_blackwell_presets_are_specification(preset, gpus, bf16, fp8):
    cluster = load_cluster(preset)
    assert cluster.gpus_per_node == gpus and cluster.gpu.bf16_flops_per_s == bf16
    assert cluster.gpu.fp8_flops_per_s == fp8
    kind = hardware.gpu_kind(cluster.gpu.name)
    assert kind.preset == preset and kind.specification and kind.mxfp8
    dev = Device.of(cluster, stack_at("megatron", "fp8"))
    # no measurement: the datasheet's dense FP8 / bf16 ratio, and the note says so
    assert dev.fp8_speedup == 2.0 and "specification" in dev.rates_note
    assert Device.of(cluster, stack_at("megatron", "mxfp8")).fp8_input_bytes == 1 + 1 / 32


def test_blackwell_runs_are_kept_out_of_the_accuracy_counts():
    for path in Path(__file__).parent.parent.joinpath("benchmarks", "published").glob("*.toml"):
        rows = tomllib.loads(path.read_text()).get("rows", [])
        assert not any(r.get("cluster") in ("dgx-b200-8", "gb200-nvl72") for r in rows), path


LLAMA3_70B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "rope_theta": 500000.0,
}


def test_recommend_on_nine_nvl72_racks(tmp_path):
    """Llama 3 70B (its config.json) on 9 racks, 648 GPUs: a ranking comes back, every tensor group inside
    one rack's NVLink domain, the winner fits, and FP8 is faster than bf16 on the same mesh."""
    config = tmp_path / "llama3-70b" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(LLAMA3_70B))
    args = ["recommend", "--model", str(config), "--cluster", "gb200-nvl72", "--nodes", "9", "--seq", "8192"]
    r = CliRunner().invoke(app, args + ["--global-batch", "1152", "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    ranked = json.loads(r.output)
    assert len(ranked) == 3
    best = ranked[0]
    layout = parse_layout(best["layout"])
    assert layout.world_size == 648 and layout.tp * layout.sp <= 72
    assert best["total_bytes"] <= 186e9 and 0.2 < best["mfu"] < 0.74
    assert "specification" in best["assumptions"]["rates_note"]
    cluster = load_cluster("gb200-nvl72", 9)
    model = load_model(str(config))
    bf16 = predict(model, cluster, layout, 8192, 1, _megatron(global_batch=1152))
    fp8 = predict(model, cluster, layout, 8192, 1, _megatron(global_batch=1152, precision="fp8"))
    assert fp8.step.step_time_s < bf16.step.step_time_s


def _megatron(**kw) -> CostOptions:
    return CostOptions(stack="megatron", grad_dtype="fp32", tp_sequence_parallel=True, **kw)


def test_quantize_kernels_by_hand():
    """Transformer Engine's FP8 casts around a dense-7b layer's GEMMs at tp=1 (h = 4096, F = 16384, MHA):
    forward, QKV's input quantized by the norm (delayed: 1 B instead of 2, a transpose 1 + 1 → +1 B an
    element; current: the bf16 norm output cast with its transpose, +4), the output projection's input
    (h) and fc2's (F) cast with their transposes (4 B; current +2 for the amax pass), fc1's input by its
    norm like QKV's; backward, every GEMM's output gradient cast and transposed (QKV 3h, out-proj h,
    fc1 2F, fc2 h: 4 B, current 6) — at the H100's 3.35 TB/s, 4096 tokens."""
    from meshplan.costmodel.compute import block_compute

    h100 = load_cluster("h100-sxm-8")
    sh = sharding_for(parse_layout("tp=1"), _opts())
    hbm, t = 3.35e12, SEQ
    expected = {
        ("delayed", "attention"): (H * 1 + H * 4, (3 * H + H) * 4),
        ("current", "attention"): (H * 4 + H * 6, (3 * H + H) * 6),
        ("delayed", "mlp"): (H * 1 + F * 4, (2 * F + H) * 4),
        ("current", "mlp"): (H * 4 + F * 6, (2 * F + H) * 6),
    }
    for (recipe, kind), (fwd, bwd) in expected.items():
        dev = Device.of(h100, stack_at("megatron", "fp8", False, recipe))
        comp = block_compute(MODEL, kind, t, SEQ, sh, 2, dev, recompute="none", training=True)
        assert dev.rated_hbm == hbm
        assert comp.cast_fwd_s == pytest.approx(t * fwd / hbm) and comp.cast_bwd_s == pytest.approx(t * bwd / hbm)
    # bf16 runs no casts; a recomputed forward runs its casts again
    bf16 = block_compute(
        MODEL, "mlp", t, SEQ, sh, 2, Device.of(h100, STACKS["megatron"]), recompute="none", training=True
    )
    assert bf16.cast_fwd_s == bf16.cast_bwd_s == 0.0
    dev = Device.of(h100, stack_at("megatron", "fp8"))
    full = block_compute(MODEL, "mlp", t, SEQ, sh, 2, dev, recompute="full", training=True)
    none = block_compute(MODEL, "mlp", t, SEQ, sh, 2, dev, recompute="none", training=True)
    assert full.recompute_fwd_s == pytest.approx(none.fwd_s)


def test_current_scaling_is_slower_and_asks_for_fp8():
    h100 = load_cluster("h100-sxm-8")
    layout = parse_layout("tp=8")
    delayed = estimate_step(MODEL, layout, SEQ, 1, _opts(precision="fp8"), h100).step_time_s
    current = estimate_step(MODEL, layout, SEQ, 1, _opts(precision="fp8", fp8_recipe="current"), h100).step_time_s
    assert delayed < current
    with pytest.raises(MeshplanError, match="--fp8-recipe current .* needs --precision fp8"):
        _opts(fp8_recipe="current")

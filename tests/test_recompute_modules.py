"""Megatron-Core's --recompute-modules (selective recompute by module: core_attn, moe, layernorm, moe_act,
shared_experts, mlp): what each drops from the saved tensors, what backward redoes, and the rules
Megatron attaches to them — against hand counts of the tensors and of the all-to-all passes."""

from dataclasses import replace

import pytest

from meshplan.costmodel.blocks import block_saved
from meshplan.costmodel.memory import memory_per_gpu, saved_activation_bytes
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.schedule import step_schedule
from meshplan.costmodel.step import estimate_step, kind_recompute
from meshplan.errors import MeshplanError
from meshplan.layout import parse_layout
from meshplan.models import PRESETS
from meshplan.topologies import load_cluster

QWEN = replace(PRESETS["qwen3-30b-a3b"], layers=2)
LAYOUT = parse_layout("dp=8,ep=8")
SEQ = 4096
BASE = CostOptions(stack="megatron", global_batch=8)


def _opts(recompute="selective", modules=("core_attn",)):
    return replace(BASE, recompute=recompute, recompute_modules=modules)


def _kept(kind, opts):
    """The names `kind` keeps for backward under `opts`."""
    return {item.name for item in block_saved(kind, QWEN, opts) if not item.dropped(opts)}


def test_each_module_drops_what_its_checkpoint_rebuilds():
    moe = _opts(modules=("moe",))
    # The MoE layer keeps its input (the pre-norm's output) and the norm's own backward inputs; the
    # router's, the experts' and the shared experts' tensors are rebuilt
    assert _kept("router", moe) == {"moe_norm_input", "moe_norm_stats", "router_input"}
    assert _kept("experts", moe) == set()
    # With layernorm too only the norm's input stays
    both = _opts(modules=("moe", "layernorm"))
    assert _kept("router", both) == {"moe_norm_input"}
    # moe_act keeps fc1's output (gate, up) and rebuilds the activation's output
    act = _opts(modules=("moe_act",))
    assert _kept("experts", act) == {"expert_inputs", "expert_probs", "expert_gate", "expert_up"}
    # core_attn alone (Megatron's default list) leaves the MoE layer whole
    assert _kept("experts", _opts()) == {item.name for item in block_saved("experts", QWEN, BASE)}


def test_moe_recompute_saves_exactly_the_dropped_bytes():
    """Hand count: what `moe` + `layernorm` drops a token of one layer (bf16, ep 8: 128/8 experts a rank,
    each token's 8 copies): router input 2h, norm statistics 4 (rmsnorm's fp32 rstd), router
    probabilities 4·E, the routing map 8·E, the copies 2·8h, their probabilities 4·8, gate, up and
    product 3 · 2 · 8 · f."""
    m = QWEN.moe
    none = saved_activation_bytes(QWEN, LAYOUT, SEQ, 1, BASE)[0]
    both = saved_activation_bytes(QWEN, LAYOUT, SEQ, 1, _opts(modules=("moe", "layernorm")))[0]
    per_token = 2 * m.hidden + 4 + 4 * m.experts + 8 * m.experts + 2 * 8 * m.hidden + 4 * 8 + 3 * 2 * 8 * m.expert_ffn
    assert none - both == pytest.approx(QWEN.layers * SEQ * per_token)


def test_whole_block_recompute_redoes_its_forward_and_its_all_to_alls():
    moe = _opts(modules=("moe",))
    assert {k: kind_recompute(moe, k) for k in ("router", "experts")} == {"router": "full", "experts": "full"}
    assert kind_recompute(moe, "attention") == "selective:moe"  # the core is not listed: not redone
    assert kind_recompute(_opts(), "attention") == "selective:core_attn"
    # Four passes of the all-to-all (dispatch, combine and their gradients), six once the MoE layer is redone
    passes = {
        name: sum(c.kind == "all_to_all" for c in step_schedule(QWEN, LAYOUT, SEQ, 1, o).per_block["experts"])
        for name, o in (("none", BASE), ("moe", moe), ("full", _opts("full")))
    }
    assert passes == {"none": 4, "moe": 6, "full": 6}


def test_more_recompute_is_slower_and_keeps_less():
    cluster = load_cluster("h100-sxm-8")
    plans = [BASE, _opts(modules=("moe_act",)), _opts(modules=("moe",)), _opts(modules=("moe", "layernorm"))]
    plans.append(_opts("full"))
    steps = [estimate_step(QWEN, LAYOUT, SEQ, 1, o, cluster).step_time_s for o in plans]
    acts = [memory_per_gpu(QWEN, LAYOUT, SEQ, 1, o).per_gpu_bytes["activations"] for o in plans]
    assert steps == sorted(steps) and steps[0] < steps[2] < steps[-1]
    assert acts == sorted(acts, reverse=True) and acts[0] > acts[2] > acts[-1]


def test_megatrons_rules_in_one_line():
    with pytest.raises(MeshplanError, match="add --recompute selective"):
        replace(BASE, recompute_modules=("moe",))
    with pytest.raises(MeshplanError, match="unknown 'moee'"):
        _opts(modules=("moee",))
    overlap = replace(BASE, moe_a2a_overlap=True, recompute="selective", recompute_modules=("moe",))
    from meshplan.costmodel.axes.ep import violation

    assert "moe recompute module" in violation(QWEN, LAYOUT, overlap)


def test_predict_takes_the_modules_and_says_them():
    from typer.testing import CliRunner

    from meshplan.cli import app

    args = ["predict", "--model", "qwen3-30b-a3b", "--cluster", "h100-sxm-8", "--layout", "dp=8,ep=8", "--seq", "4k"]
    out = CliRunner().invoke(app, [*args, "--recompute", "selective", "--recompute-modules", "moe,layernorm"])
    assert out.exit_code == 0, out.output
    assert "recompute selective (moe, layernorm)" in " ".join(out.output.split())
    bad = CliRunner().invoke(app, [*args, "--recompute-modules", "moe"])
    assert bad.exit_code == 2 and "add --recompute selective" in bad.output and "Traceback" not in bad.output


def test_full_and_none_are_the_same_for_every_block():
    """The modules touch selective recompute only: full redoes every block whole, none nothing."""
    for kind in ("attention", "router", "experts", "shared_expert", "mlp"):
        assert kind_recompute(_opts("full"), kind) == "full"
        assert kind_recompute(BASE, kind) == "none"


def test_what_each_module_redoes_by_hand():
    """`moe` redoes the MoE blocks' forward whole (recompute time = forward time); `moe_act` the experts'
    activation alone: 3·k·f bf16 bytes a token (SwiGLU reads gate and up, writes the product) at the
    stack's HBM rate; `layernorm` the pre-norm's read and write, 2·h bytes."""
    from meshplan.costmodel.axes import sharding_for
    from meshplan.costmodel.compute import block_compute
    from meshplan.costmodel.device import Device

    dev = Device.of(load_cluster("h100-sxm-8"), BASE.stack_spec)
    sh = sharding_for(LAYOUT, BASE)
    m, t = QWEN.moe, SEQ

    def comp(kind, opts):
        return block_compute(QWEN, kind, t, SEQ, sh, 2, dev, recompute=kind_recompute(opts, kind), training=True)

    for kind in ("router", "experts"):
        whole = comp(kind, _opts(modules=("moe",)))
        assert whole.recompute_fwd_s == pytest.approx(whole.fwd_s)
    act = comp("experts", _opts(modules=("moe_act",)))
    assert act.recompute_fwd_s == pytest.approx(
        t * 3 * m.top_k * m.expert_ffn * 2 * dev.elementwise_factor / dev.rated_hbm
    )
    norm = comp("router", _opts(modules=("layernorm",)))
    assert norm.recompute_fwd_s == pytest.approx(t * 2 * m.hidden * 2 * dev.elementwise_factor / dev.rated_hbm)
    assert comp("experts", BASE).recompute_fwd_s == 0.0


def test_the_mlp_module_keeps_only_the_blocks_input():
    """Megatron's `mlp` checkpoint starts at the MLP's input: with Transformer Engine's spec its norm is
    fused into fc1, so of a dense layer's MLP tensors only the norm's input stays (2·h bytes a token)."""
    llama = replace(PRESETS["llama3-8b"], layers=2)
    layout = parse_layout("dp=8")
    opts = replace(BASE, recompute="selective", recompute_modules=("mlp",))
    assert _kept_in(llama, "mlp", opts) == {"mlp_norm_input"}
    none = saved_activation_bytes(llama, layout, SEQ, 1, BASE)[0]
    mlp = saved_activation_bytes(llama, layout, SEQ, 1, opts)[0]
    dropped = sum(i.bytes_per_token for i in block_saved("mlp", llama, BASE) if i.name != "mlp_norm_input")
    assert none - mlp == pytest.approx(llama.layers * SEQ * dropped)


def _kept_in(model, kind, opts):
    return {item.name for item in block_saved(kind, model, opts) if not item.dropped(opts)}

"""Model presets, HuggingFace config import, the layout grammar and cluster descriptions."""

import json

import pytest

from meshplan.errors import MeshplanError
from meshplan.hf_config import load_model
from meshplan.layout import Layout, parse_layout, validate_layout, validate_seq
from meshplan.models import PRESETS
from meshplan.topologies.cluster import build_graph, load_cluster, preset_names


# Published parameter counts (model cards): Llama-3-8B 8.03B, Falcon-Mamba-7B 7.27B, mamba2-* by name,
# Zamba2-7B 7.4B (Glorioso et al. 2024, the Zamba2 report's abstract; transformers builds 7,356,749,648
# from its config, tests/test_hf_families.py).
@pytest.mark.parametrize(
    "name, billions, rel",
    [
        ("llama3-8b", 8.03, 0.001),
        ("falcon-mamba-7b", 7.27, 0.002),
        ("mamba2-130m", 0.13, 0.01),
        ("mamba2-370m", 0.37, 0.01),
        ("mamba2-780m", 0.78, 0.01),
        ("mamba2-1.3b", 1.3, 0.04),
        ("mamba2-2.7b", 2.7, 0.01),
        ("zamba2-7b", 7.4, 0.01),
    ],
)
def test_preset_parameter_counts(name, billions, rel):
    assert PRESETS[name].param_count() / 1e9 == pytest.approx(billions, rel=rel)


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_hf_llama_config_round_trips_to_the_preset(tmp_path):
    cfg = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "some_future_field": [1, 2],
    }
    model = load_model(write(tmp_path, cfg))
    assert model.param_count() == PRESETS["llama3-8b"].param_count()
    assert model.attention.kv_heads == 8


def test_hf_config_with_its_own_head_dim(tmp_path):
    """Mistral-Nemo's config.json: 32 heads of 128 over a 5120-wide stream (attention 4096 wide), 12.2B
    parameters by its model card; the head width is the config's, not hidden / heads (160)."""
    cfg = {
        "model_type": "mistral",
        "hidden_size": 5120,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "num_hidden_layers": 40,
        "vocab_size": 131072,
        "tie_word_embeddings": False,
    }
    model = load_model(write(tmp_path, cfg))
    assert model.attention.head_dim == 128 and model.attention.q_width == 4096
    assert model.param_count() / 1e9 == pytest.approx(12.2, rel=0.01)


def test_hf_mamba2_and_falcon_mamba_configs(tmp_path):
    m2 = load_model(
        write(
            tmp_path,
            {
                "model_type": "mamba2",
                "hidden_size": 768,
                "num_hidden_layers": 24,
                "vocab_size": 50288,
                "state_size": 128,
                "head_dim": 64,
                "n_groups": 1,
                "expand": 2,
                "conv_kernel": 4,
                "tie_word_embeddings": True,  # state-spaces/mamba2-130m ties; Mamba2Config does not
            },
            "m2.json",
        )
    )
    assert m2.param_count() == PRESETS["mamba2-130m"].param_count()
    fm = load_model(
        write(
            tmp_path,
            {
                "model_type": "falcon_mamba",
                "hidden_size": 4096,
                "num_hidden_layers": 64,
                "vocab_size": 65024,
                "state_size": 16,
                "expand": 2,
                "conv_kernel": 4,
                "time_step_rank": 256,
                "tie_word_embeddings": False,
            },
            "fm.json",
        )
    )
    assert fm.param_count() == PRESETS["falcon-mamba-7b"].param_count()


def test_hf_zamba2_config(tmp_path):
    types = (["mamba"] * 5 + ["hybrid"]) * 13 + ["mamba"] * 3
    cfg = {
        "model_type": "zamba2",
        "hidden_size": 3584,
        "num_hidden_layers": 81,
        "layers_block_type": types,
        "mamba_d_state": 64,
        "mamba_ngroups": 2,
        "n_mamba_heads": 112,
        "num_attention_heads": 32,
        "intermediate_size": 14336,
        "num_mem_blocks": 2,
        "vocab_size": 32000,
    }
    model = load_model(write(tmp_path, cfg))
    assert model.hybrid_invocations == 13 and model.mamba2.headdim == 64
    assert model.param_count() == PRESETS["zamba2-7b"].param_count()


@pytest.mark.parametrize(
    "data, message",
    [
        ({"model_type": "llama", "hidden_size": 64}, "missing required field 'num_attention_heads'"),
        ({"model_type": "t5"}, "model_type 't5' is not supported"),
        ({"model_type": "gpt2"}, "missing required field 'n_embd'"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 5,
                "intermediate_size": 128,
                "vocab_size": 10,
            },
            "num_attention_heads (5) must divide hidden_size (64); or give head_dim",
        ),
        # A count that is not a whole number is a malformed config, not a value to round.
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4.5,
                "intermediate_size": 128,
                "vocab_size": 10,
            },
            "num_attention_heads must be a whole number, got 4.5",
        ),
        (
            {
                "model_type": "llama",
                "hidden_size": "64",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 10,
            },
            "hidden_size must be a whole number, got '64'",
        ),
        (
            {
                "model_type": "mamba2",
                "hidden_size": 768,
                "num_hidden_layers": 24,
                "vocab_size": 50288,
                "head_dim": 64,
                "expand": 2,
                "num_heads": 25,
            },
            "num_heads (25) disagrees with expand · hidden_size / head_dim (2 · 768 / 64 = 24)",
        ),
    ],
)
def test_hf_config_errors_name_the_field(tmp_path, data, message):
    with pytest.raises(MeshplanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(write(tmp_path, data))


def test_unknown_model_is_one_clear_error():
    with pytest.raises(MeshplanError, match="neither a preset"):
        load_model("llama-99b")


@pytest.mark.parametrize(
    "text, layout",
    [
        ("dp=2,pp=2,tp=4", Layout(dp=2, pp=2, tp=4)),
        ("sp=8", Layout(sp=8)),
        ("tp=2, sp=4", Layout(tp=2, sp=4)),
        ("tsp=8", Layout(tsp=8)),
        ("tpssm=4,zero=1,dp=2", Layout(tpssm=4, zero=1, dp=2)),
        ("single", Layout()),
    ],
)
def test_layout_grammar(text, layout):
    assert parse_layout(text) == layout
    assert parse_layout(str(layout)) == layout


@pytest.mark.parametrize(
    "text, message",
    [
        ("tq=4", "did you mean 'tp'"),
        ("tp4", "not key=value"),
        ("tp=x", "not an integer"),
        ("tp=2,tp=4", "given twice"),
        ("tsp=4,tp=2", "do not combine"),
        ("zero=4", "zero must be"),
        ("tp=0", "must be >= 1"),
        ("tp=2,tpssm=2", "same weight axis"),
    ],
)
def test_layout_grammar_errors(text, message):
    with pytest.raises(MeshplanError, match=message):
        parse_layout(text)


def test_layout_validation_against_model_and_cluster():
    with pytest.raises(MeshplanError, match="tp=3 does not divide dense-7b's attention heads"):
        validate_layout(Layout(tp=3), PRESETS["dense-7b"])
    with pytest.raises(MeshplanError, match="KV heads"):
        validate_layout(Layout(tp=16), PRESETS["llama3-8b"])
    with pytest.raises(MeshplanError, match="has none; use tp=2"):
        validate_layout(Layout(tpssm=2), PRESETS["dense-7b"])
    with pytest.raises(MeshplanError, match="uses 4 GPUs but cluster h200-8 has 8"):
        validate_layout(Layout(tp=4), PRESETS["dense-7b"], 8, "h200-8")
    validate_layout(Layout(tpssm=4), PRESETS["mamba2-2.7b"])  # ngroups 1: B/C replicated, allowed
    with pytest.raises(MeshplanError, match="zigzag"):
        validate_seq(Layout(tsp=8), 1000, 1)


def test_cluster_presets_and_graphs():
    assert set(preset_names()) >= {"h100-sxm-8", "h200-8", "a100-sxm-8", "a6000-pcie-4", "mi300x-8"}
    h200 = load_cluster("h200-8")
    g = build_graph(h200)
    gpus = [n for n, d in g.nodes(data=True) if d["kind"] == "gpu"]
    assert len(gpus) == 8 and all(g.has_edge(x, "n0/nvswitch") for x in gpus)
    mi = build_graph(load_cluster("mi300x-8"))
    assert sum(1 for *_, d in mi.edges(data=True) if d["link"] == "xgmi") == 28  # 8·7/2 peer links
    two = build_graph(load_cluster("h100-sxm-8", nodes=2))
    assert two.has_node("network") and two.degree("network") == 16  # 8 NICs per node
    assert load_cluster("h100-sxm-8", nodes=4).num_gpus == 32


def test_cluster_toml_typos_are_named(tmp_path):
    good = (load_cluster.__globals__["resources"].files("meshplan.topologies") / "presets" / "h200-8.toml").read_text()
    path = tmp_path / "c.toml"
    path.write_text(good.replace("link_gb_per_s", "link_gbps"))
    with pytest.raises(MeshplanError, match=r"unknown key \[intra_node\] 'link_gbps'; did you mean 'link_gb_per_s'"):
        load_cluster(str(path))
    path.write_text(good.replace('fabric = "nvswitch"', 'fabric = "nvlinkk"'))
    with pytest.raises(MeshplanError, match="fabric 'nvlinkk' unknown"):
        load_cluster(str(path))
    path.write_text(good.replace("gpus_per_node = 8\n", ""))
    with pytest.raises(MeshplanError, match="missing key 'gpus_per_node'"):
        load_cluster(str(path))
    path.write_text("name = [")
    with pytest.raises(MeshplanError, match="not valid TOML"):
        load_cluster(str(path))
    path.write_text(good.replace("nics_per_node = 8", "nics_per_node = 7.5"))
    with pytest.raises(MeshplanError, match=r"\[inter_node\] nics_per_node must be a whole number, got 7.5"):
        load_cluster(str(path))
    # On the command line the section survives as written (Rich would take "[gpu]" for markup).
    from typer.testing import CliRunner

    from meshplan.cli import app

    path.write_text(good.replace("bf16_tflops = 989.4", "bf16_tflops = -1"))
    r = CliRunner().invoke(app, ["recommend", "--model", "dense-7b", "--cluster", str(path), "--seq", "4k"])
    assert (
        r.exit_code == 2 and r.output.strip() == f"error: {path}: [gpu] bf16_tflops must be a positive number, got -1"
    )


def test_sequence_axis_deals_zigzag_only_where_attention_alone_and_2_sigma_divides():
    from meshplan.layout import sp_zigzag

    assert sp_zigzag(Layout(sp=2), 16, attention_only=True)
    assert not sp_zigzag(Layout(sp=2), 18, attention_only=True)  # 4 chunks do not divide 18
    assert not sp_zigzag(Layout(sp=2), 16, attention_only=False)  # Mamba state passes shard to shard
    assert not sp_zigzag(Layout(tp=2), 16, attention_only=True)


def test_executor_positions_follow_the_same_rule():
    """Dense SP ranks hold chunks i and 2Σ−1−i; a Mamba-2 stack's SP ranks hold contiguous shards."""
    import torch

    from meshplan.executor.blocks import Stack
    from meshplan.executor.comm import Axis, Mesh
    from meshplan.executor.parallelize import token_positions
    from meshplan.models import dense, mamba2

    mesh = Mesh(Layout(sp=2), 1, 2, {"sp": Axis("sp", 2, 1, None, [0, 1])})
    d = Stack(dense("d", 32, 1, 4, 4, 64, 50), 1)
    m = Stack(mamba2("m", 32, 1, 50, d_state=8, headdim=8), 1)
    assert token_positions(mesh, 16, d).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert token_positions(mesh, 16, m).tolist() == list(range(8, 16))
    assert token_positions(mesh, 18, d).tolist() == list(range(9, 18))
    assert isinstance(token_positions(mesh, 16), torch.Tensor)


def test_zigzag_sp_prices_balanced_attention():
    """With zigzag shards every SP rank does the average causal work, not the last shard's 3/4 (at
    Σ = 2): the attention-heavy step is cheaper per token at a length 2Σ divides."""
    from meshplan.costmodel.options import CostOptions
    from meshplan.costmodel.step import estimate_step

    model, cluster = PRESETS["dense-7b"], load_cluster("h200-8")
    zig = estimate_step(model, Layout(sp=2, dp=4), 131072, 1, CostOptions(), cluster)
    contiguous = estimate_step(model, Layout(sp=2, dp=4), 131070, 1, CostOptions(), cluster)
    assert zig.compute_s / 131072 < 0.85 * contiguous.compute_s / 131070

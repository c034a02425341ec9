"""The HuggingFace families people train, read from config.json files with the published models'
dimensions: parameter counts within 1% of the published sizes, sliding windows priced as such, the
mixture-of-experts families refused in one line, and `memory`, `recommend` and `execute` taking each."""

import json

import pytest
from typer.testing import CliRunner

from meshplan.cli import app
from meshplan.costmodel.memory import memory_per_gpu
from meshplan.costmodel.options import CostOptions
from meshplan.costmodel.step import estimate_step
from meshplan.errors import MeshplanError
from meshplan.executor.support import executed_spec, unsupported
from meshplan.hf_config import model_from_hf_config
from meshplan.layout import parse_layout
from meshplan.topologies.cluster import load_cluster

runner = CliRunner()

# Each: the config.json fields that set the shapes (from the model's repository), and the size its
# model card or safetensors index publishes.
FAMILIES = {
    # Qwen/Qwen2.5-7B: "Number of Parameters: 7.61B".
    "qwen2": (
        {
            "model_type": "qwen2",
            "hidden_size": 3584,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "intermediate_size": 18944,
            "vocab_size": 152064,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": 131072,
            "max_window_layers": 28,
        },
        7.61e9,
    ),
    # Qwen/Qwen3-8B: "Number of Parameters: 8.2B".
    "qwen3": (
        {
            "model_type": "qwen3",
            "hidden_size": 4096,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 12288,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "use_sliding_window": False,
        },
        8.2e9,
    ),
    # google/gemma-2-9b: 9.24B parameters (its safetensors).
    "gemma2": (
        {
            "model_type": "gemma2",
            "hidden_size": 3584,
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "intermediate_size": 14336,
            "vocab_size": 256000,
            "sliding_window": 4096,
            "hidden_activation": "gelu_pytorch_tanh",
        },
        9.24e9,
    ),
    # google/gemma-3-1b-it (gemma3_text): 999,885,952 parameters.
    "gemma3_text": (
        {
            "model_type": "gemma3_text",
            "hidden_size": 1152,
            "num_hidden_layers": 26,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "intermediate_size": 6912,
            "vocab_size": 262144,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
        },
        999_885_952,
    ),
    # microsoft/Phi-3-mini-4k-instruct: 3.82B parameters.
    "phi3": (
        {
            "model_type": "phi3",
            "hidden_size": 3072,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "intermediate_size": 8192,
            "vocab_size": 32064,
            "sliding_window": 2047,
            "tie_word_embeddings": False,
        },
        3.82e9,
    ),
    # allenai/OLMo-2-1124-7B: 7.30B parameters.
    "olmo2": (
        {
            "model_type": "olmo2",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "intermediate_size": 11008,
            "vocab_size": 100352,
            "tie_word_embeddings": False,
        },
        7.30e9,
    ),
    # ibm-granite/granite-3.0-8b-base: 8.17B parameters.
    "granite": (
        {
            "model_type": "granite",
            "hidden_size": 4096,
            "num_hidden_layers": 40,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 12800,
            "vocab_size": 49155,
            "tie_word_embeddings": True,
            "embedding_multiplier": 12.0,
        },
        8.17e9,
    ),
}


def _write(tmp_path, raw, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parameter_count_within_one_percent_of_the_published_size(tmp_path, family):
    raw, published = FAMILIES[family]
    model = model_from_hf_config(_write(tmp_path, raw))
    assert model.param_count() == pytest.approx(published, rel=0.01), (family, model.param_count())


def test_family_features_read_from_the_config(tmp_path):
    read = {f: model_from_hf_config(_write(tmp_path, raw, f"{f}.json")) for f, (raw, _) in FAMILIES.items()}
    assert read["qwen2"].attention.qkv_bias and not read["qwen2"].attention.bias
    assert read["qwen2"].window_layers == 0  # use_sliding_window false
    assert read["qwen3"].attention.qk_norm == 2 * 128
    g2, g3 = read["gemma2"], read["gemma3_text"]
    assert g2.tied_embeddings and g2.attention.post_norm and g2.mlp.post_norm and g2.attention.head_dim == 256
    assert (g2.attention_window, g2.window_layers) == (4096, 21)  # the even layers of 42
    assert (g3.attention_window, g3.window_layers) == (512, 26 - 26 // 6)  # 5 local to 1 global
    assert read["phi3"].window_layers == 32
    assert read["olmo2"].attention.qk_norm == 4096 + 4096


def test_layer_types_name_the_sliding_layers(tmp_path):
    raw = dict(FAMILIES["gemma3_text"][0], layer_types=["sliding_attention"] * 20 + ["full_attention"] * 6)
    assert model_from_hf_config(_write(tmp_path, raw)).window_layers == 20
    raw["layer_types"] = ["sliding_attention"] * 3
    with pytest.raises(MeshplanError, match="layer_types has 3 entries"):
        model_from_hf_config(_write(tmp_path, raw))


def test_a_multimodal_gemma3_config_reads_its_text_config(tmp_path):
    text = dict(FAMILIES["gemma3_text"][0])
    text.pop("model_type")
    model = model_from_hf_config(_write(tmp_path, {"model_type": "gemma3", "text_config": text}))
    assert model.param_count() == pytest.approx(999_885_952, rel=0.01)
    with pytest.raises(MeshplanError, match="needs its text_config"):
        model_from_hf_config(_write(tmp_path, {"model_type": "gemma3"}))


def test_sliding_window_layers_cost_less_attention_and_cache(tmp_path):
    raw = FAMILIES["gemma2"][0]
    windowed = model_from_hf_config(_write(tmp_path, raw))
    full = model_from_hf_config(_write(tmp_path, dict(raw, sliding_window=None), "f.json"))  # null: no window
    cluster = load_cluster("h200-8")
    layout = parse_layout("tp=8")
    seq = 65536
    est_w = estimate_step(windowed, layout, seq, 1, CostOptions(), cluster)
    est_f = estimate_step(full, layout, seq, 1, CostOptions(), cluster)
    # Half the layers see 4096 keys instead of up to 64K: their attention FLOPs fall to
    # (w − w²/2s)/(s/2) = 0.121 of the full layers'; the model's FLOPs fall with them.
    assert est_w.breakdown["attention_s"] < 0.6 * est_f.breakdown["attention_s"]
    # Inference: the windowed layers cache 4096 tokens, the others all 64K.
    opts = CostOptions(mode="prefill")
    kv_w = memory_per_gpu(windowed, layout, seq, 1, opts).per_gpu_bytes["kv_cache"]
    kv_f = memory_per_gpu(full, layout, seq, 1, opts).per_gpu_bytes["kv_cache"]
    assert kv_w == pytest.approx(kv_f * (21 * seq + 21 * 4096) / (42 * seq), rel=1e-9)
    # Shorter than the window: nothing changes.
    assert (
        memory_per_gpu(windowed, layout, 2048, 1, opts).per_gpu_bytes["kv_cache"]
        == memory_per_gpu(full, layout, 2048, 1, opts).per_gpu_bytes["kv_cache"]
    )


@pytest.mark.parametrize(
    "model_type, field",
    [
        ("mixtral", "num_local_experts 8"),
        ("qwen3_moe", "num_experts 128"),
        ("deepseek_v3", "n_routed_experts 256"),
        ("jamba", "num_experts 16"),
    ],
)
def test_mixture_of_experts_families_are_refused_naming_what_is_missing(tmp_path, model_type, field):
    key, value = field.rsplit(" ", 1)
    raw = {"model_type": model_type, key: int(value), "hidden_size": 4096}
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(_write(tmp_path, raw))
    message = str(err.value)
    assert field in message and "expert parallelism" in message and "\n" not in message


@pytest.mark.parametrize("family", list(FAMILIES))
def test_memory_recommend_and_execute_take_each_family(tmp_path, family):
    path = str(_write(tmp_path, FAMILIES[family][0]))
    r = runner.invoke(app, ["memory", "--model", path, "--layout", "sp=2", "--seq", "8k", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["total_bytes"] > 0
    r = runner.invoke(app, ["recommend", "--model", path, "--cluster", "h200-8", "--seq", "8k", "--json", "--top", "1"])
    assert r.exit_code == 0, r.output
    model = model_from_hf_config(path)
    assert unsupported(parse_layout("sp=2"), model) is None
    spec, dropped = executed_spec(model)
    # What the executor leaves out is named, and the model it builds prices below the real one.
    assert spec.param_count() <= model.param_count()
    assert bool(dropped) == (family not in ("granite",)), (family, dropped)

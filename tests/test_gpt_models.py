"""GPT-style stacks (LayerNorm, biases, non-gated MLP, learned positions) and the HF families that
use them: parameter counts against the published sizes and the Megatron papers' Eq. 2."""

import json

import pytest

from meshplan.errors import MeshplanError
from meshplan.hf_config import model_from_hf_config
from meshplan.models import gpt

# (config.json fields as the hub publishes them, the published parameter count). The counts:
# GPT-2 124,439,808 and GPT-2 XL 1,557,611,200 (transformers' num_parameters of gpt2 / gpt2-xl),
# Pythia-6.9B 6,857,302,016 (EleutherAI/pythia model card), GPT-NeoX-20B 20,554,567,680 (Black et al.
# 2022, Table 1), StarCoder 15.5B (Li et al. 2023), OPT-1.3B 1,315,758,080 and OPT-6.7B 6.7B (Zhang et al. 2022).
CONFIGS = [
    (
        {
            "model_type": "gpt2",
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "n_positions": 1024,
            "vocab_size": 50257,
            "n_inner": None,
        },
        124_439_808,
    ),
    (
        {"model_type": "gpt2", "n_embd": 1600, "n_layer": 48, "n_head": 25, "n_positions": 1024, "vocab_size": 50257},
        1_557_611_200,
    ),
    (
        {
            "model_type": "gpt_neox",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "intermediate_size": 16384,
            "vocab_size": 50432,
            "tie_word_embeddings": False,
        },
        6_857_302_016,
    ),
    (
        {
            "model_type": "gpt_neox",
            "hidden_size": 6144,
            "num_hidden_layers": 44,
            "num_attention_heads": 64,
            "intermediate_size": 24576,
            "vocab_size": 50432,
            "tie_word_embeddings": False,
        },
        20_554_567_680,
    ),
    (
        {
            "model_type": "gpt_bigcode",
            "n_embd": 6144,
            "n_layer": 40,
            "n_head": 48,
            "n_positions": 8192,
            "vocab_size": 49152,
            "n_inner": 24576,
            "multi_query": True,
        },
        15.5e9,
    ),
    (
        {
            "model_type": "opt",
            "hidden_size": 2048,
            "num_hidden_layers": 24,
            "num_attention_heads": 32,
            "ffn_dim": 8192,
            "vocab_size": 50272,
            "max_position_embeddings": 2048,
            "word_embed_proj_dim": 2048,
        },
        1_315_758_080,
    ),
    (
        {
            "model_type": "opt",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "ffn_dim": 16384,
            "vocab_size": 50272,
            "max_position_embeddings": 2048,
        },
        6.7e9,
    ),
]


@pytest.mark.parametrize("raw,published", CONFIGS, ids=lambda x: x.get("model_type") if isinstance(x, dict) else "")
def test_hf_family_parameter_count(tmp_path, raw, published):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    spec = model_from_hf_config(path)
    assert spec.param_count() == pytest.approx(published, rel=0.01)
    assert spec.norm == "layernorm" and spec.mlp.gated is False


def test_bigcode_multi_query_keeps_one_kv_head(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS[4][0]))
    assert model_from_hf_config(path).attention.kv_heads == 1


def test_gpt_matches_megatron_eq2():
    # Narayanan et al. 2021 Eq. 2: P = 12·l·h² + 13·l·h + (V + s)·h; plus the final LayerNorm (2h).
    for h, l, a in ((12288, 96, 96), (2304, 24, 24), (25600, 128, 160)):  # noqa: E741 (Eq. 2's symbols)
        m = gpt("g", h, l, a, 51200, 2048)
        assert m.param_count() == 12 * l * h * h + 13 * l * h + (51200 + 2048) * h + 2 * h


def test_gpt_layer_norms_are_replicated_with_their_biases():
    m = gpt("g", 1024, 4, 16, 1000, 128)
    # Two LayerNorms a layer (scale and bias each) and the final one.
    assert m.norm_params() == (4 * 2 * 1024 + 1024) * 2


def test_opt_embedding_projection_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIGS[5][0], "word_embed_proj_dim": 512}))
    with pytest.raises(MeshplanError, match="word_embed_proj_dim"):
        model_from_hf_config(path)

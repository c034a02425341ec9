"""Read a local HuggingFace `config.json` into a ModelSpec, without network access.

Field names and defaults follow transformers' configuration classes (LlamaConfig, MistralConfig,
MambaConfig, Mamba2Config, FalconMambaConfig, Zamba2Config, GPT2Config, GPTNeoXConfig,
GPTBigCodeConfig, OPTConfig, MixtralConfig, DeepseekV3Config, GptOssConfig, GraniteMoeHybridConfig,
NemotronHConfig, JambaConfig, …), and the shapes what their modeling files build from them:
tests/test_hf_families.py holds every family's parameter count to transformers' own model, built on
the meta device. Unknown fields are ignored; a missing or malformed one is a MeshplanError naming the
file and the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError, read_json
from meshplan.models import (
    MIXED_KIND_SPECS,
    NEMOTRON_H_KINDS,
    PRESETS,
    AttentionSpec,
    Mamba1Spec,
    Mamba2Spec,
    MlpSpec,
    ModelSpec,
    MoeSpec,
    RopeSpec,
    dense,
)


class _Fields:
    """A config's fields, and the file they came from; `prefix` names where a nested config sits in it
    (a multimodal Gemma3's `text_config.`), so that an error names the key as the file spells it."""

    def __init__(self, raw: dict[str, Any], where: str, prefix: str = ""):
        self.raw, self.where, self.prefix = raw, where, prefix

    def error(self, message: str) -> MeshplanError:
        return MeshplanError(f"{self.where}: {message}")

    def need(self, *names: str) -> Any:
        """The first of `names` present (aliases across config versions); error if none is."""
        for name in names:
            if name in self.raw and self.raw[name] is not None:
                return self.raw[name]
        raise self.error(
            f"missing required field {self.prefix + names[0]!r} for model_type {self.raw.get('model_type')!r}"
        )

    def get(self, name: str, default: Any) -> Any:
        value = self.raw.get(name)
        return default if value is None else value

    def as_whole(self, name: str, value: Any, minimum: int = 1) -> int:
        """`value` of field `name` as an int of at least `minimum` (a size: positive, unless the field
        may be 0): a JSON integer, or a float with nothing after the point; anything else — 32.5, "4096",
        true — is a malformed config, not a number to round."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise self.error(f"{self.prefix}{name} must be a whole number, got {value!r}")
        if value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
            raise self.error(f"{self.prefix}{name} must be {kind}, got {value!r}")
        return int(value)

    def whole(self, *names: str, default: Any = None, minimum: int = 1) -> int:
        """The first of `names` present, as a whole number of at least `minimum`; `default` where none
        is (required when None)."""
        for name in names:
            if self.raw.get(name) is not None:
                return self.as_whole(name, self.raw[name], minimum)
        if default is None:
            return self.as_whole(names[0], self.need(*names), minimum)
        return default

    def flag(self, name: str, default: bool) -> bool:
        return bool(self.get(name, default))

    def refuse_unless(self, name: str, modelled: bool, what: str) -> None:
        """A flag whose other value changes shapes that meshplan does not model: one line naming it."""
        if self.flag(name, modelled) != modelled:
            raise self.error(
                f"{self.prefix}{name} {str(not modelled).lower()} ({what}) is not modelled; "
                f"meshplan prices the published shapes, with {name} {str(modelled).lower()}"
            )


@dataclass(frozen=True)
class _Defaults:
    """What transformers does where a Llama-shaped family's config.json is silent, and which bias flags
    its modeling file reads (transformers 5: configuration_<family>.py and modeling_<family>.py). A
    config that transformers saves omits the values equal to these (save_pretrained writes a diff)."""

    kv_heads: int | None = None  # num_key_value_heads when absent (None: num_attention_heads)
    head_dim: int | None = None  # head_dim when absent (None: hidden_size / num_attention_heads)
    window: int | None = None  # sliding_window when absent (an explicit null: no window)
    windowed: bool = True  # whether the family reads sliding_window at all
    attention_bias: bool = True  # whether attention_bias puts biases on Q, K, V and O
    mlp_bias: bool = False  # whether mlp_bias puts biases on the MLP's projections
    tied: bool = False  # tie_word_embeddings when absent


_GEMMA = _Defaults(kv_heads=4, head_dim=256, window=4096, tied=True)
_DENSE = {
    "llama": _Defaults(windowed=False, mlp_bias=True),
    "granite": _Defaults(windowed=False, mlp_bias=True),
    "mistral": _Defaults(kv_heads=8, window=4096, attention_bias=False),
    "phi3": _Defaults(attention_bias=False),
    "qwen2": _Defaults(kv_heads=32, window=4096, attention_bias=False),  # Q, K, V always biased, O never
    "qwen3": _Defaults(kv_heads=32, head_dim=128, window=4096),
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA,
    "olmo2": _Defaults(windowed=False),
    # Mixtral and Qwen-MoE: the attention of Mistral and Qwen2/3; their MLPs are mixtures of experts.
    "mixtral": _Defaults(kv_heads=8, attention_bias=False),
    "qwen2_moe": _Defaults(kv_heads=16, window=4096, attention_bias=False),
    "qwen3_moe": _Defaults(kv_heads=4, window=4096),
    # Granite-MoE: Granite's attention (biases on Q, K, V and O when attention_bias); its MLPs are experts.
    "granitemoe": _Defaults(windowed=False),
    "granitemoeshared": _Defaults(windowed=False),
}


def _llama(
    f: _Fields,
    name: str,
    *,
    qkv_bias: bool = False,
    qk_norm: str = "",
    post_norms: bool = False,
    window_layers: int | None = None,
) -> ModelSpec:
    """Llama and the decoders shaped like it. `qk_norm`: "head" (a head_dim scale each for queries and
    keys: Qwen3, Gemma3) or "width" (over the whole query and key widths: OLMo2); `post_norms`: the
    attention and MLP outputs normed too (Gemma2/3); `window_layers`: the attention layers a sliding
    window applies to (None: all of them when the config sets sliding_window)."""
    family = _DENSE[f.raw["model_type"]]
    hidden, heads = f.whole("hidden_size"), f.whole("num_attention_heads")
    kv = f.raw.get("num_key_value_heads", family.kv_heads)
    kv_heads = heads if kv is None else f.as_whole("num_key_value_heads", kv)
    if heads % kv_heads:
        raise f.error(
            f"{f.prefix}num_key_value_heads ({kv_heads}) must divide {f.prefix}num_attention_heads ({heads}); "
            "pick a divisor of the query heads"
        )
    # An explicit head_dim (Mistral-Nemo: hidden 5120, 32 heads of 128) sets the attention's width.
    head_dim = f.whole("head_dim", default=0) or family.head_dim
    if head_dim is None and hidden % heads:
        raise f.error(
            f"{f.prefix}num_attention_heads ({heads}) must divide {f.prefix}hidden_size ({hidden}); or give head_dim"
        )
    spec = dense(
        name,
        hidden,
        f.whole("num_hidden_layers"),
        heads,
        kv_heads,
        f.whole("intermediate_size"),
        f.whole("vocab_size"),
        gated=True,
        tied=f.flag("tie_word_embeddings", family.tied),
        source=f.where,
        head_dim=head_dim,
        bias=family.attention_bias and f.flag("attention_bias", False),
    )
    attn = spec.attention
    norm = {"": 0, "head": 2 * attn.head_dim, "width": attn.q_width + attn.kv_width}[qk_norm]
    attention = replace(attn, qkv_bias=qkv_bias, qk_norm=norm, post_norm=post_norms)
    mlp = replace(spec.mlp, post_norm=post_norms, bias=family.mlp_bias and f.flag("mlp_bias", False))
    window = f.raw.get("sliding_window", family.window) if family.windowed else None
    if window_layers is None:
        window_layers = spec.layers if window else 0
    if window and window_layers:
        window = f.as_whole("sliding_window", window)
    else:
        window, window_layers = 0, 0
    return replace(
        spec,
        attention=attention,
        mlp=mlp,
        attention_window=window,
        window_layers=window_layers,
        rope=_rope(f),
        norm_eps=_eps(f, "rms_norm_eps"),
    )


def _rope(f: _Fields) -> RopeSpec:
    """rope_theta and rope_scaling (transformers 4) or rope_parameters (transformers 5, which writes
    both there)."""
    params = f.raw.get("rope_parameters") or {}
    scaling = f.raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise MeshplanError(f"{f.where}: rope_parameters / rope_scaling must be JSON objects")
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", f.get("rope_theta", 10000.0))
    kind = merged.get("rope_type", merged.get("type", "default"))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise MeshplanError(f"{f.where}: rope_theta must be a positive number, got {theta!r}")
    defaults = RopeSpec()
    return RopeSpec(
        theta=float(theta),
        kind=str(kind),
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(merged.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_positions=int(merged.get("original_max_position_embeddings", defaults.original_max_positions)),
    )


def _eps(f: _Fields, *names: str) -> float:
    for name in names:
        value = f.raw.get(name)
        if value is not None:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
                raise MeshplanError(f"{f.where}: {name} must be a small non-negative number, got {value!r}")
            return float(value)
    return 1e-5


def _layer_types(f: _Fields, layers: int) -> int | None:
    """Sliding layers named by a config's layer_types (transformers ≥ 4.53), None if it has none."""
    types = f.raw.get("layer_types")
    if not types:
        return None
    if len(types) != layers:
        raise MeshplanError(f"{f.where}: layer_types has {len(types)} entries but num_hidden_layers is {layers}")
    return sum(1 for t in types if t == "sliding_attention")


def _qwen(f: _Fields, name: str) -> ModelSpec:
    """Qwen2 (biases on Q, K, V) and Qwen3 (none, unless attention_bias; a head_dim norm of queries and
    keys). Layers from max_window_layers on use the sliding window when use_sliding_window is set."""
    layers = f.whole("num_hidden_layers")
    sliding = bool(f.get("use_sliding_window", False))
    window_layers = _layer_types(f, layers)
    if window_layers is None:
        # Qwen2Config / Qwen3Config: max_window_layers 28 when absent.
        window_layers = layers - min(layers, f.whole("max_window_layers", default=28, minimum=0)) if sliding else 0
    qwen3 = f.raw.get("model_type") in ("qwen3", "qwen3_moe")
    return _llama(f, name, qkv_bias=not qwen3, qk_norm="head" if qwen3 else "", window_layers=window_layers)


def _gemma(f: _Fields, name: str) -> ModelSpec:
    """Gemma2 and Gemma3 (text): GeGLU (a gated MLP, so priced as SwiGLU), head_dim of its own, tied,
    a norm before and after each block; sliding-window attention on every other layer (Gemma2) or on
    all but every sliding_window_pattern-th (Gemma3: 5 local to 1 global). Gemma3 adds query / key
    norms. A multimodal Gemma3 config's text_config is read; its vision tower is not modelled."""
    if f.raw.get("model_type") == "gemma3":
        text = f.raw.get("text_config")
        if not isinstance(text, dict):
            raise MeshplanError(f"{f.where}: a gemma3 config needs its text_config; or give the gemma3_text config")
        f = _Fields({**text, "model_type": "gemma3_text"}, f.where, prefix="text_config.")
    layers = f.whole("num_hidden_layers")
    gemma3 = f.raw.get("model_type") == "gemma3_text"
    window_layers = _layer_types(f, layers)
    if window_layers is None:
        if gemma3:  # layer i is global when (i + 1) % pattern == 0 (transformers' Gemma3 before layer_types)
            window_layers = layers - layers // f.whole("sliding_window_pattern", default=6)
        else:  # Gemma2: the even layers slide
            window_layers = (layers + 1) // 2
    return _llama(f, name, qk_norm="head" if gemma3 else "", post_norms=True, window_layers=window_layers)


def _olmo2(f: _Fields, name: str) -> ModelSpec:
    """OLMo2: norms after the attention and the MLP instead of before (as many scales), and RMS norms of
    the whole query and key widths."""
    return _llama(f, name, qk_norm="width")


# Mixture-of-experts families not read yet: their expert counts, so that the refusal can say what is missing.
_MOE = {
    "dbrx": "ffn_config",
    "olmoe": "num_experts",
    "phimoe": "num_local_experts",
    "llama4": "num_local_experts",
}


def _gpt2(f: _Fields, name: str) -> ModelSpec:
    """GPT-2 and GPTBigCode (StarCoder): LayerNorm, biases, a non-gated GeLU MLP (n_inner, default 4h),
    learned positions over n_positions, tied head; GPTBigCode's multi_query keeps one K/V head."""
    hidden, heads = f.whole("n_embd", "hidden_size"), f.whole("n_head", "num_attention_heads")
    kv_heads = 1 if f.raw.get("model_type") == "gpt_bigcode" and f.get("multi_query", True) else heads
    return dense(
        name,
        hidden,
        f.whole("n_layer", "num_hidden_layers"),
        heads,
        kv_heads,
        f.whole("n_inner", default=4 * hidden),
        f.whole("vocab_size"),
        gated=False,
        tied=bool(f.get("tie_word_embeddings", True)),
        source=f.where,
        bias=True,
        norm="layernorm",
        positions="learned",
        max_positions=f.whole("n_positions", "max_position_embeddings", default=1024),  # GPT2Config's default
    )


def _gpt_neox(f: _Fields, name: str) -> ModelSpec:
    """GPT-NeoX / Pythia: LayerNorm, biases (attention_bias, default true, on the attention; the MLP's
    always), a non-gated GeLU MLP, rotary positions, untied head. The parallel residual changes no
    shape."""
    spec = dense(
        name,
        f.whole("hidden_size"),
        f.whole("num_hidden_layers"),
        f.whole("num_attention_heads"),
        f.whole("num_attention_heads"),
        f.whole("intermediate_size", default=24576),  # GPTNeoXConfig's default (not 4 · hidden_size)
        f.whole("vocab_size"),
        gated=False,
        tied=f.flag("tie_word_embeddings", False),
        source=f.where,
        bias=f.flag("attention_bias", True),
        norm="layernorm",
    )
    return replace(spec, mlp=replace(spec.mlp, bias=True))  # modeling_gpt_neox.py: dense_h_to_4h, dense_4h_to_h


# OPT's learned position table has 2 rows past max_position_embeddings (OPTLearnedPositionalEmbedding's
# offset, transformers' modeling_opt.py).
OPT_POSITION_OFFSET = 2


def _opt(f: _Fields, name: str) -> ModelSpec:
    """OPT: LayerNorm, biases (enable_bias), a non-gated ReLU MLP of ffn_dim, learned positions, tied
    head. A word_embed_proj_dim unlike hidden_size (opt-350m) adds two small projections, counted
    here as part of the embedding."""
    hidden = f.whole("hidden_size")
    f.refuse_unless("do_layer_norm_before", True, "opt-350m's post-norm, which drops the final LayerNorm")
    f.refuse_unless("_remove_final_layer_norm", False, "no final LayerNorm")
    f.refuse_unless("layer_norm_elementwise_affine", True, "LayerNorms without scales or biases")
    spec = dense(
        name,
        hidden,
        f.whole("num_hidden_layers"),
        f.whole("num_attention_heads"),
        f.whole("num_attention_heads"),
        f.whole("ffn_dim"),
        f.whole("vocab_size"),
        gated=False,
        tied=bool(f.get("tie_word_embeddings", True)),
        source=f.where,
        bias=bool(f.get("enable_bias", True)),
        norm="layernorm",
        positions="learned",
        max_positions=f.whole("max_position_embeddings", default=2048) + OPT_POSITION_OFFSET,  # OPTConfig's
    )
    proj = f.whole("word_embed_proj_dim", default=hidden)
    if proj != hidden:
        raise MeshplanError(
            f"{f.where}: word_embed_proj_dim ({proj}) differs from hidden_size ({hidden}); "
            "the embedding projections of opt-350m are not modelled — use a config where they match"
        )
    return spec


def _mamba_biases(f: _Fields) -> None:
    """Every published Mamba keeps the conv's bias and no projection biases; the specs price those."""
    f.refuse_unless("use_bias", False, "biases on in_proj and out_proj")
    f.refuse_unless("use_conv_bias", True, "a conv1d without its bias")


def _mamba1(f: _Fields, name: str) -> ModelSpec:
    """Mamba and Falcon-Mamba (MambaConfig / FalconMambaConfig: expand 2, state 16, conv 4,
    time_step_rank ceil(hidden / 16), tied)."""
    hidden = f.whole("hidden_size")
    _mamba_biases(f)
    rank = f.get("time_step_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if rank == "auto" else f.as_whole("time_step_rank", rank)
    spec = Mamba1Spec(
        hidden,
        d_state=f.whole("state_size", default=16),
        expand=f.whole("expand", default=2),
        dt_rank=dt_rank,
        d_conv=f.whole("conv_kernel", default=4),
    )
    return ModelSpec(
        name=name,
        family="mamba1",
        d_model=hidden,
        layers=f.whole("num_hidden_layers"),
        vocab=f.whole("vocab_size"),
        tied_embeddings=f.flag("tie_word_embeddings", True),
        mamba1=spec,
        source=f.where,
    )


def _mamba2(f: _Fields, name: str) -> ModelSpec:
    """Mamba-2 (Mamba2Config: state 128, expand 2, head_dim 64, n_groups 8, conv 4, untied). num_heads
    may be left out: expand · hidden_size / head_dim."""
    hidden = f.whole("hidden_size")
    _mamba_biases(f)
    expand, headdim = f.whole("expand", default=2), f.whole("head_dim", default=64)
    _divides(f, "head_dim", headdim, "expand · hidden_size", expand * hidden)
    nheads = f.whole("num_heads", default=expand * hidden // headdim)
    if nheads * headdim != expand * hidden:
        raise f.error(
            f"num_heads ({nheads}) disagrees with expand · hidden_size / head_dim "
            f"({expand} · {hidden} / {headdim} = {expand * hidden // headdim}); fix one of them"
        )
    ngroups = f.whole("n_groups", default=8)
    _divides(f, "n_groups", ngroups, "num_heads", nheads)
    spec = Mamba2Spec(
        hidden,
        d_state=f.whole("state_size", default=128),
        expand=expand,
        headdim=headdim,
        ngroups=ngroups,
        d_conv=f.whole("conv_kernel", default=4),
        chunk_size=f.whole("chunk_size", default=256),
    )
    return ModelSpec(
        name=name,
        family="mamba2",
        d_model=hidden,
        layers=f.whole("num_hidden_layers"),
        vocab=f.whole("vocab_size"),
        tied_embeddings=f.flag("tie_word_embeddings", False),  # Mamba2Config: untied unless told
        mamba2=spec,
        norm_eps=_eps(f, "layer_norm_epsilon"),
        source=f.where,
    )


def _divides(f: _Fields, name: str, value: int, what: str, total: int) -> None:
    """An error naming field `name` unless its `value` divides `total` (named `what`)."""
    if total % value:
        raise f.error(f"{name} ({value}) must divide {what} ({total}); pick a divisor")


def _zamba2(f: _Fields, name: str) -> ModelSpec:
    """Zamba2 (transformers' modeling_zamba2.py): a Mamba-2 backbone; after each "hybrid" layer's
    Mamba block runs a shared transformer block (num_mem_blocks copies, used in turn). The block's
    attention reads concat(hidden, embeddings), 2 · hidden_size wide (heads of 2 · hidden_size /
    num_attention_heads), and its o_proj writes hidden_size; its MLP is hidden_size → intermediate_size →
    hidden_size (gated). Each hybrid layer owns a hidden_size² linear after the block and rank
    adapter_rank LoRA adapters on the MLP's gate/up (always) and on Q, K, V
    (use_shared_attention_adapter)."""
    hidden = f.whole("hidden_size")
    layers = f.whole("num_hidden_layers")
    f.refuse_unless("add_bias_linear", False, "biases on the projections")
    f.refuse_unless("use_conv_bias", True, "a conv1d without its bias")
    expand = f.whole("mamba_expand", default=2)
    n_mamba_heads = f.whole("n_mamba_heads", default=8)  # Zamba2Config's default
    _divides(f, "n_mamba_heads", n_mamba_heads, "mamba_expand · hidden_size", expand * hidden)
    block_types = f.need("layers_block_type", "layer_types")
    if not isinstance(block_types, list) or len(block_types) != layers:
        count = f"{len(block_types)} entries" if isinstance(block_types, list) else repr(block_types)
        raise f.error(f"layers_block_type has {count} but num_hidden_layers is {layers}; give one type a layer")
    hybrid_layers = sum(1 for t in block_types if t == "hybrid")
    if not hybrid_layers:
        raise f.error('layers_block_type names no "hybrid" layer; without its shared block a Zamba2 is a mamba2 model')
    heads = f.whole("num_attention_heads")
    kv_heads = f.whole("num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise f.error(
            f"num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads}); "
            "pick a divisor of the query heads"
        )
    attn_hidden = 2 * hidden  # Zamba2Config: attention_hidden_size = 2 · hidden_size
    ngroups = f.whole("mamba_ngroups", default=1)
    _divides(f, "mamba_ngroups", ngroups, "n_mamba_heads", n_mamba_heads)
    mamba = Mamba2Spec(
        hidden,
        d_state=f.whole("mamba_d_state", default=64),
        expand=expand,
        headdim=expand * hidden // n_mamba_heads,  # Zamba2Config: mamba_headdim, whatever the file says
        ngroups=ngroups,
        d_conv=f.whole("mamba_d_conv", default=4),
        chunk_size=f.whole("chunk_size", default=256),
    )
    act = f.get("hidden_act", "gelu")  # Zamba2Config's default: the shared MLP's gate through GeLU
    if act not in ("gelu", "silu"):
        raise f.error(f"hidden_act {act!r}: the shared MLP's gate runs gelu (GeGLU) or silu (SwiGLU); give one")
    return ModelSpec(
        name=name,
        family="hybrid",
        d_model=hidden,
        layers=layers,
        vocab=f.whole("vocab_size"),
        tied_embeddings=f.flag("tie_word_embeddings", True),
        mamba2=mamba,
        attention=AttentionSpec(attn_hidden, heads, kv_heads, attn_hidden // heads, hidden),
        mlp=MlpSpec(hidden, f.whole("intermediate_size", default=4 * hidden), gated=True, geglu=act == "gelu"),
        hybrid_layers=hybrid_layers,
        hybrid_layer_ids=tuple(i for i, t in enumerate(block_types) if t == "hybrid"),
        # transformers builds a copy only for each of the first num_mem_blocks hybrid layers.
        shared_blocks=min(f.whole("num_mem_blocks", default=1), hybrid_layers),
        adapter_rank=f.whole("adapter_rank", default=128, minimum=0),
        attention_adapters=f.flag("use_shared_attention_adapter", False),
        norm_eps=_eps(f, "rms_norm_eps"),
        # use_mem_rope: the shared attention turns q and k by the rotary (its head_dim wide); else no positions
        rope=_rope(f) if f.flag("use_mem_rope", False) else RopeSpec(kind="none"),
        source=f.where,
    )


def _moe(f: _Fields, name: str) -> ModelSpec:
    """Mixtral and Granite-MoE (every MLP a mixture of num_local_experts experts of intermediate_size;
    Granite-MoE-Shared adds a shared expert of shared_intermediate_size, ungated, when it is not 0) and
    Qwen2/3-MoE (num_experts of moe_intermediate_size; layers in mlp_only_layers, or off the
    decoder_sparse_step, keep a dense MLP of intermediate_size; Qwen2-MoE adds shared experts of
    shared_expert_intermediate_size behind a sigmoid gate). Granite's multipliers scale activations and
    change no shape."""
    model_type = f.raw.get("model_type")
    llama_shaped = model_type in ("mixtral", "granitemoe", "granitemoeshared")
    spec = _llama(f, name) if llama_shaped else _qwen(f, name)
    granite = model_type in ("granitemoe", "granitemoeshared")
    experts = f.whole("num_local_experts", "num_experts", default=8 if granite else None)  # GraniteMoeConfig's 8
    top_k = _top_k(f, experts, default=2 if llama_shaped else 8)
    layers = spec.layers
    if llama_shaped:
        expert_ffn, dense_ids = spec.mlp.ffn_hidden, ()
        shared = f.whole("shared_intermediate_size", default=0, minimum=0) if model_type == "granitemoeshared" else 0
        moe = MoeSpec(spec.d_model, experts, top_k, expert_ffn, shared_ffn=shared)
    else:
        expert_ffn = f.whole("moe_intermediate_size")
        shared = f.whole("shared_expert_intermediate_size", default=0, minimum=0)
        step = f.whole("decoder_sparse_step", default=1)
        only = f.get("mlp_only_layers", []) or []
        if not isinstance(only, list) or any(not isinstance(i, int) or not 0 <= i < layers for i in only):
            raise f.error(f"mlp_only_layers must list layers in 0..{layers - 1}, got {only!r}")
        dense_ids = tuple(i for i in range(layers) if i in only or (i + 1) % step)
        moe = MoeSpec(
            spec.d_model,
            experts,
            top_k,
            expert_ffn,
            shared_ffn=shared,
            shared_gate=bool(shared),
            norm_topk=f.flag("norm_topk_prob", False),  # transformers' Qwen2/3-MoE default
        )
    return replace(spec, family="moe", moe=moe, dense_layer_ids=dense_ids, mlp=spec.mlp if dense_ids else None)


def _top_k(f: _Fields, experts: int, default: int | None, *names: str) -> int:
    """Experts a token runs (num_experts_per_tok, or `names`), at most `experts`."""
    names = names or ("num_experts_per_tok",)
    top_k = f.whole(*names, default=default)
    if top_k > experts:
        raise f.error(f"{f.prefix}{names[0]} ({top_k}) exceeds the {experts} experts; use at most {experts}")
    return top_k


def _deepseek(f: _Fields, name: str) -> ModelSpec:
    """DeepSeek-V2 and V3 (transformers' DeepseekV2Config / DeepseekV3Config and their modeling files):
    multi-head latent attention (q_lora_rank — null: queries projected from the hidden state —,
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; attention_bias on q_a, kv_a and o); the
    first first_k_dense_replace layers a dense MLP of intermediate_size, every later one a mixture of
    n_routed_experts of moe_intermediate_size, num_experts_per_tok a token, beside n_shared_experts of
    that width always run. V3's sigmoid router keeps e_score_correction_bias as a buffer, not a
    parameter; grouped routing (n_group, topk_group) changes no shape. Transformers builds no
    multi-token-prediction module (num_nextn_predict_layers) and neither does this reader: the
    deepseek-v3-mtp preset prices V3's (ModelSpec.mtp_layers)."""
    v3 = f.raw.get("model_type") == "deepseek_v3"
    hidden, layers, heads = f.whole("hidden_size"), f.whole("num_hidden_layers"), f.whole("num_attention_heads")
    # DeepseekV2Config / DeepseekV3Config defaults where the file is silent; an explicit null q_lora_rank
    # is a plain query projection (DeepSeek-V2-Lite).
    plain_q = "q_lora_rank" in f.raw and f.raw["q_lora_rank"] is None
    q_lora = 0 if plain_q else f.whole("q_lora_rank", default=1536)
    nope, rope = f.whole("qk_nope_head_dim", default=128), f.whole("qk_rope_head_dim", default=64)
    attention = AttentionSpec(
        hidden,
        heads,
        heads,
        nope + rope,
        hidden,
        bias=f.flag("attention_bias", False),
        kv_lora_rank=f.whole("kv_lora_rank", default=512),
        q_lora_rank=q_lora,
        rope_head_dim=rope,
        v_head_dim=f.whole("v_head_dim", default=128),
    )
    if not v3:  # DeepseekV2MLP reads mlp_bias for the dense MLP and the shared experts; V3's has none
        f.refuse_unless("mlp_bias", False, "biases on the dense MLP and the shared experts")
    freq = f.whole("moe_layer_freq", default=1)
    if freq != 1:
        raise f.error(
            f"moe_layer_freq {freq} is not what transformers builds (a mixture of experts on every layer from "
            "first_k_dense_replace on); meshplan reads moe_layer_freq 1"
        )
    first_dense = min(layers, f.whole("first_k_dense_replace", default=3 if v3 else 0, minimum=0))
    spec = ModelSpec(
        name=name,
        family="dense",
        d_model=hidden,
        layers=layers,
        vocab=f.whole("vocab_size"),
        tied_embeddings=f.flag("tie_word_embeddings", False),
        attention=attention,
        mlp=MlpSpec(hidden, f.whole("intermediate_size", default=18432 if v3 else 11008)),
        rope=_rope(f),
        norm_eps=_eps(f, "rms_norm_eps"),
        source=f.where,
    )
    if first_dense == layers:
        return spec
    experts = f.whole("n_routed_experts", default=256 if v3 else 64)
    _expert_groups(f, experts)
    expert_ffn = f.whole("moe_intermediate_size", default=2048 if v3 else 1407)
    moe = MoeSpec(
        hidden,
        experts,
        _top_k(f, experts, 8 if v3 else None),
        expert_ffn,
        shared_ffn=f.whole("n_shared_experts", default=1 if v3 else 2, minimum=0) * expert_ffn,
    )
    dense_ids = tuple(range(first_dense))
    return replace(spec, family="moe", moe=moe, dense_layer_ids=dense_ids, mlp=spec.mlp if dense_ids else None)


def _expert_groups(f: _Fields, experts: int) -> None:
    """Grouped routing (DeepSeek, Nemotron-H): n_group groups of experts, topk_group of them searched.
    No shape depends on them; a split the router cannot make is an error."""
    groups, chosen = f.raw.get("n_group"), f.raw.get("topk_group")
    if groups is None:
        return
    groups = f.as_whole("n_group", groups)
    _divides(f, "n_group", groups, "the routed experts", experts)
    if chosen is not None and f.as_whole("topk_group", chosen) > groups:
        raise f.error(f"topk_group ({chosen}) exceeds n_group ({groups}); pick at most {groups} groups")


def _gpt_oss(f: _Fields, name: str) -> ModelSpec:
    """gpt-oss (transformers' GptOssConfig / modeling_gpt_oss.py): every layer a mixture of
    num_local_experts experts of intermediate_size, experts_per_token a token, with biases on each
    expert's gate/up (one matrix of interleaved gate and up columns: the weights of separate gate and up
    projections) and down projections and on the router; attention of head_dim heads with biases
    (attention_bias) and one learned sink logit a head; sliding_window attention on the layers
    layer_types names sliding (every other one, from the first, when absent)."""
    hidden, layers, heads = f.whole("hidden_size"), f.whole("num_hidden_layers"), f.whole("num_attention_heads")
    kv_heads = f.whole("num_key_value_heads", default=8)  # GptOssConfig's defaults, where the file is silent
    _divides(f, "num_key_value_heads", kv_heads, "num_attention_heads", heads)
    attention = AttentionSpec(
        hidden,
        heads,
        kv_heads,
        f.whole("head_dim", default=64),
        hidden,
        bias=f.flag("attention_bias", True),
        sinks=True,
    )
    experts = f.whole("num_local_experts", "num_experts", default=128)
    top_k = _top_k(f, experts, 4, "num_experts_per_tok", "experts_per_token")
    moe = MoeSpec(
        hidden, experts, top_k, f.whole("intermediate_size", default=2880), expert_bias=True, router_bias=True
    )
    window_layers = _layer_types(f, layers)
    if window_layers is None:  # GptOssConfig: layer i slides when i is even
        window_layers = (layers + 1) // 2
    window = f.raw.get("sliding_window", 128)  # an explicit null: no window
    if not window or not window_layers:
        window, window_layers = 0, 0
    return ModelSpec(
        name=name,
        family="moe",
        d_model=hidden,
        layers=layers,
        vocab=f.whole("vocab_size"),
        tied_embeddings=f.flag("tie_word_embeddings", False),
        attention=attention,
        moe=moe,
        attention_window=f.as_whole("sliding_window", window) if window else 0,
        window_layers=window_layers,
        rope=_rope(f),
        norm_eps=_eps(f, "rms_norm_eps"),
        source=f.where,
    )


# transformers' remap_legacy_layer_types (configuration_utils.py): the names older configs use.
_MAMBA_LAYER = ("mamba", "linear_attention")
_ATTENTION_LAYER = ("attention", "full_attention")


def _layer_list(f: _Fields, layers: int | None, *names: str, default: list | None = None) -> list[str]:
    """A config's list of layer types (the first of `names` present, else `default`), one a layer."""
    types = next((f.raw[n] for n in names if f.raw.get(n) is not None), default)
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise f.error(f"{names[0]} must be a list of layer types, one a layer; got {types!r}")
    if layers is not None and len(types) != layers:
        raise f.error(f"{names[0]} has {len(types)} entries but num_hidden_layers is {layers}; give one type a layer")
    return types


def _layer_attention(f: _Fields, hidden: int, bias: bool, kv_heads: int | None = None) -> AttentionSpec:
    """A hybrid's attention layers (Granite 4.0-H, Jamba): num_attention_heads of hidden / heads, and
    num_key_value_heads (`kv_heads` when absent; None: all of them)."""
    heads = f.whole("num_attention_heads")
    kv_heads = f.whole("num_key_value_heads", default=kv_heads or heads)
    _divides(f, "num_key_value_heads", kv_heads, "num_attention_heads", heads)
    _divides(f, "num_attention_heads", heads, "hidden_size", hidden)
    return AttentionSpec(hidden, heads, kv_heads, hidden // heads, hidden, bias=bias)


def _mixed(f: _Fields, name: str, hidden: int, kinds: list[tuple[str, ...]], **specs) -> ModelSpec:
    """A mixed model of `kinds` layers, with the specs they run (the others left out)."""
    used = {kind for layer in kinds for kind in layer}
    keep = {part: spec for part, spec in specs.items() if any(MIXED_KIND_SPECS[k] == part for k in used)}
    return ModelSpec(
        name=name,
        family="mixed",
        d_model=hidden,
        layers=len(kinds),
        vocab=f.whole("vocab_size"),
        tied_embeddings=f.flag("tie_word_embeddings", False),
        layer_kinds=tuple(kinds),
        rope=_rope(f),
        source=f.where,
        **keep,
    )


def _granitemoehybrid(f: _Fields, name: str) -> ModelSpec:
    """Granite 4.0-H (transformers' GraniteMoeHybridConfig / modeling_granitemoehybrid.py): each layer a
    Mamba-2 mixer or attention (layer_types, alias layers_block_type: "mamba" / "attention", or their
    newer names), then a mixture of num_local_experts experts of intermediate_size beside a shared
    expert of shared_intermediate_size — or, with num_local_experts 0, that shared MLP alone. The Mamba-2
    mixer: mamba_n_heads of mamba_d_head ("auto": mamba_expand · hidden_size / mamba_n_heads),
    mamba_n_groups, mamba_d_state, mamba_d_conv. The multipliers scale activations only."""
    hidden, layers = f.whole("hidden_size"), f.whole("num_hidden_layers")
    types = _layer_list(f, layers, "layer_types", "layers_block_type", default=["mamba"] * layers)
    for t in types:
        if t not in _MAMBA_LAYER + _ATTENTION_LAYER:
            raise f.error(f'layer_types names {t!r}; use "mamba" or "attention" for each layer')
    f.refuse_unless("mamba_conv_bias", True, "a conv1d without its bias")
    f.refuse_unless("mamba_proj_bias", False, "biases on in_proj and out_proj")
    expand = f.whole("mamba_expand", default=2)  # GraniteMoeHybridConfig's defaults, where the file is silent
    nheads = f.whole("mamba_n_heads", default=128)
    _divides(f, "mamba_n_heads", nheads, "mamba_expand · hidden_size", expand * hidden)
    head = f.get("mamba_d_head", "auto")
    headdim = expand * hidden // nheads if head == "auto" else f.as_whole("mamba_d_head", head)
    if headdim * nheads != expand * hidden:
        raise f.error(
            f"mamba_d_head ({headdim}) · mamba_n_heads ({nheads}) must be mamba_expand · hidden_size "
            f'({expand * hidden}); fix one of them or write "auto"'
        )
    ngroups = f.whole("mamba_n_groups", default=1)
    _divides(f, "mamba_n_groups", ngroups, "mamba_n_heads", nheads)
    mamba = Mamba2Spec(
        hidden,
        d_state=f.whole("mamba_d_state", default=256),
        expand=expand,
        headdim=headdim,
        ngroups=ngroups,
        d_conv=f.whole("mamba_d_conv", default=4),
        chunk_size=f.whole("mamba_chunk_size", default=256),
    )
    experts = f.whole("num_local_experts", default=8, minimum=0)
    shared = f.whole("shared_intermediate_size", default=1024, minimum=0)
    moe = mlp = None
    if experts:
        top_k = _top_k(f, experts, 2)
        moe = MoeSpec(hidden, experts, top_k, f.whole("intermediate_size", default=11008), shared_ffn=shared)
        ffn = ("router", "experts") + (("shared_expert",) if shared else ())
    else:
        if not shared:
            raise f.error("num_local_experts and shared_intermediate_size are both 0: the layers would have no MLP")
        mlp, ffn = MlpSpec(hidden, shared), ("mlp",)
    kinds = [("mamba2" if t in _MAMBA_LAYER else "attention",) + ffn for t in types]
    attention = _layer_attention(f, hidden, f.flag("attention_bias", False)) if "attention" in sum(kinds, ()) else None
    spec = _mixed(f, name, hidden, kinds, attention=attention, mamba2=mamba, moe=moe, mlp=mlp)
    return replace(spec, norm_eps=_eps(f, "rms_norm_eps"))


# Nemotron-H's layer types (NemotronHConfig's names, and the older ones remap_legacy_layer_types renames) as
# the characters of hybrid_override_pattern (models.NEMOTRON_H_KINDS).
_NEMOTRON_TYPES = {
    "linear_attention": "M",
    "mamba": "M",
    "full_attention": "*",
    "attention": "*",
    "mlp": "-",
    "moe": "E",
}


def _nemotron_h_pattern(f: _Fields) -> str:
    """Nemotron-H's layers, one character each (M Mamba-2, * attention, - MLP, E mixture of experts):
    layers_block_type (alias layer_types), else hybrid_override_pattern, as NemotronHConfig reads them."""
    if f.raw.get("layers_block_type") is None and f.raw.get("layer_types") is None:
        pattern = f.get("hybrid_override_pattern", "ME*-")  # NemotronHConfig's default layers
        if not isinstance(pattern, str) or not pattern or any(c not in NEMOTRON_H_KINDS for c in pattern):
            raise f.error(
                f"hybrid_override_pattern must be one character a layer of M (Mamba-2), * (attention), "
                f"- (MLP) and E (experts); got {pattern!r}"
            )
        where = "hybrid_override_pattern"
    else:
        where = "layers_block_type"
        types = _layer_list(f, None, "layers_block_type", "layer_types")
        for t in types:
            if t not in _NEMOTRON_TYPES:
                raise f.error(f'{where} names {t!r}; use "mamba", "attention", "mlp" or "moe" for each layer')
        pattern = "".join(_NEMOTRON_TYPES[t] for t in types)
    layers = f.raw.get("num_hidden_layers")
    if layers is not None and f.as_whole("num_hidden_layers", layers) != len(pattern):
        raise f.error(f"{where} has {len(pattern)} layers but num_hidden_layers is {layers}; make them agree")
    return pattern


def _nemotron_h(f: _Fields, name: str) -> ModelSpec:
    """Nemotron-H and Nemotron 3 (transformers' NemotronHConfig / modeling_nemotron_h.py): each layer one
    block behind its own norm — a Mamba-2 mixer (mamba_num_heads of mamba_head_dim: its width is theirs,
    not expand · hidden_size; n_groups, ssm_state_size, conv_kernel), attention (no biases), a
    squared-ReLU MLP of intermediate_size (up and down), or a mixture of n_routed_experts squared-ReLU
    experts of moe_intermediate_size, num_experts_per_tok a token, beside a shared expert of
    moe_shared_expert_intermediate_size (the sigmoid router's e_score_correction_bias is a buffer). The
    mamba_* spellings of the Mamba fields win, as in NemotronHConfig. Transformers builds no MTP layers
    (num_nextn_predict_layers)."""
    hidden = f.whole("hidden_size")
    pattern = _nemotron_h_pattern(f)
    kinds = [NEMOTRON_H_KINDS[c] for c in pattern]
    f.refuse_unless("use_bias", False, "biases on the Mamba in_proj and out_proj")
    f.refuse_unless(
        "mamba_conv_bias" if "mamba_conv_bias" in f.raw else "use_conv_bias", True, "a conv1d without its bias"
    )
    mamba = attention = mlp = moe = None
    if "M" in pattern:
        nheads, headdim = f.whole("mamba_num_heads", default=128), f.whole("mamba_head_dim", default=64)
        ngroups = f.whole("mamba_n_groups", "n_groups", default=8)
        _divides(f, "n_groups", ngroups, "mamba_num_heads", nheads)
        mamba = Mamba2Spec(
            hidden,
            d_state=f.whole("ssm_state_size", default=128),
            expand=f.whole("mamba_expand", "expand", default=2),
            headdim=headdim,
            ngroups=ngroups,
            d_conv=f.whole("mamba_d_conv", "conv_kernel", default=4),
            chunk_size=f.whole("mamba_chunk_size", "chunk_size", default=128),
            d_inner_width=nheads * headdim,
        )
    if "*" in pattern:
        heads, kv_heads = f.whole("num_attention_heads", default=32), f.whole("num_key_value_heads", default=8)
        _divides(f, "num_key_value_heads", kv_heads, "num_attention_heads", heads)
        attention = AttentionSpec(hidden, heads, kv_heads, f.whole("head_dim", default=128), hidden)
    relu2 = f.get("mlp_hidden_act", "relu2") == "relu2"  # NemotronHConfig's default activation
    if "-" in pattern:
        mlp = MlpSpec(
            hidden,
            f.whole("intermediate_size", default=21504),
            gated=False,
            bias=f.flag("mlp_bias", False),
            relu2=relu2,
        )
    if "E" in pattern:
        f.refuse_unless("mlp_bias", False, "biases on the shared experts")
        if f.raw.get("moe_latent_size") is not None:
            raise f.error(
                f"moe_latent_size {f.raw['moe_latent_size']} (experts behind a latent projection) is not modelled; "
                "meshplan reads Nemotron-H mixtures of experts without one"
            )
        experts = f.whole("n_routed_experts", "num_local_experts", default=8)
        _expert_groups(f, experts)
        moe = MoeSpec(
            hidden,
            experts,
            _top_k(f, experts, 2),
            f.whole("moe_intermediate_size", default=7688),
            gated=False,
            shared_ffn=f.whole("moe_shared_expert_intermediate_size", default=7688),
            # NemotronHTopkRouter: sigmoid scores, grouped top-k, the weights renormalised and scaled
            score="sigmoid",
            expert_groups=f.whole("n_group", default=1),
            topk_groups=f.whole("topk_group", default=1),
            norm_topk=f.flag("norm_topk_prob", True),
            routed_scaling=float(f.get("routed_scaling_factor", 1.0) or 1.0),
        )
    spec = _mixed(f, name, hidden, kinds, attention=attention, mamba2=mamba, mlp=mlp, moe=moe)
    # NemotronHAttention applies no rotary positions
    return replace(spec, norm_eps=_eps(f, "layer_norm_epsilon"), rope=RopeSpec(kind="none"))


def _jamba(f: _Fields, name: str) -> ModelSpec:
    """Jamba (transformers' JambaConfig / modeling_jamba.py): Mamba-1 mixers (mamba_d_state, mamba_d_conv,
    mamba_expand, mamba_dt_rank, with RMSNorms on dt, B and C), attention on the layers i with
    i % attn_layer_period == attn_layer_offset; a mixture of num_experts experts of intermediate_size on
    the layers i % expert_layer_period == expert_layer_offset (when num_experts > 1), a dense MLP of
    that width elsewhere."""
    hidden, layers = f.whole("hidden_size"), f.whole("num_hidden_layers")
    periods = {}
    for kind, period, offset in (("attn", 8, 4), ("expert", 2, 1)):  # JambaConfig's defaults
        p = f.whole(f"{kind}_layer_period", default=period)
        o = f.whole(f"{kind}_layer_offset", default=offset, minimum=0)
        if o >= p:
            raise f.error(f"{kind}_layer_offset ({o}) must be smaller than {kind}_layer_period ({p})")
        periods[kind] = (p, o)
    f.refuse_unless("mamba_conv_bias", True, "a conv1d without its bias")
    f.refuse_unless("mamba_proj_bias", False, "biases on in_proj and out_proj")
    rank = f.get("mamba_dt_rank", "auto")
    mamba = Mamba1Spec(
        hidden,
        d_state=f.whole("mamba_d_state", default=16),
        expand=f.whole("mamba_expand", default=2),
        dt_rank=math.ceil(hidden / 16) if rank == "auto" else f.as_whole("mamba_dt_rank", rank),
        d_conv=f.whole("mamba_d_conv", default=4),
        dt_bc_norms=True,
    )
    experts = f.whole("num_experts", default=16)
    ffn_width = f.whole("intermediate_size", default=14336)
    moe = MoeSpec(hidden, experts, _top_k(f, experts, 2), ffn_width) if experts > 1 else None
    kinds = []
    for i in range(layers):
        (ap, ao), (ep, eo) = periods["attn"], periods["expert"]
        mixer = ("attention",) if i % ap == ao else ("mamba1",)
        kinds.append(mixer + (("router", "experts") if moe is not None and i % ep == eo else ("mlp",)))
    used = sum(kinds, ())
    attention = _layer_attention(f, hidden, False, kv_heads=8) if "attention" in used else None  # JambaConfig's 8
    mlp = MlpSpec(hidden, ffn_width) if "mlp" in used else None
    spec = _mixed(f, name, hidden, kinds, attention=attention, mamba1=mamba, mlp=mlp, moe=moe)
    return replace(spec, norm_eps=_eps(f, "rms_norm_eps"))


_READERS = {
    "llama": _llama,
    "mistral": _llama,
    "phi3": _llama,
    "granite": _llama,  # Granite's multipliers scale activations; its shapes are Llama's
    "qwen2": _qwen,
    "qwen3": _qwen,
    "mixtral": _moe,
    "qwen2_moe": _moe,
    "qwen3_moe": _moe,
    "granitemoe": _moe,
    "granitemoeshared": _moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss,
    "granitemoehybrid": _granitemoehybrid,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "gemma2": _gemma,
    "gemma3": _gemma,
    "gemma3_text": _gemma,
    "olmo2": _olmo2,
    "mamba": _mamba1,
    "falcon_mamba": _mamba1,
    "mamba2": _mamba2,
    "zamba2": _zamba2,
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt2,
    "gpt_neox": _gpt_neox,
    "opt": _opt,
}


# The mixture-of-experts families read (the refusal of the others names them).
_MOE_READ = (
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "granitemoe",
    "granitemoeshared",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "granitemoehybrid",
    "nemotron_h",
    "jamba",
)


def model_from_hf_config(path: Path) -> ModelSpec:
    where = str(path)
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise MeshplanError(f"{where}: expected a JSON object at the top level")
    model_type = raw.get("model_type")
    if model_type in _MOE:
        experts = raw.get(_MOE[model_type])
        what = f"{_MOE[model_type]} {experts}" if isinstance(experts, int) else "routed experts"
        raise MeshplanError(
            f"{where}: model_type {model_type!r} is a mixture of experts ({what}) meshplan does not read yet; "
            f"of the MoE families it reads {', '.join(_MOE_READ)}"
        )
    if model_type not in _READERS:
        raise MeshplanError(
            f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(sorted(_READERS))}"
        )
    # A checkpoint's config.json is named by its folder (Meta-Llama-3-70B/config.json); any other file by
    # its own name (llama70b.json), not by whatever folder it sits in.
    file = Path(path)
    name = raw.get("_name_or_path") or (file.parent.name if file.name == "config.json" else file.stem) or model_type
    try:
        return _READERS[model_type](_Fields(raw, where), str(name))
    except MeshplanError as err:
        if str(err).startswith(f"{where}: "):
            raise
        # A shape the readers' checks let through and a spec refuses: name the file it came from.
        raise MeshplanError(f"{where}: {err}") from None


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name, or a path to a HuggingFace config.json."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.exists():
        raise MeshplanError(
            f"--model: {name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor an existing config.json path"
        )
    if path.is_dir():  # a checkpoint folder: its config.json
        if not (path / "config.json").exists():
            raise MeshplanError(f"--model: folder {name_or_path!r} holds no config.json; give the config file")
        path = path / "config.json"
    return model_from_hf_config(path)

"""Read a local HuggingFace `config.json` into a ModelSpec, without network access.

Field names follow transformers' configuration classes (LlamaConfig, MistralConfig, MambaConfig,
Mamba2Config, FalconMambaConfig, Zamba2Config). Unknown fields are ignored; a missing required one
is a MeshplanError naming it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError, read_json
from meshplan.models import AttentionSpec, Mamba1Spec, Mamba2Spec, MlpSpec, ModelSpec, dense


class _Fields:
    def __init__(self, raw: dict[str, Any], where: str):
        self.raw, self.where = raw, where

    def need(self, *names: str) -> Any:
        """The first of `names` present (aliases across config versions); error if none is."""
        for name in names:
            if name in self.raw and self.raw[name] is not None:
                return self.raw[name]
        raise MeshplanError(f"{self.where}: missing required field {names[0]!r} for model_type {self.raw.get('model_type')!r}")

    def get(self, name: str, default: Any) -> Any:
        value = self.raw.get(name)
        return default if value is None else value


def _llama(f: _Fields, name: str) -> ModelSpec:
    hidden = int(f.need("hidden_size"))
    heads = int(f.need("num_attention_heads"))
    return dense(
        name, hidden, int(f.need("num_hidden_layers")), heads, int(f.get("num_key_value_heads", heads)),
        int(f.need("intermediate_size")), int(f.need("vocab_size")), gated=True,
        tied=bool(f.get("tie_word_embeddings", False)), source=f.where,
    )


def _mamba1(f: _Fields, name: str) -> ModelSpec:
    hidden = int(f.need("hidden_size"))
    expand = int(f.get("expand", 2))
    rank = f.get("time_step_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if rank == "auto" else int(rank)
    spec = Mamba1Spec(hidden, d_state=int(f.get("state_size", 16)), expand=expand, dt_rank=dt_rank,
                      d_conv=int(f.get("conv_kernel", 4)))
    return ModelSpec(name=name, family="mamba1", d_model=hidden, layers=int(f.need("num_hidden_layers")),
                     vocab=int(f.need("vocab_size")), tied_embeddings=bool(f.get("tie_word_embeddings", True)),
                     mamba1=spec, source=f.where)


def _mamba2(f: _Fields, name: str) -> ModelSpec:
    hidden = int(f.need("hidden_size"))
    spec = Mamba2Spec(hidden, d_state=int(f.get("state_size", 128)), expand=int(f.get("expand", 2)),
                      headdim=int(f.get("head_dim", 64)), ngroups=int(f.get("n_groups", 1)),
                      d_conv=int(f.get("conv_kernel", 4)), chunk_size=int(f.get("chunk_size", 256)))
    return ModelSpec(name=name, family="mamba2", d_model=hidden, layers=int(f.need("num_hidden_layers")),
                     vocab=int(f.need("vocab_size")), tied_embeddings=bool(f.get("tie_word_embeddings", True)),
                     mamba2=spec, source=f.where)


def _zamba2(f: _Fields, name: str) -> ModelSpec:
    hidden = int(f.need("hidden_size"))
    layers = int(f.need("num_hidden_layers"))
    expand = int(f.get("mamba_expand", 2))
    n_mamba_heads = int(f.need("n_mamba_heads"))
    block_types = f.need("layers_block_type")
    if len(block_types) != layers:
        raise MeshplanError(f"{f.where}: layers_block_type has {len(block_types)} entries but num_hidden_layers is {layers}")
    heads = int(f.need("num_attention_heads"))
    attn_hidden = 2 * hidden  # Zamba2Config: attention_hidden_size = 2 · hidden_size
    mamba = Mamba2Spec(hidden, d_state=int(f.get("mamba_d_state", 64)), expand=expand,
                       headdim=expand * hidden // n_mamba_heads, ngroups=int(f.get("mamba_ngroups", 1)),
                       d_conv=int(f.get("mamba_d_conv", 4)), chunk_size=int(f.get("chunk_size", 256)))
    return ModelSpec(
        name=name, family="hybrid", d_model=hidden, layers=layers, vocab=int(f.need("vocab_size")),
        tied_embeddings=bool(f.get("tie_word_embeddings", True)), mamba2=mamba,
        attention=AttentionSpec(attn_hidden, heads, int(f.get("num_key_value_heads", heads)),
                                attn_hidden // heads, attn_hidden),
        mlp=MlpSpec(attn_hidden, int(f.get("intermediate_size", 4 * hidden)), gated=True),
        hybrid_layers=sum(1 for t in block_types if t == "hybrid"),
        shared_blocks=int(f.get("num_mem_blocks", 1)), source=f.where,
    )


_READERS = {
    "llama": _llama,
    "mistral": _llama,
    "mamba": _mamba1,
    "falcon_mamba": _mamba1,
    "mamba2": _mamba2,
    "zamba2": _zamba2,
}


def model_from_hf_config(path: Path) -> ModelSpec:
    where = str(path)
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise MeshplanError(f"{where}: expected a JSON object at the top level")
    model_type = raw.get("model_type")
    if model_type not in _READERS:
        raise MeshplanError(
            f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(sorted(_READERS))}")
    name = raw.get("_name_or_path") or Path(path).parent.name or model_type
    return _READERS[model_type](_Fields(raw, where), str(name))
